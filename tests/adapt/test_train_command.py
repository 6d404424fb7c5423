from __future__ import annotations

import json
import select
from typing import Any

import pytest

import autotune.procs.session
from autotune.adapt.adaptive import Adaptive
from autotune.cli import main
from autotune.procs.session import RankSession
from tests.paths import ZERO_WORKLOADS
from tests.phase_lines import without_phase_lines
from tests.processes import alive


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--steps", "0"), "autotune train: error: --steps must be >= 1, but got 0.\n"),
        (
            ("--policy", "p"),
            "autotune train: error: --policy needs --adapt (without it the run keeps the default configuration).\n",
        ),
        (("--adapt", "--decide-every", "1"), "autotune train: error: decide_every must be an int >= 2, but got 1.\n"),
        (
            ("--memory-budget", "8"),
            "autotune train: error: memory_budget needs a unit: a size such as 8GiB or 8MiB, "
            "or a percentage such as 75%, but got '8'.\n",
        ),
        (("--ranks", "0"), "autotune train: error: --ranks must be >= 1, but got 0.\n"),
        # Flags of an adaptive run, given to a fixed one: refused, not ignored (issue 19).
        (
            ("--decide-every", "5"),
            "autotune train: error: --decide-every needs --adapt (without it the run keeps "
            "the default configuration).\n",
        ),
        (
            ("--decide-every", "10"),
            "autotune train: error: --decide-every needs --adapt (without it the run keeps "
            "the default configuration).\n",
        ),  # the default's value, given
        (
            ("--adapt-batch",),
            "autotune train: error: --adapt-batch needs --adapt (without it the run keeps the "
            "default configuration).\n",
        ),
        (
            ("--ranks", "2", "--adapt-batch"),
            "autotune train: error: --adapt-batch needs one process (--ranks 1): the "
            "batch follows the gradient noise scale, which ZeRO's engines do not "
            "expose.\n",
        ),
        (
            ("--objective", "throughput"),
            "autotune train: error: --objective needs --adapt (without it the run keeps the default configuration).\n",
        ),
        (
            ("--adapt", "--objective", "bogus"),
            "autotune train: error: objective must be one of ('per-gib', 'throughput'), but got 'bogus'.\n",
        ),
        (
            ("--ranks", "3"),
            "autotune train: error: the batch of workload 'mlp-digits' (32) must divide evenly by ranks=3.\n",
        ),
    ],
)
def test_user_mistakes_are_one_line_exit_2(
    args: tuple[str, ...], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "mlp-digits", *args]) == 2
    assert capsys.readouterr().err == line


def test_adaptive_training_reports_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "mlp-digits", "--steps", "8", "--adapt", "--decide-every", "4"]) == 0
    out = capsys.readouterr().out
    assert "8 steps, 256 samples in" in out  # mlp-digits trains batches of 32
    # The first configuration is judged at the first decision (its peak tracked, its steps timed).
    assert "best measured: micro x acc x ranks" in out and "samples/s per GiB" in out


def test_json_is_every_step_and_decision(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "mlp-digits", "--steps", "2", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run.keys() == {"budget_bytes", "steps", "history", "over_budget_steps"}
    assert run["history"] == [] and run["over_budget_steps"] == []
    steps = [(s["step"], s["samples"], s["config"]["micro_batch_size"]) for s in run["steps"]]
    assert steps == [(0, 32, 32), (1, 32, 32)]
    # The first step creates Adam's state; the second, the default's first full one, is tracked.
    assert run["steps"][0]["peak_bytes"] is None and 0 < run["steps"][1]["peak_bytes"] <= run["budget_bytes"]


def test_ctrl_c_exits_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(self: Adaptive) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Adaptive, "step", interrupted)
    assert main(["train", "mlp-digits", "--steps", "3"]) == 130
    assert without_phase_lines(capsys.readouterr().err) == "autotune train: interrupted\n"


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> list[RankSession]:
    """Every RankSession the command starts (to check that its processes are gone after)."""
    started: list[RankSession] = []
    init = RankSession.__init__

    def recording(self: RankSession, **kwargs: Any) -> None:
        started.append(self)
        init(self, **kwargs)

    monkeypatch.setattr(RankSession, "__init__", recording)
    return started


def _pids(session: RankSession) -> list[int]:
    return [*session.rank_pids, session.launcher_pid]


