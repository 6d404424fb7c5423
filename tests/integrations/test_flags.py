"""The user's own flags (checkpointing, mixed precision) as the framework callbacks' start: what they
report is what the model runs (autotune/integrations/_flags.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from autotune import TrainConfig
from autotune.integrations._flags import LoopPrecision, ModelCheckpointing
from autotune.integrations._framework import FrameworkLoop
from autotune.zoo import CORPUS

pytest.importorskip("transformers")


def _gpt2() -> Any:
    entry = CORPUS["hf-gpt2"]
    return entry.build(**entry.tiny)


# ---- reading the model's own checkpointing -------------------------------------------------------------


def test_the_models_flags_are_read_per_block_taken_over_and_given_back() -> None:
    wl = _gpt2()
    names = list(wl.block_names())
    wl.model.activation_checkpointing_enable(every_n_layers=2)  # block 0 of 2 only
    before = {n: m.gradient_checkpointing for n, m in wl.model.named_modules() if hasattr(m, "gradient_checkpointing")}
    assert before == {"transformer": True, "transformer.h.0": True, "transformer.h.1": False}
    ckpt = ModelCheckpointing.read(wl.model, names)
    assert (ckpt.blocks, ckpt.outside, ckpt.on) == ((True, False), (), True)
    assert ckpt.describe("activation_checkpointing=True") == (
        "activation_checkpointing=True -> blocks 0 of 2 recomputed (by autotune's wrappers; the model's own flags "
        "off until training ends)"
    )
    assert ckpt.take_over() and ckpt.taken_over
    assert not wl.model.is_activation_checkpointing
    ckpt.give_back()
    after = {n: m.gradient_checkpointing for n, m in wl.model.named_modules() if hasattr(m, "gradient_checkpointing")}
    assert after == before and not ckpt.taken_over


def test_a_model_without_checkpointing_has_nothing_to_take_over() -> None:
    wl = _gpt2()
    ckpt = ModelCheckpointing.read(wl.model, list(wl.block_names()))
    assert (ckpt.blocks, ckpt.outside, ckpt.on, ckpt.describe("x")) == ((False, False), (), False, "")
    assert not ckpt.take_over()


def test_checkpointing_outside_the_blocks_is_left_to_the_model() -> None:
    wl = _gpt2()
    model = torch.nn.ModuleDict({"lm": wl.model, "tower": torch.nn.Linear(2, 2)})
    model["lm"].activation_checkpointing_enable()
    model["tower"].gradient_checkpointing = True  # a module transformers would recompute, not a block
    ckpt = ModelCheckpointing.read(model, [f"lm.{n}" for n in wl.block_names()])
    assert (ckpt.blocks, ckpt.outside) == ((True, True), ("tower",))
    assert not ckpt.take_over()  # refuses to fight: every flag stays
    assert model["lm"].is_activation_checkpointing and model["tower"].gradient_checkpointing
    assert ckpt.describe("activation_checkpointing=True") == (
        "activation_checkpointing=True -> recompute left to the model: it checkpoints tower, which are not "
        "autotune's blocks, so the checkpoint knob does not move"
    )


# ---- the loops' precision flags ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bf16", "fp16", "expected"),
    [
        (True, False, LoopPrecision(outer="bf16", flag="bf16=True")),
        (False, True, LoopPrecision(outer="fp16", flag="fp16=True")),
        (False, False, LoopPrecision()),
    ],
)
def test_the_trainers_precision_flags(bf16: bool, fp16: bool, expected: LoopPrecision) -> None:
    from autotune.integrations.hf import loop_precision

    # fp16=True cannot build TrainingArguments on a CPU-only machine: the two fields it reads.
    assert loop_precision(SimpleNamespace(bf16=bf16, fp16=fp16)) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        ("bf16-mixed", LoopPrecision(outer="bf16", flag="precision='bf16-mixed'")),
        ("16-mixed", LoopPrecision(outer="fp16", flag="precision='16-mixed'")),
        ("32-true", LoopPrecision()),
        (
            "bf16-true",
            LoopPrecision(
                flag="precision='bf16-true'",
                fixed="not a TrainConfig precision: the weights' own dtype is not a knob",
            ),
        ),
    ],
)
def test_lightnings_precision_strings(precision: str, expected: LoopPrecision) -> None:
    pytest.importorskip("lightning")
    from autotune.integrations.lightning import loop_precision

    assert loop_precision(precision) == expected
    line = {
        "bf16-mixed": "precision='bf16-mixed' -> outer precision bf16 (the loop's own autocast)",
        "16-mixed": "precision='16-mixed' -> outer precision fp16 (the loop's own autocast)",
        "32-true": "",
        "bf16-true": "precision='bf16-true' -> no precision knob moves (not a TrainConfig precision: the weights' "
        "own dtype is not a knob)",
    }[precision]
    assert expected.describe() == line


# ---- what a loop with flags takes of a proposal ------------------------------------------------------------


def _loop(precision: LoopPrecision) -> FrameworkLoop:
    loop = FrameworkLoop(policy=None, memory_budget=None, decide_every=2, blocks=None)
    loop.precision = precision
    return loop


def test_the_loops_own_outer_precision_never_moves() -> None:
    loop = _loop(LoopPrecision(outer="bf16", flag="bf16=True"))
    current = TrainConfig(micro_batch_size=4, precision="bf16", outer_precision="bf16", checkpoint=True)
    # fp32 outer proposed, one fp32 block and recompute off: the blocks and recompute are taken, the outer is not
    proposed = TrainConfig(micro_batch_size=4, precision=("fp32", "bf16"), checkpoint=False)
    assert loop.takes(current, proposed) == TrainConfig(
        micro_batch_size=4, precision=("fp32", "bf16"), outer_precision="bf16", checkpoint=False
    )
    # fp16 blocks under the loop's bf16: not one autocast dtype, the precision stays
    fp16 = TrainConfig(micro_batch_size=4, precision="fp16", checkpoint=False)
    assert loop.takes(current, fp16) == TrainConfig(
        micro_batch_size=4, precision="bf16", outer_precision="bf16", checkpoint=False
    )


def test_fp16_blocks_only_where_the_loop_scales_the_loss() -> None:
    proposed = TrainConfig(micro_batch_size=4, precision=("fp16", "fp32"), checkpoint=True)
    fp16_loop = _loop(LoopPrecision(outer="fp16", flag="fp16=True"))
    current = TrainConfig(micro_batch_size=4, precision="fp16", outer_precision="fp16")
    assert fp16_loop.takes(current, proposed) == TrainConfig(
        micro_batch_size=4, precision=("fp16", "fp32"), outer_precision="fp16", checkpoint=True
    )
    plain = TrainConfig(micro_batch_size=4)
    assert _loop(LoopPrecision()).takes(plain, proposed) == plain  # no scaler in the loop: nothing taken


def test_a_precision_the_knobs_cannot_express_moves_no_precision_knob() -> None:
    loop = _loop(LoopPrecision(flag="precision='bf16-true'", fixed="why"))
    current = TrainConfig(micro_batch_size=4)
    proposed = TrainConfig(micro_batch_size=4, precision="bf16", outer_precision="bf16", checkpoint=True)
    assert loop.takes(current, proposed) == TrainConfig(micro_batch_size=4, checkpoint=True)


def test_a_run_that_cannot_start_gives_the_model_its_checkpointing_back() -> None:
    from autotune.errors import AutotuneWarning, ConfigError

    wl = _gpt2()
    wl.model.activation_checkpointing_enable()
    loop = FrameworkLoop(policy=None, memory_budget="1KiB", decide_every=2, blocks=None)
    with (
        pytest.warns(AutotuneWarning, match="^autotune: starting from your flags"),
        pytest.raises(ConfigError, match="raise the budget"),
    ):
        loop.begin(wl.model, wl.dataset, wl.loss_fn, micro_batch_size=4, accum=1, name="gpt2")
    assert [m.gradient_checkpointing for m in wl.model.modules() if hasattr(m, "gradient_checkpointing")] == [True] * 3
    assert all("forward" not in m.__dict__ for m in wl.model.modules())
