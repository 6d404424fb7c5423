"""Growing a memory profile by a mode: only that mode's fake passes and its real check run."""

from __future__ import annotations

import re

import pytest

from autotune import load_workload
from autotune.memory.predict import profile_memory
from tests.profile_memo import counted_runs


def test_a_profile_grown_by_a_mode_runs_only_that_mode_and_keeps_its_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    workload = load_workload("mlp-digits")
    fp32 = profile_memory(workload, modes=("fp32",))
    runs = counted_runs(monkeypatch)
    grown = profile_memory(workload, modes=("fp32", "bf16"), reuse=fp32)
    assert runs == ["none", "none", "full", "full"]  # bf16's runs only
    assert grown.modes["fp32"] is fp32.modes["fp32"]
    assert [c.kind for c in fp32.checks] == ["default", "recompute"]
    assert grown.checks[:2] == fp32.checks and [c.kind for c in grown.checks[2:]] == ["bf16"]
    # What growing gives is what profiling both modes at once gives, byte for byte.
    both = profile_memory(workload, modes=("fp32", "bf16"), verify=False)
    assert both.modes == grown.modes
    # Another size: profiled again.
    runs.clear()
    profile_memory(workload, modes=("fp32",), micro_batch_sizes=(4, 8), verify=False, reuse=fp32)
    assert runs == ["none", "none", "full", "full"]


def test_a_mode_grown_by_a_recompute_level_runs_only_that_level(monkeypatch: pytest.MonkeyPatch) -> None:
    # The simulator's tables after a study's trials, or a study's profile grown by the selective
    # level: the plain (and checkpointed) runs are not made twice.
    workload = load_workload("gpt-tiny")
    plain = profile_memory(workload, modes=("fp32",), checkpointed=False, verify=False)
    runs = counted_runs(monkeypatch)
    grown = profile_memory(workload, modes=("fp32",), selective=True, verify=False, reuse=plain)
    assert runs == ["full", "full", "selective", "selective"]
    runs.clear()
    whole = profile_memory(workload, modes=("fp32",), selective=True, verify=False)
    assert runs == ["none", "none", "full", "full", "selective", "selective"]
    assert grown.modes == whole.modes


def test_each_new_mode_is_said_as_it_ends_with_its_seconds() -> None:
    # At real size a mode takes seconds (GPT-2 small, four modes: 24.6 s in one line before):
    # one line per mode as it ends, the modes a reused profile holds not said again.
    workload = load_workload("mlp-digits")
    lines: list[str] = []
    fp32 = profile_memory(workload, modes=("fp32",), verify=False, note=lines.append)
    profile_memory(workload, modes=("fp32", "bf16", "bf16@bf16"), verify=False, reuse=fp32, note=lines.append)
    assert [re.sub(r"\d+\.\d s\)$", "# s)", line) for line in lines] == [
        f"memory model: fake-tensor profile of {mode} (no real compute, # s)" for mode in ("fp32", "bf16", "bf16@bf16")
    ]


def test_a_profile_held_whole_by_the_one_reused_runs_nothing_and_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from autotune.memory import profile
    from autotune.memory.profile import fake_profile

    workload = load_workload("gpt-tiny")
    both = fake_profile(workload, modes=("fp32", "bf16"), selective=True)
    runs, optimizer_steps = counted_runs(monkeypatch), []
    costs = profile._optimizer_costs
    monkeypatch.setattr(profile, "_optimizer_costs", lambda *a: optimizer_steps.append(1) or costs(*a))
    held = fake_profile(workload, modes=("bf16",), reuse=both)
    assert (runs, optimizer_steps) == ([], [])  # no fake run, no fake optimizer step
    assert held == dataclasses.replace(both, modes={"bf16": both.modes["bf16"]})
    assert held == fake_profile(workload, modes=("bf16",), selective=True)  # what a profile anew gives
    # A run it lacks (none at other sizes, none of another device's kernels): profiled.
    runs.clear()
    fake_profile(workload, modes=("bf16",), reuse=both, device_type="cuda")
    assert runs == ["none", "none", "full", "full"]
    # Another workload's parameters (one block frozen since): profiled anew.
    workload.model.get_submodule(workload.block_names()[0]).requires_grad_(False)
    runs.clear()
    frozen = fake_profile(workload, modes=("bf16",), reuse=both)
    assert runs == [] and frozen.trainable_parameters < both.trainable_parameters
