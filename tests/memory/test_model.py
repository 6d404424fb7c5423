"""The memory model: ZeRO's formulas at any rank count, and predictions checked against measurements."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import ConfigError, MemoryEstimate, TrainConfig, Workload, load_workload, measure, predict_memory
from autotune.memory.fake_run import profile_run
from autotune.memory.predict import profile_memory
from autotune.memory.profile import MemoryProfile
from tests.paths import PLAIN_MLP, ROOT, USER_WORKLOAD

TINY = f"{USER_WORKLOAD}:build"
PSI, TENSORS = 3234, 8  # the tiny workload: 3 x Linear(32, 32) + Linear(32, 2)

#: The issue's target, and what benchmarks/memory_model.py measures on the built-in workloads.
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def tiny() -> Workload:
    return load_workload(TINY)


@pytest.fixture(scope="module")
def profile(tiny: Workload) -> MemoryProfile:
    return profile_memory(tiny, modes=("fp32", "bf16", "bf16-weights"))


@pytest.mark.parametrize("ranks", [2, 64])
def test_model_states_follow_zero_at_any_rank_count(tiny: Workload, profile: MemoryProfile, ranks: int) -> None:
    q = math.ceil(PSI / ranks)  # one rank's ZeRO-3 partition
    padded = math.ceil(PSI / (2 * ranks)) * 2 * ranks  # ZeRO 1-2 pad their flat group (DeepSpeed)
    q12 = padded // ranks
    adam = 8  # bytes of Adam moments per parameter; plus a 4-byte step counter per tensor
    bucket = 32 * 32  # the largest parameter: DeepSpeed's buckets are sized to it

    def predict(stage: int, precision: str) -> MemoryEstimate:
        config = TrainConfig(micro_batch_size=4, zero_stage=stage, precision=precision)  # type: ignore[arg-type]
        return predict_memory(tiny, config, ranks=ranks, profile=profile)

    # Mixed precision, Rajbhandari et al. SC'20: 2 + 2 + 12 bytes/parameter; stage 1 partitions
    # the 12 bytes of optimizer state, stage 2 the gradients too, stage 3 the parameters too.
    assert predict(0, "bf16").optimizer_state == (4 + adam) * PSI + 4 * TENSORS
    assert [predict(s, "bf16").optimizer_state for s in (1, 2, 3)] == [(4 + adam) * q12] * 2 + [(4 + adam) * q]
    assert [predict(s, "bf16").parameters for s in (0, 1, 2)] == [2 * PSI, 2 * padded, 2 * padded]
    assert predict(3, "bf16").parameters in (2 * q, 2 * q + 2 * bucket)  # + the gathered module, in backward
    # fp32: 4-byte parameters; DeepSpeed keeps an fp32 master partition at stages 1-3 even so.
    assert predict(0, "fp32").optimizer_state == adam * PSI + 4 * TENSORS
    assert predict(1, "fp32").optimizer_state == (4 + adam) * q12
    assert predict(1, "fp32").parameters == 4 * padded
    assert {predict(s, "fp32").ranks for s in range(4)} == {ranks}


def test_a_profile_without_the_needed_mode_is_refused(tiny: Workload) -> None:
    fp32_only = profile_memory(tiny, modes=("fp32",))
    msg = "predict_memory: the profile lacks mode 'bf16-weights'; profile with modes=('bf16-weights',)."
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        predict_memory(tiny, TrainConfig(precision="bf16", zero_stage=1), profile=fp32_only)
    plain = profile_memory(tiny, modes=("fp32",), checkpointed=False)
    msg = "predict_memory: the profile has no checkpointed runs; profile with checkpointed=True."
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        predict_memory(tiny, TrainConfig(checkpoint=True), profile=plain)


def test_estimate_fields_are_validated() -> None:
    msg = "MemoryEstimate.gradients must be an int >= 0, but got -1."
    values = dict.fromkeys(("parameters", "optimizer_state", "activations", "temporaries", "buffers", "other"), 0)
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        MemoryEstimate(**values, gradients=-1, phase="optimizer step", ranks=1)
    with pytest.raises(ConfigError, match=f"^{re.escape('MemoryEstimate.ranks must be an int >= 1, but got 0.')}$"):
        MemoryEstimate(**values, gradients=0, phase="optimizer step", ranks=0)


# Configurations the model was not developed on (its DeepSpeed rules were read from gpt-tiny at
# micro-batch 1 and 4), on three built-in workloads; the local runner measures them in seconds.
HELD_OUT = [
    ("mlp-digits", TrainConfig(micro_batch_size=16, grad_accum_steps=2, precision="bf16")),
    ("resnet-tiny", TrainConfig(micro_batch_size=4, checkpoint=(True, False) * 3)),
    ("gpt-tiny", TrainConfig(micro_batch_size=6, checkpoint=(False, True) * 3)),
]


@pytest.mark.parametrize(("name", "config"), HELD_OUT, ids=[name for name, _ in HELD_OUT])
def test_predicted_peak_is_within_tolerance_of_the_measured_peak(name: str, config: TrainConfig) -> None:
    wl = load_workload(name)
    measured = measure(wl, config, steps=1, warmup=1).peak_bytes
    predicted = predict_memory(wl, config).total
    assert measured is not None
    assert abs(predicted - measured) <= TOLERANCE * measured, (predicted, measured)


# ---- mixed precision: fp32 blocks and bf16 islands, composed from uniform profile runs ----------

F, B = "fp32", "bf16"


@pytest.fixture(scope="module")
def resnet() -> Workload:
    return load_workload("resnet-tiny")


@pytest.fixture(scope="module")
def resnet_profile(resnet: Workload) -> MemoryProfile:
    return profile_memory(resnet, modes=(F, B))


# ResNet's blocks share their boundaries: a block's final ReLU saves its output, which the next
# block's first convolution saves again if fp32 (one storage) or casts and saves the cast if bf16;
# the downsampling blocks (2 and 4) in bf16 end in a bf16 ReLU and return a new fp32 cast that only
# an fp32 next block keeps. The patterns cover each neighbourhood, plain and checkpointed, at
# micro-batches whose peak is in backward; the first two were 23% high and 20% low before.
COMPOSED = [
    TrainConfig(micro_batch_size=16, precision=(F, F, F, F, F, B)),
    TrainConfig(micro_batch_size=16, precision=(B, B, B, F, F, F)),
    TrainConfig(micro_batch_size=16, precision=(B, F) * 3, checkpoint=(True, False) * 3),
    TrainConfig(micro_batch_size=5, precision=(F, B, B, F, F, B), checkpoint=(False,) * 3 + (True,) * 3),
]


def _ids(configs: list[TrainConfig]) -> list[str]:
    def short(values: tuple[object, ...]) -> str:
        return "".join({F: "f", B: "b", True: "c", False: "."}[v] for v in values)

    # resnet-tiny's 6 blocks, e.g. "m16-bfbfbf-c.c.c.": micro-batch, precisions, checkpoints.
    return [f"m{c.micro_batch_size}-{short(c.block_precisions(6))}-{short(c.block_checkpoints(6))}" for c in configs]


@pytest.mark.parametrize("config", COMPOSED, ids=_ids(COMPOSED))
def test_mixed_blocks_compose_into_exactly_the_fake_run_of_the_config(
    resnet: Workload, resnet_profile: MemoryProfile, config: TrainConfig
) -> None:
    # The reference: the same fake-tensor forward/backward as the profile's, of this very config
    # (a second of compute per config, which is why the profile runs uniform configs only).
    from torch._subclasses.fake_tensor import FakeTensorMode

    n = len(resnet.block_names())
    run = profile_run(
        resnet,
        FakeTensorMode(allow_non_fake_inputs=False),
        config.micro_batch_size,
        weights=None,
        precisions=config.block_precisions(n),
        checkpoints=config.checkpoint_levels(n),
    )
    exact = max(x.activations + x.temporaries + x.gradients for x in run.series) + run.batch
    predicted = predict_memory(resnet, config, profile=resnet_profile)
    assert predicted.phase == "forward/backward"
    assert predicted.activations + predicted.temporaries + predicted.gradients == exact


@pytest.fixture(scope="module")
def digits() -> Workload:
    return load_workload("mlp-digits")


@pytest.fixture(scope="module")
def digits_profile(digits: Workload) -> MemoryProfile:
    return profile_memory(digits, modes=(F, B))


# Against real steps (measured bytes repeat exactly from run to run), with accumulation too. Fake
# runs and real ones differ by a few hundred bytes with bf16 blocks (measured here: within 0.01%,
# 23% off before), hence a tolerance rather than equality: the 5%.
MEASURED_MIXED = [
    ("resnet-tiny", TrainConfig(micro_batch_size=16, precision=(F, F, F, F, F, B))),
    ("resnet-tiny", TrainConfig(micro_batch_size=16, precision=(B, B, B, F, F, F))),
    ("resnet-tiny", TrainConfig(micro_batch_size=8, grad_accum_steps=2, precision=(B, B, F, F, B, F))),
    ("resnet-tiny", TrainConfig(micro_batch_size=6, precision=(F, B) * 3, checkpoint=(False, True) * 3)),
    ("mlp-digits", TrainConfig(micro_batch_size=256, precision=(B, F, F, B), checkpoint=(True, False, False, True))),
    ("mlp-digits", TrainConfig(micro_batch_size=128, grad_accum_steps=2, precision=(F, F, B, B))),
]
_MEASURED_IDS = [f"{name}-{i}" for i, (name, _) in enumerate(MEASURED_MIXED)]


@pytest.mark.parametrize(("name", "config"), MEASURED_MIXED, ids=_MEASURED_IDS)
def test_mixed_precision_prediction_is_within_tolerance_of_the_measured_peak(
    request: pytest.FixtureRequest, name: str, config: TrainConfig
) -> None:
    fixture = {"resnet-tiny": "resnet", "mlp-digits": "digits"}[name]  # profiled once per module
    wl: Workload = request.getfixturevalue(fixture)
    profile: MemoryProfile = request.getfixturevalue(f"{fixture}_profile")
    measured = measure(wl, config, steps=1, warmup=1).peak_bytes
    assert measured is not None
    predicted = predict_memory(wl, config, profile=profile).total
    assert abs(predicted / measured - 1) <= TOLERANCE, (predicted, measured)


def test_predict_command_answers_for_a_cluster_and_exports_the_deepspeed_config(tmp_path: Path) -> None:
    export = tmp_path / "ds_config.json"
    cmd = [sys.executable, "-m", "autotune.cli", "predict", "--workload", TINY, "--micro-batch", "4"]
    cmd += ["--precision", "bf16", "--zero-stage", "3", "--ranks", "64", "--json", "--export-deepspeed", str(export)]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert proc.returncode == 0, proc.stderr
    estimate = json.loads(proc.stdout)
    assert estimate["ranks"] == 64
    assert estimate["optimizer_state"] == 12 * math.ceil(PSI / 64)
    categories = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "buffers", "other")
    assert estimate["total"] == sum(estimate[k] for k in categories)
    ds = json.loads(export.read_text())
    assert (ds["train_batch_size"], ds["zero_optimization"]["stage"], ds["bf16"]) == (256, 3, {"enabled": True})


def test_a_model_already_on_an_accelerator_is_profiled_as_on_the_host(tiny: Workload) -> None:
    """A Trainer moves the model to the GPU before the callback profiles it: the profile copies it
    back to the host as fakes (a CUDA run failed here with 'found two different devices cuda:0, cpu').
    The meta device stands in for the accelerator on a CPU-only machine."""
    import copy
    import dataclasses

    elsewhere = dataclasses.replace(tiny, model=copy.deepcopy(tiny.model).to("meta"))
    assert next(elsewhere.model.parameters()).device.type == "meta"
    on_host = profile_memory(tiny, modes=("fp32", "bf16"), verify=False)
    assert profile_memory(elsewhere, modes=("fp32", "bf16"), verify=False) == on_host


# ---- a plain nn.Sequential of repeated units: block 0 takes the batch itself -------------------

#: micro-batch 512 (the user's batch) plain, and mixes the profile never runs: block 0 only
#: recomputed (32% under the measured peak before: the profile's windows were never cut, since no
#: gradient reaches block 0's input, and every stretch was read from block 0's run), alternate
#: blocks recomputed and in bf16, with accumulation.
PLAIN_CONFIGS = [
    TrainConfig(micro_batch_size=512),
    TrainConfig(micro_batch_size=512, checkpoint=(True, False, False, False)),
    TrainConfig(micro_batch_size=256, grad_accum_steps=2, precision=(F, B) * 2, checkpoint=(True, False) * 2),
]


@pytest.fixture(scope="module")
def plain() -> Workload:
    return load_workload(f"{PLAIN_MLP}:build")


@pytest.fixture(scope="module")
def plain_profile(plain: Workload) -> MemoryProfile:
    return profile_memory(plain, modes=(F, B))


def test_a_plain_mlp_s_blocks_are_its_repeated_units(plain: Workload) -> None:
    assert plain.block_names() == ("0", "1", "2", "3")  # not the nine Linear layers, head included


@pytest.mark.parametrize("config", PLAIN_CONFIGS, ids=["m512", "m512-c...", "m256x2-fbfb-c.c."])
def test_a_plain_mlp_is_composed_exactly_and_within_tolerance_of_a_real_step(
    plain: Workload, plain_profile: MemoryProfile, config: TrainConfig
) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    run = profile_run(
        plain,
        FakeTensorMode(allow_non_fake_inputs=False),
        config.micro_batch_size,
        weights=None,
        precisions=config.block_precisions(4),
        checkpoints=config.checkpoint_levels(4),
    )
    estimate = predict_memory(plain, config, profile=plain_profile)
    assert estimate.verified
    if config.grad_accum_steps == 1:  # the fake run is one micro-batch: gradients not yet all there
        exact = max(x.activations + x.temporaries + x.gradients for x in run.series) + run.batch
        assert estimate.activations + estimate.temporaries + estimate.gradients == exact
    measured = measure(plain, config, steps=1, warmup=1).peak_bytes
    assert measured is not None
    assert abs(estimate.total / measured - 1) <= 0.001, (estimate.total, measured)


@pytest.mark.parametrize("checkpoint", [False, "selective"])
def test_a_model_loaded_in_bf16_is_predicted_exactly(checkpoint: bool | str) -> None:
    # from_pretrained(..., torch_dtype=torch.bfloat16) trains its parameters, gradients and Adam's
    # state in bf16: 2 bytes each, where the model took 4 (+8.1% here before).
    import torch

    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    tokens = torch.randint(0, 128, (16, 32), generator=torch.Generator().manual_seed(0))
    workload = Workload(
        name="llama-bf16-weights",
        model=model,
        dataset=torch.utils.data.TensorDataset(tokens),
        loss_fn=lambda m, batch: m(input_ids=batch[0], labels=batch[0]).loss,
        batch_size=8,
    )
    train = TrainConfig(micro_batch_size=4, grad_accum_steps=2, checkpoint=checkpoint)
    estimate = predict_memory(workload, train)
    measured = measure(workload, train, steps=1, warmup=1)
    assert estimate.parameters == 2 * workload.num_parameters
    assert estimate.verified
    assert abs(estimate.total - measured.peak_bytes) <= 64, (estimate.total, measured.peak_bytes)


def test_a_window_empty_at_one_profiled_size_takes_the_other_size_s_moment() -> None:
    # Unpaired windows (the two sizes cut the run in other places) keep one moment each, or none
    # where a size had no moment in the window: PEFT's DoRA under selective recompute did, and
    # every prediction of such a configuration raised ("zip() argument 2 is shorter").
    from autotune.memory.model import _at
    from autotune.memory.profile_record import Moment, Window

    seen = Window(peak=(Moment(100, 20, 0),), kept=(Moment(100, 20, 8),), reducing=())
    empty = Window(peak=(), kept=(), reducing=())
    assert _at(((seen,), (empty,)), 0, 0, (2, 4), 3) == Moment(100, 20, 0)
    assert _at(((empty,), (seen,)), 0, 1, (2, 4), 8) == Moment(100, 20, 8)
    assert _at(((seen,), (empty,)), 0, 2, (2, 4), 3) == Moment(0, 0, 0)  # none at either size


def test_what_blocks_keep_is_summed_once_and_read_by_prefix(tiny: Workload, profile: MemoryProfile) -> None:
    # A window asks what the blocks before it keep: running sums over the blocks, each window
    # reading a prefix, instead of a sum per window (quadratic in the blocks).
    import itertools

    from autotune.memory.model import _Kept, _kept_terms, _saves_at

    sizes = profile.micro_batch_sizes
    saves = {mode: _saves_at(profile.modes[mode].blocks, sizes, 6) for mode in ("fp32", "bf16")}
    n = len(tiny.block_names())
    blocks = tuple((("fp32", "bf16")[j % 2], ("none", "full")[j // 2 % 2]) for j in range(n))
    own, held, let_go = _kept_terms(saves, blocks, "bf16")
    kept = _Kept.of(saves, blocks, "bf16")
    for owners, inputs, freed in itertools.product(range(n + 1), range(n + 1), (False, True)):
        last = inputs - 1 if freed and inputs else None  # its input no longer held by itself
        expected = sum(own[:owners]) + sum(let_go[j] if j == last else held[j] for j in range(inputs))
        assert kept.bytes(owners, inputs, freed) == expected, (owners, inputs, freed)
    assert any(a != b for a, b in zip(held, let_go, strict=True))  # the freed case is exercised
