"""The shipped policy's observation must not move: a refactor of how it is computed (the levels,
the model descriptor, the model-state ratio) is checked against the vector taken before it.

The machine probes (timings) are replaced by fixed speeds and the policy file is not loaded: what
is left is the model's own description (parameters, block profile) and the run's figures.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import autotune.adapt.policy_source as policy_module
from autotune.adapt.sources import Observation, RunContext
from autotune.config import TrainConfig
from autotune.measurement.probe import MachineSpeeds
from autotune.memory.blocks import profile_blocks
from autotune.resolve import load_workload
from tests.paths import ROOT

# Taken at f94cbc5 (before the configuration vocabulary moved into one module).
BEFORE = {
    "gpt-tiny": [
        0.4000000059604645,
        -0.4000000059604645,
        -0.28087499737739563,
        -0.1111111119389534,
        -0.08048202097415924,
        -0.625,
        -0.7142857313156128,
        0.1428571492433548,
        1.0,
        1.0,
        -1.0,
        0.22032302618026733,
        0.2998828589916229,
        -0.1383458375930786,
        -0.3333333432674408,
        0.1531069427728653,
        0.32657453417778015,
        0.0,
        -0.4000000059604645,
        -1.0,
    ],
    "mlp-digits": [
        0.4000000059604645,
        -0.4000000059604645,
        -0.28087499737739563,
        -0.1111111119389534,
        -0.08048202097415924,
        -0.625,
        -0.7142857313156128,
        0.1428571492433548,
        1.0,
        1.0,
        -1.0,
        0.1477729082107544,
        -0.15694652497768402,
        -0.3333333432674408,
        -0.5,
        0.1531069427728653,
        0.6278323531150818,
        0.0,
        -0.4000000059604645,
        -1.0,
    ],
}
SIMULATED_BEFORE = [
    -1.0,
    0.25,
    0.0,
    0.0,
    0.0,
    -1.0,
    -1.0,
    0.4285714328289032,
    -1.0,
    -1.0,
    -1.0,
    0.22032302618026733,
    0.30849677324295044,
    -0.1383458375930786,
    -0.3333333432674408,
    -0.045071009546518326,
    0.5840272903442383,
    0.0,
    -0.3661176860332489,
    -1.0,
]


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_the_policy_sees_what_it_saw_before(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(policy_module, "_load", lambda directory: None)
    speeds = MachineSpeeds(reduced_speed=1.7, recompute_cost=0.3)
    monkeypatch.setattr(policy_module, "probe_workload", lambda workload, start: speeds)
    wl = load_workload(name)
    start = TrainConfig(micro_batch_size=wl.batch_size)
    source = policy_module.PolicySource()
    source.start(
        RunContext(
            workload=wl,
            start=start,
            budget=lambda: 50_000_000,
            device_type="cpu",
            blocks=profile_blocks(wl, micro_batch_size=2),
            admits=lambda config: True,
        )
    )
    source._first = Observation(
        step=10, config=start, throughput=100.0, peak_bytes=40_000_000, b_noise=64.0, losses=(3.0, 2.9, 2.8, 2.7)
    )
    source._decisions = 3
    later = TrainConfig(micro_batch_size=wl.batch_size // 2, grad_accum_steps=2, precision="bf16", checkpoint=True)
    obs = Observation(
        step=20,
        config=later,
        throughput=80.0,
        peak_bytes=30_000_000,
        b_noise=128.0,
        losses=(3.0, 2.9, 2.8, 2.7, 2.5, 2.4),
    )
    # Format 3 appended the selective level (none: -1) and the outer precision (fp32: -1).
    expected = np.asarray([*BEFORE[name], -1.0, -1.0], dtype=np.float32)
    np.testing.assert_array_equal(source.observation(obs), expected)
    # A configuration with the outer parts reduced and a selective quarter reads there alone.
    mixed = dataclasses.replace(later, checkpoint=("selective", *[True] * (len(wl.block_names()) - 1)))
    moved = source.observation(dataclasses.replace(obs, config=dataclasses.replace(mixed, outer_precision="bf16")))
    assert moved[20:].tolist() == [-0.5, 1.0]


def test_the_simulator_shows_what_it_showed_before() -> None:
    from autotune.envs.simulated import SimulatedEnv

    env = SimulatedEnv(profiles=[ROOT / "envs" / "profiles" / "gpt-tiny.json"], memory_budget=0.8, noise=0.0)
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs, np.asarray([*SIMULATED_BEFORE, -1.0, -1.0], dtype=np.float32))
