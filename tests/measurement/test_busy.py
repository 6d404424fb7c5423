"""The busy-machine line at the start of study/tune/train, decided on scripted load averages (the
conftest's ``quiet_machine`` keeps the real load out of every test)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from autotune.cli.main import main
from autotune.measurement import busy
from autotune.measurement.busy import busy_warning, warn_if_busy


def test_a_quiet_machine_or_threads_that_leave_room_get_no_line() -> None:
    assert busy_warning(None, threads=2, cores=2) is None  # no load average on this platform
    assert busy_warning(0.3, threads=2, cores=2) is None  # housekeeping, not another process
    assert busy_warning(1.0, threads=1, cores=2) is None  # one other process, one thread: a core each
    assert busy_warning(1.9, threads=2, cores=8) is None


def test_another_process_on_a_fully_threaded_machine_is_one_line() -> None:
    assert busy_warning(0.6, threads=2, cores=2) == (
        "busy machine: load average 0.6 on 2 cores; timings will be noisy (2 torch threads and the other "
        "processes oversubscribe the cores: OpenMP threads wait on each other); fewer threads time steadier, "
        "see --threads (e.g. --threads 1)"
    )
    line = busy_warning(3.2, threads=1, cores=2)
    assert line is not None and line.startswith("busy machine: load average 3.2 on 2 cores; timings will be noisy")
    assert line.endswith("see --threads (e.g. --threads 1)")
    assert busy_warning(2.0, threads=8, cores=8) == (
        "busy machine: load average 2.0 on 8 cores; timings will be noisy (8 torch threads and the other "
        "processes oversubscribe the cores: OpenMP threads wait on each other); fewer threads time steadier, "
        "see --threads (e.g. --threads 6)"
    )


def test_the_reading_can_be_fixed_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.errors import ConfigError

    monkeypatch.setenv("AUTOTUNE_LOAD_AVERAGE", "2.5")
    assert busy.load_average() == 2.5
    monkeypatch.setenv("AUTOTUNE_LOAD_AVERAGE", "high")
    with pytest.raises(ConfigError) as bad:
        busy.load_average()
    assert str(bad.value) == "AUTOTUNE_LOAD_AVERAGE must be a number, but got 'high'."


def test_warn_if_busy_says_it_through_note_once() -> None:
    said: list[str] = []
    assert warn_if_busy(2, said.append, load=0.2, cores=2) is None
    line = warn_if_busy(2, said.append, load=1.5, cores=2)
    assert said == [line] and line is not None


def test_train_warns_once_before_its_first_step(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AUTOTUNE_LOAD_AVERAGE", "1.5")
    monkeypatch.setattr(busy, "_cores", lambda: 2)
    before = torch.get_num_threads()
    try:
        assert main(["train", "mlp-digits", "--steps", "2", "--threads", "1", "--json"]) == 0
        assert torch.get_num_threads() == 1  # --threads set this process's (the one that times) threads
    finally:
        torch.set_num_threads(before)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("busy machine")]
    assert lines == [
        "busy machine: load average 1.5 on 2 cores; timings will be noisy (1 torch thread and the other "
        "processes oversubscribe the cores: OpenMP threads wait on each other); fewer threads time steadier, "
        "see --threads (e.g. --threads 1)"
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "mlp-digits", "--threads", "0"], "--threads must be >= 1, but got 0."),
        (
            ["tune", "mlp-digits", "--threads", "1", "--ranks", "2"],
            "--threads needs one process (--ranks 1): 2 ranks share the cores, one share each.",
        ),
    ],
)
def test_bad_threads_are_one_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(args) == 2
    assert capsys.readouterr().err.endswith(f"{message}\n")


def test_a_load_average_left_by_a_job_that_ended_is_not_a_busy_machine() -> None:
    # The load average decays over minutes; what other processes use right now decides.
    said: list[str] = []
    assert warn_if_busy(2, said.append, load=1.5, cores=2, now=lambda: 0.1) is None
    assert said == []
    line = warn_if_busy(2, said.append, load=1.5, cores=2, now=lambda: 0.9)  # still running
    assert said == [line] and line is not None and line.startswith("busy machine: load average 1.5 on 2 cores")
    assert warn_if_busy(2, said.append, load=1.5, cores=2, now=lambda: None) == line  # no sample: the average


def test_the_sample_counts_other_processes_and_not_this_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # /proc/stat's busy seconds advance by 1.2 s while this process used 0.4 s of them, over 1 s.
    busy_seconds = iter([10.0, 11.2])
    own = iter([5.0, 5.4])
    clock = iter([100.0, 101.0])
    monkeypatch.setattr(busy, "_busy_seconds", lambda: next(busy_seconds))
    monkeypatch.setattr(busy, "_own_seconds", lambda: next(own))
    monkeypatch.setattr(busy.time, "monotonic", lambda: next(clock))
    load = busy.CoreLoad.start()
    assert load.other_cores() == pytest.approx(0.8)


def _spin(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_a_child_process_s_cpu_time_is_this_process_s_own() -> None:
    # A study launches its measuring child before it checks the machine: the child's build is the
    # study's own work, not another process making the machine busy.
    import multiprocessing

    child = multiprocessing.get_context("spawn").Process(target=_spin, args=(3.0,))
    child.start()
    try:
        time.sleep(1.0)  # started: the interpreter is up and spinning
        before = busy._own_seconds()
        time.sleep(1.0)
        assert busy._own_seconds() - before >= 0.2  # the child's spinning (this process sleeps)
    finally:
        child.join()
    # Ended and waited for: its seconds stay counted (os.times' children), none lost when it ends.
    assert busy._own_seconds() >= before + 0.2