def test_adaptive_training_on_ranks_reports_the_run_and_leaves_no_process(
    sessions: list[RankSession], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["train", f"{ZERO_WORKLOADS}:build", "--steps", "4", "--adapt", "--ranks", "2", "--decide-every", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "4 steps on 2 ranks, 128 samples in" in out  # 16 per rank
    assert "per rank" in out
    (session,) = sessions
    assert session.closed and len(session.rank_pids) == 2
    assert not any(alive(pid) for pid in _pids(session))


def test_ctrl_c_on_ranks_exits_130_and_leaves_no_process(
    sessions: list[RankSession], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    class Interrupted:
        """Ctrl-C while the parent waits for the ranks' first reply (their start)."""

        @staticmethod
        def select(*args: Any) -> Any:
            raise KeyboardInterrupt

    monkeypatch.setattr(autotune.procs.session, "select", Interrupted)
    assert main(["train", f"{ZERO_WORKLOADS}:build", "--steps", "3", "--ranks", "2"]) == 130
    assert without_phase_lines(capsys.readouterr().err) == "autotune train: interrupted\n"
    (session,) = sessions
    assert len(session.rank_pids) == 2 and session.closed
    assert not any(alive(pid) for pid in _pids(session))
    assert select.select is not None  # the real module is untouched: only the session's name for it


def test_a_step_measured_over_the_budget_is_warned_listed_and_exits_4(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import autotune.adapt.adaptive
    from autotune.config import TrainConfig
    from tests.adapt.scripted import Scripted
    from tests.paths import TINY_WORKLOAD

    # 80% of the default's peak: the run starts at a smaller micro-batch; the script proposes the
    # default back, and the gate admits it on a prediction that lies (1 B), made after the start
    # (as in tests/adapt/test_adaptive.py). The default's tracked step measures it over.
    default = TrainConfig(micro_batch_size=16, grad_clip=None)
    monkeypatch.setattr(autotune.adapt.adaptive, "decision_source", lambda policy: Scripted([default]))
    init = Adaptive.__init__

    def lying(self: Adaptive, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.gate.predict = lambda config: (1, True)  # type: ignore[method-assignment]

    monkeypatch.setattr(Adaptive, "__init__", lying)
    args = [
        "train",
        f"{TINY_WORKLOAD}:build",
        "--steps",
        "6",
        "--adapt",
        "--decide-every",
        "2",
        "--memory-budget",
        "80%",
    ]
    assert main([*args, "--json"]) == 4
    out = capsys.readouterr()
    run = json.loads(out.out)
    (over,) = run["over_budget_steps"]
    peak, budget = over["peak_bytes"], over["budget_bytes"]
    assert (over["step"], over["predicted_bytes"], over["config"]["micro_batch_size"]) == (2, 1, 16)
    assert peak > budget == run["budget_bytes"] and run["steps"][2]["peak_bytes"] == peak
    reverted = [c for c in run["history"] if c["reverted"]]
    assert [(c["step"], c["measured_bytes"]) for c in reverted] == [(3, peak)]
    what = (
        f"step 2: micro x acc x ranks 16x1x1 | fp32 | ckpt none | ZeRO 0 measured a peak of {peak} B "
        f"(predicted 1 B), over the memory budget of {budget} B"
    )
    assert [line for line in without_phase_lines(out.err).splitlines() if line] == [
        f"autotune train: warning: {what}",
        f"autotune train: 1 step(s) measured a peak over the memory budget, the first at {what}; "
        "--allow-over-budget accepts that",
    ]
    # The same run, allowed: exit 0, the warning still said.
    assert main([*args, "--allow-over-budget"]) == 0
    out = capsys.readouterr()
    assert [line for line in without_phase_lines(out.err).splitlines() if line] == [f"autotune train: warning: {what}"]
    assert f"OVER BUDGET: {what}" in " ".join(out.out.split())


def test_a_nan_loss_never_reaches_the_trained_weights(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch

    import autotune.resolve
    from tests.paths import NAN_WORKLOAD

    loaded: list[Any] = []
    load = autotune.resolve.load_workload

    def spy(ref: str) -> Any:
        loaded.append(load(ref))
        return loaded[-1]

    monkeypatch.setattr(autotune.resolve, "load_workload", spy)
    before = [p.detach().clone() for p in load(f"{NAN_WORKLOAD}:build").model.parameters()]  # seeded: the same
    assert main(["train", f"{NAN_WORKLOAD}:build", "--steps", "3", "--json"]) == 0
    [wl] = loaded
    assert all(torch.equal(p, q) for p, q in zip(wl.model.parameters(), before, strict=True))  # every step skipped
    out, err = capsys.readouterr()
    run = json.loads(out)
    assert [s["step"] for s in run["steps"]] == [0, 1, 2]
    assert (
        "autotune train: warning: step 0: the loss is nan under micro x acc x ranks 16x1x1 | fp32 | ckpt none | "
        "ZeRO 0 (its update skipped: the weights and optimizer state are the step before's); training goes on\n"
    ) in err  # a line on a busy machine may come before it
