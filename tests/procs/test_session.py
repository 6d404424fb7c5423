"""RankSession: 2 real DeepSpeed ranks (gloo, CPU), started once and driven by commands.

One session serves the module (a launch costs ~10 s); the failing-rank and parent-death tests
start short ones of their own.
"""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from autotune import ConfigError, TrainConfig, load_workload
from autotune.procs.session import RankSession, SessionError
from autotune.train.zero_state import TrainingState
from tests.paths import ZERO_WORKLOADS
from tests.processes import alive

HERE = Path(__file__).parent
ROOT = HERE.parent.parent
TINY = f"{ZERO_WORKLOADS}:build"
PSI = 3234  # parameters of the tiny workload (8 tensors)


@pytest.fixture(scope="module")
def session() -> Iterator[RankSession]:
    with RankSession(ranks=2, timeout=300) as s:
        yield s


def _config(**changes: object) -> TrainConfig:
    return TrainConfig(**({"micro_batch_size": 16, "ranks": 2} | changes))  # type: ignore[arg-type]


def _assert_same_state(before: TrainingState, after: TrainingState) -> None:
    names = before.parameters.keys()
    assert len(names) == 8 and after.parameters.keys() == names
    assert before.optimizer_state.keys() == after.optimizer_state.keys() == names
    for name in names:
        assert torch.equal(before.parameters[name], after.parameters[name]), name
        assert before.parameters[name].dtype == after.parameters[name].dtype == torch.float32
        moments, again = before.optimizer_state[name], after.optimizer_state[name]
        assert moments.keys() == again.keys() == {"exp_avg", "exp_avg_sq"}
        assert all(torch.equal(moments[k], again[k]) for k in moments), name
    assert before.optimizer_scalars.keys() == after.optimizer_scalars.keys() == {"step"}
    assert torch.equal(before.optimizer_scalars["step"], after.optimizer_scalars["step"])


def test_a_zero_stage_change_carries_parameters_and_adam_state_over_bit_for_bit(session: RankSession) -> None:
    session.start(load_workload(TINY), _config())
    for _ in range(3):
        session.step()
    for old, new, steps_so_far in ((0, 3, 3), (3, 1, 4)):
        before = session.state()
        assert before.optimizer_scalars["step"].item() == steps_so_far
        assert all(m["exp_avg"].abs().sum() > 0 for m in before.optimizer_state.values())  # trained
        change = session.reconfigure(_config(zero_stage=new))
        assert change.rebuilt is not None and change.rebuilt.startswith(f"ZeRO stage {old} -> {new}: ")
        _assert_same_state(before, session.state())  # gathered from the new engines
        session.step()


def test_training_goes_on_across_stage_changes_as_if_none_happened(session: RankSession) -> None:
    wl = load_workload(TINY)

    def run(stages: tuple[int, ...]) -> tuple[list[float], list[float]]:
        # 4 warmup steps span the first change: the LR schedule must go on where it was.
        session.start(wl, _config(lr_warmup_steps=4))
        losses, lrs = [], []
        for stage in stages:
            session.reconfigure(_config(lr_warmup_steps=4, zero_stage=stage))
            for _ in range(3):
                step = session.step()
                losses.append(step.loss)
                lrs.append(step.lr)
        return losses, lrs

    changing, changing_lrs = run((0, 3, 1, 2, 0))
    staying, staying_lrs = run((0, 0, 0, 0, 0))
    # Same data (the stream kept its place), same updates: only the reduction order may differ.
    assert changing == pytest.approx(staying, rel=1e-6, abs=0)
    assert changing_lrs == staying_lrs == [1e-3 * min(1, (i + 1) / 4) for i in range(15)]
    assert statistics.fmean(changing[-3:]) < statistics.fmean(changing[:3])


