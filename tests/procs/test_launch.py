"""The launcher: torchrun starts the ranks, and whatever happens no rank is left running."""

from __future__ import annotations

import time
from pathlib import Path

from autotune.procs.launch import PIDS_DIR, free_port, start_module
from tests.processes import alive

STUB = "tests.procs.ranks_stub"


def _pids(run_dir: Path) -> list[int]:
    return [int(p.name) for p in (run_dir / PIDS_DIR).iterdir()]


def _wait_for_pids(run_dir: Path, n: int, seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while len(list((run_dir / PIDS_DIR).iterdir())) < n:
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.1)


def test_free_port_is_bindable() -> None:
    assert 1024 <= free_port() < 65536


def test_ranks_that_finish_leave_nothing_behind(tmp_path: Path) -> None:
    ranks = start_module(STUB, [str(tmp_path), "ok"], nprocs=2, run_dir=tmp_path)
    assert ranks.proc.wait(timeout=120) == 0
    ranks.reap()
    assert len(_pids(tmp_path)) == 2
    assert not any(alive(pid) for pid in _pids(tmp_path))


def test_a_failing_rank_ends_torchrun_and_the_others_are_stopped(tmp_path: Path) -> None:
    ranks = start_module(STUB, [str(tmp_path), "fail"], nprocs=2, run_dir=tmp_path)
    assert ranks.proc.wait(timeout=120) == 1
    ranks.reap()
    assert not any(alive(pid) for pid in _pids(tmp_path))


def test_reap_ends_ranks_that_would_run_for_minutes(tmp_path: Path) -> None:
    ranks = start_module(STUB, [str(tmp_path), "sleep"], nprocs=2, run_dir=tmp_path)
    _wait_for_pids(tmp_path, 2)
    assert ranks.poll() is None
    ranks.reap()
    assert ranks.poll() is not None
    assert not any(alive(pid) for pid in _pids(tmp_path))
