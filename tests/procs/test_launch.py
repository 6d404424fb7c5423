"""The launcher: torchrun starts the ranks, and whatever happens no rank is left running."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from autotune.procs.launch import PIDS_DIR, LaunchError, free_port, launch_module
from tests.processes import alive

STUB = "tests.procs.ranks_stub"


def _pids(run_dir: Path) -> list[int]:
    return [int(p.name) for p in (run_dir / PIDS_DIR).iterdir()]


def test_free_port_is_bindable() -> None:
    assert 1024 <= free_port() < 65536


def test_ranks_that_finish_leave_nothing_behind(tmp_path: Path) -> None:
    launch_module(STUB, [str(tmp_path), "ok"], nprocs=2, run_dir=tmp_path, timeout=120)
    assert len(_pids(tmp_path)) == 2
    assert not any(alive(pid) for pid in _pids(tmp_path))


def test_a_failing_rank_is_an_error_and_the_others_are_stopped(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match=r"^torchrun exited with status 1; see .*torchrun\.log$"):
        launch_module(STUB, [str(tmp_path), "fail"], nprocs=2, run_dir=tmp_path, timeout=120)
    assert not any(alive(pid) for pid in _pids(tmp_path))


def test_timeout_and_interrupt_reap_every_rank(tmp_path: Path) -> None:
    started = tmp_path / PIDS_DIR

    def interrupt_once_both_run() -> None:
        if started.is_dir() and len(list(started.iterdir())) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch_module(STUB, [str(tmp_path), "sleep"], nprocs=2, run_dir=tmp_path, poll=interrupt_once_both_run)
    assert len(_pids(tmp_path)) == 2
    assert not any(alive(pid) for pid in _pids(tmp_path))

    again = tmp_path / "again"
    with pytest.raises(LaunchError, match=f"^{re.escape('the ranks did not finish within 8 s')}$"):
        launch_module(STUB, [str(again), "sleep"], nprocs=2, run_dir=again, timeout=8)
    assert not any(alive(pid) for pid in _pids(again))
    assert os.getpid() not in _pids(again)
