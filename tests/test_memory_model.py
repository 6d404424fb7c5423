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
from autotune.profile import MemoryProfile, profile_memory

ROOT = Path(__file__).parent.parent
TINY = f"{ROOT / 'tests' / 'data' / 'my_workload.py'}:build"
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
