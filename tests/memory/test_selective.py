"""Selective recompute in the memory model: the fake profile's selective runs (what torch's
selective-checkpoint cache keeps), their composition with the other levels and precisions, and
the ``selective`` check kind, against fake runs of the very configuration and real steps."""

from __future__ import annotations

import re

import pytest

from autotune import ConfigError, TrainConfig, Workload, load_workload, measure, predict_memory
from autotune.memory.check import check_configs, kinds_of
from autotune.memory.fake_run import profile_run
from autotune.memory.model import plan_of
from autotune.memory.predict import profile_memory
from autotune.memory.profile import MemoryProfile
from autotune.zoo import CORPUS

#: The memory model's target (autotune.memory.check.TOLERANCE).
TOLERANCE = 0.05
S = "selective"


@pytest.fixture(scope="module")
def gpt() -> Workload:
    return load_workload("gpt-tiny")


@pytest.fixture(scope="module")
def gpt_profile(gpt: Workload) -> MemoryProfile:
    return profile_memory(gpt, modes=("fp32", "bf16"), selective=True)


@pytest.fixture(scope="module")
def vit() -> Workload:
    entry = CORPUS["hf-vit"]
    return entry.build(**entry.tiny)


@pytest.fixture(scope="module")
def vit_profile(vit: Workload) -> MemoryProfile:
    return profile_memory(vit, modes=("fp32", "bf16"), selective=True, verify=False)


def test_a_selective_block_keeps_less_than_a_plain_one_and_more_than_a_checkpointed_one(
    gpt_profile: MemoryProfile,
) -> None:
    saves = gpt_profile.modes["fp32"].blocks[1]
    for j in range(6):
        # Checkpointed: its input. Selective: its input and its matmul/attention outputs. Plain: all it saves.
        assert saves.inputs[j] < saves.inputs[j] + saves.selective[j] < saves.saved[j]
    assert saves.selective_outputs == (0,) * 6  # a GPT block ends in a residual sum, not a bare matmul


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_activations_order_none_selective_full(gpt: Workload, gpt_profile: MemoryProfile, precision: str) -> None:
    def activations(checkpoint: object) -> int:
        config = TrainConfig(micro_batch_size=8, precision=precision, checkpoint=checkpoint)  # type: ignore[arg-type]
        return predict_memory(gpt, config, profile=gpt_profile).activations

    assert activations(False) > activations(S) > activations(True)


def _exact(workload: Workload, config: TrainConfig) -> int:
    """The fake-tensor run of ``config`` itself: what composing uniform runs must equal."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    n = len(workload.block_names())
    run = profile_run(
        workload,
        FakeTensorMode(allow_non_fake_inputs=False),
        config.micro_batch_size,
        weights=None,
        precisions=config.block_precisions(n),
        checkpoints=config.checkpoint_levels(n),
    )
    return max(x.activations + x.temporaries + x.gradients for x in run.series) + run.batch


F, B = "fp32", "bf16"
GPT_COMPOSED = [
    TrainConfig(micro_batch_size=8, checkpoint=S),
    TrainConfig(micro_batch_size=8, checkpoint=(S, False) * 3),
    TrainConfig(micro_batch_size=6, checkpoint=(True, S, False) * 2),
    TrainConfig(micro_batch_size=8, precision=(B, F) * 3, checkpoint=(S, S, False, True, S, False)),
]


@pytest.mark.parametrize("config", GPT_COMPOSED, ids=lambda c: c.describe().split(" | ", 1)[1])
def test_mixed_levels_compose_into_exactly_the_fake_run_of_the_config(
    gpt: Workload, gpt_profile: MemoryProfile, config: TrainConfig
) -> None:
    predicted = predict_memory(gpt, config, profile=gpt_profile)
    assert predicted.phase == "forward/backward"
    assert predicted.activations + predicted.temporaries + predicted.gradients == _exact(gpt, config)


MEASURED = [
    ("gpt", TrainConfig(micro_batch_size=8, checkpoint=S)),
    ("gpt", TrainConfig(micro_batch_size=8, precision="bf16", checkpoint=(S, True) * 3)),
    ("vit", TrainConfig(micro_batch_size=8, checkpoint=S)),
    ("vit", TrainConfig(micro_batch_size=8, precision="bf16", checkpoint=(S, False))),
]


@pytest.mark.parametrize(("name", "config"), MEASURED, ids=lambda x: x if isinstance(x, str) else x.describe())
def test_selective_prediction_is_within_tolerance_of_autotune_measure(
    request: pytest.FixtureRequest, name: str, config: TrainConfig
) -> None:
    wl: Workload = request.getfixturevalue(name)
    profile: MemoryProfile = request.getfixturevalue(f"{name}_profile")
    m = measure(wl, config, steps=1, warmup=1)
    assert m.status == "ok" and m.peak_bytes is not None
    predicted = predict_memory(wl, config, profile=profile).total
    assert abs(predicted / m.peak_bytes - 1) <= TOLERANCE, (predicted, m.peak_bytes)


def test_selective_is_a_kind_of_its_own_checked_on_a_real_step(gpt_profile: MemoryProfile) -> None:
    checks = {v.kind: v for v in gpt_profile.checks}
    assert check_configs(gpt_profile)[S] == TrainConfig(micro_batch_size=2, checkpoint=(S, False) * 3)
    assert checks[S].verified and checks[S].measured is not None
    assert abs(checks[S].relative_error or 0.0) <= TOLERANCE
    plan = plan_of(TrainConfig(checkpoint=(True, S, False) * 2), num_blocks=6)
    assert kinds_of(plan) == ["default", "recompute", S]


def test_predict_memory_profiles_the_selective_runs_and_verifies_them(vit: Workload) -> None:
    estimate = predict_memory(vit, TrainConfig(micro_batch_size=4, checkpoint=S))
    assert estimate.verified  # both of its kinds checked and within the tolerance
    check = estimate.verification  # the one of its kinds' checks furthest off
    assert check is not None and check.kind in ("default", S) and abs(check.relative_error or 0.0) <= TOLERANCE


def test_a_profile_without_selective_runs_is_refused(vit: Workload, vit_profile: MemoryProfile) -> None:
    plain = profile_memory(vit, modes=("fp32",), verify=False)
    msg = "predict_memory: the profile has no selective runs; profile with selective=True."
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        predict_memory(vit, TrainConfig(checkpoint=(S, False)), profile=plain)
    assert vit_profile.modes["fp32"].selective is not None and plain.modes["fp32"].selective is None


def test_one_module_that_is_two_blocks_is_profiled_and_predicted_selectively() -> None:
    # Weights shared between blocks 0 and 3: each call enters both blocks' dispatch modes, which
    # leave innermost first (the profile raised "'NoneType' object has no attribute '__exit__'").
    from tests.zoo import tiny_corpus

    workload = tiny_corpus.build("shared-encoder")
    profile = profile_memory(workload, modes=("fp32",), selective=True, verify=False)
    config = TrainConfig(micro_batch_size=8, checkpoint="selective")
    estimate = predict_memory(workload, config, profile=profile)
    measured = measure(workload, config, steps=1, warmup=1).peak_bytes
    assert abs(estimate.total - measured) <= 256, (estimate.total, measured)
