"""Measurements in a child process: results come back, hangs are killed at the time limit, the
child is replaced after a failure."""

from __future__ import annotations

import re

import pytest

from autotune.config import TrainConfig
from autotune.errors import StudyError, WorkloadError
from autotune.procs.isolation import MeasurementFailed, MeasurementProcess
from tests.paths import TINY_WORKLOAD

TINY = TINY_WORKLOAD


def test_a_hanging_trial_is_killed_at_the_time_limit_and_the_next_one_runs() -> None:
    with MeasurementProcess(f"{TINY}:build_hanging", threads=1) as proc:
        m = proc.measure(
            TrainConfig(micro_batch_size=4, grad_accum_steps=4), steps=2, warmup=1, memory_budget=None, timeout=120
        )
        assert (m.workload, m.status, m.config.micro_batch_size) == ("hanging", "ok", 4)
        assert m.throughput is not None and m.throughput > 0
        message = "the measurement exceeded the time limit of 2 s and was killed"
        with pytest.raises(MeasurementFailed, match=f"^{re.escape(message)}$"):
            proc.measure(
                TrainConfig(micro_batch_size=1, grad_accum_steps=16), steps=2, warmup=1, memory_budget=None, timeout=2
            )
        again = proc.measure(
            TrainConfig(micro_batch_size=8, grad_accum_steps=2), steps=2, warmup=1, memory_budget=None, timeout=120
        )
        assert again.status == "ok"


def test_a_config_the_runner_refuses_fails_with_its_message() -> None:
    message = (
        "ConfigError: TrainConfig.micro_batch_size must be <= the dataset size of workload 'tiny' (256), but got 512."
    )
    with (
        MeasurementProcess(f"{TINY}:build", threads=1) as proc,
        pytest.raises(MeasurementFailed, match=f"^{re.escape(message)}$"),
    ):
        proc.measure(TrainConfig(micro_batch_size=512), steps=1, warmup=1, memory_budget=None, timeout=120)


def test_a_workload_that_cannot_be_built_is_a_study_error() -> None:
    message = (
        "the measurement process could not build workload 'nope.py:build': "
        "workload 'nope.py:build': file 'nope.py' does not exist"
    )
    with pytest.raises(StudyError, match=f"^{re.escape(message)}$"):
        MeasurementProcess("nope.py:build").start()


def test_a_broken_loss_fn_is_the_users_mistake_not_a_failed_trial() -> None:
    message = "workload 'tiny': loss_fn must return a scalar tensor, but returned shape (1, 16)"
    proc = MeasurementProcess(f"{TINY}:build_bad_loss", threads=1)
    with proc, pytest.raises(WorkloadError, match=f"^{re.escape(message)}$"):
        proc.start()


def test_an_idle_child_exits_on_its_own_when_closed_and_a_busy_one_is_killed() -> None:
    """Closed idle, the child reads the end of its pipe and exits 0 (its exit handlers run:
    inductor's compile workers shut down); past a time limit it is killed (SIGKILL)."""
    proc = MeasurementProcess(f"{TINY}:build", threads=1)
    proc.measure(TrainConfig(micro_batch_size=8), steps=1, warmup=1, memory_budget=None, timeout=120)
    child = proc._process
    assert child is not None
    proc.close()
    assert child.exitcode == 0
    with MeasurementProcess(f"{TINY}:build_hanging", threads=1) as hanging:
        hanging.start()
        busy = hanging._process
        with pytest.raises(MeasurementFailed):
            hanging.measure(
                TrainConfig(micro_batch_size=1, grad_accum_steps=16), steps=2, warmup=1, memory_budget=None, timeout=2
            )
        assert busy is not None and busy.exitcode == -9


def test_a_launched_child_builds_while_the_parent_works_and_start_waits_for_it() -> None:
    with MeasurementProcess(f"{TINY}:build", threads=1) as proc:
        assert proc.built()  # none launched: nothing to wait for
        proc.launch()
        child = proc._process
        # Spawned, it imports torch and builds the workload (seconds): not answered yet.
        assert child is not None and child.is_alive() and not proc.built()
        proc.launch()  # idempotent: the same child
        assert proc._process is child
        proc.start()
        assert proc.built() and proc._process is child
        m = proc.measure(TrainConfig(micro_batch_size=8), steps=1, warmup=1, memory_budget=None, timeout=120)
        assert m.status == "ok" and proc._process is child


def test_a_launched_child_that_cannot_build_the_workload_fails_at_start() -> None:
    with MeasurementProcess(f"{TINY}:no_such_builder", threads=1) as proc:
        proc.launch()
        with pytest.raises(StudyError):
            proc.start()
        assert proc.built()  # closed: start would launch anew


def test_the_child_s_warm_up_step_runs_at_the_smallest_micro_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its one-time costs are the process's, not a shape's: at the whole batch in fp32 a GPT-2
    # small at sequence 1024 held 52 GiB, and the kernel killed the child on a 24 GiB host.
    from autotune.procs import isolation

    seen: list[TrainConfig] = []
    monkeypatch.setattr("autotune.procs.measure.measure", lambda workload, config, **kw: seen.append(config))
    isolation._build(f"{TINY}:build", "cpu")
    isolation._build(f"{TINY}:build_hanging", "cpu")  # its floor: 4
    isolation._build("unet-tiny", "cpu")  # BatchNorm: no floor below the whole batch
    assert [(c.micro_batch_size, c.grad_accum_steps, c.precision) for c in seen] == [
        (1, 1, "fp32"),
        (4, 1, "fp32"),
        (16, 1, "fp32"),
    ]
