"""Growing a memory profile by a mode: only that mode's fake passes and its real check run."""

from __future__ import annotations

import pytest

from autotune import load_workload
from autotune.memory import profile as profile_module
from autotune.memory.predict import profile_memory


def test_a_profile_grown_by_a_mode_runs_only_that_mode_and_keeps_its_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    workload = load_workload("mlp-digits")
    profiled: list[str] = []
    original = profile_module._profile_mode

    def counted(*args: object, **kwargs: object) -> profile_module.ModeProfile:
        profiled.append(str(args[2]))  # (workload, fake, mode, sizes, recompute)
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(profile_module, "_profile_mode", counted)
    fp32 = profile_memory(workload, modes=("fp32",))
    grown = profile_memory(workload, modes=("fp32", "bf16"), reuse=fp32)
    assert profiled == ["fp32", "bf16"]
    assert grown.modes["fp32"] is fp32.modes["fp32"]
    assert [c.kind for c in fp32.checks] == ["default", "recompute"]
    assert grown.checks[:2] == fp32.checks and [c.kind for c in grown.checks[2:]] == ["bf16"]
    # What growing gives is what profiling both modes at once gives, byte for byte.
    both = profile_memory(workload, modes=("fp32", "bf16"), verify=False)
    assert both.modes == grown.modes
    # Another size or no checkpointed runs to reuse: profiled again.
    profiled.clear()
    profile_memory(workload, modes=("fp32",), micro_batch_sizes=(4, 8), verify=False, reuse=fp32)
    plain = profile_memory(workload, modes=("fp32",), checkpointed=False, verify=False)
    profile_memory(workload, modes=("fp32",), verify=False, reuse=plain)
    assert profiled == ["fp32", "fp32", "fp32"]