def test_stage3_holds_half_the_parameters_of_stage0_on_each_rank(session: RankSession) -> None:
    session.start(load_workload(TINY), _config())
    at0 = session.tracked_step()
    session.reconfigure(_config(zero_stage=3))
    at3 = session.tracked_step()
    assert [m.rank for m in at3.per_rank] == [0, 1]
    assert [m.resident.parameters for m in at0.per_rank] == [4 * PSI, 4 * PSI]
    assert [m.resident.parameters for m in at3.per_rank] == [4 * PSI // 2, 4 * PSI // 2]
    assert at3.peak_bytes < at0.peak_bytes
    assert at0.peak_bytes == max(m.at_peak.total for m in at0.per_rank)
    assert at0.step.samples == at3.step.samples == 2 * 16


def test_batch_and_block_knobs_change_on_the_live_engine(session: RankSession) -> None:
    wl = load_workload(TINY)
    knobs = {"micro_batch_size": 8, "grad_accum_steps": 2, "checkpoint": True, "precision": ("bf16", "fp32", "bf16")}

    def run(stage_after: int) -> tuple[list[float], str | None, TrainingState, TrainingState]:
        session.start(wl, _config(zero_stage=2))
        losses = [session.step().loss for _ in range(2)]
        before = session.state()
        change = session.reconfigure(_config(zero_stage=stage_after, **knobs))
        after = session.state()
        steps = [session.step() for _ in range(3)]
        assert all(s.samples == 2 * 8 * 2 for s in steps)
        return losses + [s.loss for s in steps], change.rebuilt, before, after

    live, live_rebuilt, before, after = run(2)
    assert live_rebuilt is None
    _assert_same_state(before, after)
    # The same change with a new engine (ZeRO 1 computes what ZeRO 2 does) trains identically.
    rebuilt, reason, _, _ = run(1)
    assert reason is not None
    assert live == pytest.approx(rebuilt, rel=1e-6, abs=0)


def test_an_engine_precision_change_rebuilds_and_keeps_the_fp32_masters(session: RankSession) -> None:
    session.start(load_workload(TINY), _config())
    session.step()
    for stage, precision in ((0, "bf16"), (3, "bf16"), (3, "fp32")):
        before = session.state()
        change = session.reconfigure(_config(zero_stage=stage, precision=precision))
        assert change.rebuilt is not None
        _assert_same_state(before, session.state())
        session.step()
    assert change.rebuilt.startswith("engine precision bf16 -> fp32")


def test_user_mistakes_are_refused_before_the_ranks_and_the_session_goes_on(session: RankSession) -> None:
    session.start(load_workload(TINY), _config())
    msg = "TrainConfig.ranks must equal the session's ranks (2), but got 3."
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        session.reconfigure(TrainConfig(ranks=3))
    msg = "TrainConfig.micro_batch_size must be <= the dataset size of workload 'my-net' per rank (256 // 2 ranks), "
    with pytest.raises(ConfigError, match=f"^{re.escape(msg + 'but got 200.')}$"):
        session.reconfigure(_config(micro_batch_size=200))
    assert not session.closed and session.step().samples == 32


def test_an_error_in_a_rank_comes_back_typed_and_no_process_is_left() -> None:
    wl = load_workload(f"{ZERO_WORKLOADS}:fails_on_rank_1")
    with RankSession(ranks=2, timeout=120) as s:
        s.start(wl, _config(zero_stage=1))
        pids = [*s.rank_pids, s.launcher_pid]
        assert all(alive(pid) for pid in pids)
        # Rank 0 is left waiting for rank 1 in the gradient reduction: the session ends it.
        msg = "rank 1 failed in 'step': RuntimeError: rank 1 refuses this batch"
        with pytest.raises(SessionError, match=f"^{re.escape(msg)}$"):
            s.step()
        assert s.closed
        assert not any(alive(pid) for pid in pids)
        msg = "the session is closed, but got command 'step'; start a new RankSession."
        with pytest.raises(SessionError, match=f"^{re.escape(msg)}$"):
            s.step()


def test_a_command_that_takes_too_long_ends_the_session() -> None:
    wl = load_workload(f"{ZERO_WORKLOADS}:hangs_on_rank_1")  # the parent's copy builds
    with RankSession(ranks=2, timeout=120) as s:
        pids = [*s.rank_pids, s.launcher_pid]
        s.timeout = 4.0  # for the commands from here on (start-up alone takes ~5 s)
        msg = "the ranks did not finish command 'start' within 4 s; the session is closed."
        with pytest.raises(SessionError, match=f"^{re.escape(msg)}$"):
            s.start(wl, _config())
        assert s.closed
    assert not any(alive(pid) for pid in pids)


def test_the_ranks_end_when_the_parent_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent("""
            import time
            from autotune.procs.session import RankSession

            session = RankSession(ranks=2, timeout=120)
            print(*session.rank_pids, session.launcher_pid, flush=True)
            time.sleep(600)
        """)
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 3 and all(alive(pid) for pid in pids)
    finally:
        parent.kill()  # SIGKILL: no finalizer, no atexit; the ranks' watchdogs must notice
        parent.wait()
        parent.stdout.close()  # type: ignore[union-attr]
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in pids)


def test_ctrl_c_while_the_ranks_measure_ends_them_at_once() -> None:
    """Interrupted in the middle of a measurement (here: from its progress callback), the session
    ends every rank at once instead of asking busy ranks to close."""
    wl = load_workload(TINY)

    def interrupt(phase: str, done: int, total: int) -> None:
        if phase == "timed":
            raise KeyboardInterrupt

    session = RankSession(ranks=2, timeout=300)
    with pytest.raises(KeyboardInterrupt):
        session.measure(
            wl, TrainConfig(micro_batch_size=8, ranks=2), steps=3, warmup=1, memory_budget=None, progress=interrupt
        )
    assert session.closed
    assert not any(alive(pid) for pid in session.rank_pids)
