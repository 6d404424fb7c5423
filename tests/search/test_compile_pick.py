"""The study's recommendation timed eager and compiled: the stored outcome, the printed line, what
``autotune best`` exports. The comparison is faked at the measuring child's reply (never a real
compile: that is the slow test at the end)."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from rich.console import Console

from autotune.cli.main import main
from autotune.config import TrainConfig
from autotune.errors import MeasurementFailed
from autotune.measurement.compiled import CompileCheck
from autotune.measurement.sidebyside import Timing
from autotune.procs import isolation
from autotune.procs.channel import decode, encode
from autotune.search.compile_pick import (
    COMPILE_CHECK,
    Candidate,
    CompilePick,
    check_recommendation,
    compiled_choice,
    compiled_value,
)
from autotune.search.display import summary_view
from autotune.search.finalists import RETIMED, TRIAL_ATTRS, set_finished_trial_attrs
from autotune.search.results import summarize
from autotune.search.trial_record import ATTR
from tests.paths import TINY_WORKLOAD

GIB = 1024**3
WINS = "torch.compile: 2.00x eager (step 62.5 ms vs 125.0 ms, peak not measured: no allocator to ask on the CPU), "
WINS += "compile 20 s, pays back after 320 steps: recommended"
NOISE = "torch.compile: 1.10x eager (step 113.6 ms vs 125.0 ms, peak not measured: no allocator to ask on the CPU), "
NOISE += "compile 20 s, pays back after 1,800 steps: not recommended (within the noise)"


def _check(eager: tuple[float, ...], compiled: tuple[float, ...]) -> CompileCheck:
    return CompileCheck(
        mode="default",
        eager=Timing(rates=eager),
        compiled=Timing(rates=compiled),
        samples=16,
        warmup_seconds=(20.0625, 0.0625),
        eager_peak=None,
        compiled_peak=None,
        rounds=3,
    )


WINNING = _check((128.0, 128.0, 128.0), (256.0, 256.0, 256.0))
# 1.10x in the medians, but round by round 1.10x, 1.28x, 0.95x: within the noise
CLOSE = _check((128.0, 118.0, 138.0), (140.8, 150.8, 130.8))


def _study(storage: str | None, config: TrainConfig | None = None) -> optuna.Study:
    study = optuna.create_study(study_name="s", storage=storage, directions=["maximize", "minimize"])
    study.set_user_attr("blocks", ["blocks.0", "blocks.1"])
    study.set_user_attr("largest_parameter", 64)
    config = config or TrainConfig(micro_batch_size=8, grad_accum_steps=2)
    attrs = {ATTR.CONFIG: config.to_dict(), ATTR.STATUS: "ok", ATTR.THROUGHPUT: 100.0, ATTR.PEAK: GIB}
    study.add_trial(optuna.trial.create_trial(values=[100.0, 1024.0], user_attrs=attrs))
    return study


class _Compare:
    """The measuring child's comparison, scripted: records what it was asked."""

    def __init__(self, reply: CompileCheck | MeasurementFailed) -> None:
        self.reply, self.asked = reply, []  # type: list[TrainConfig]

    def __call__(self, config: TrainConfig) -> CompileCheck:
        self.asked.append(config)
        if isinstance(self.reply, MeasurementFailed):
            raise self.reply
        return self.reply


def _pick(study: optuna.Study, compare: _Compare) -> tuple[CompilePick | None, list[str]]:
    notes: list[str] = []
    pick = check_recommendation(study, summarize(study).recommended, compare, note=notes.append)
    return pick, notes


def test_a_winning_compile_is_stored_printed_after_the_recommendation_and_exported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    study = _study(f"sqlite:///{db}")
    compare = _Compare(WINNING)
    pick, notes = _pick(study, compare)
    assert compare.asked == [TrainConfig(micro_batch_size=8, grad_accum_steps=2)]  # the eager configuration
    assert notes == ["timing the recommendation (trial 0) eager and compiled side by side (torch.compile)"]
    assert pick == CompilePick(trial=0, check=WINNING) and pick.compiled
    assert study.user_attrs[COMPILE_CHECK] == {"trial": 0, "check": WINNING.to_dict()}
    summary = summarize(optuna.load_study(study_name="s", storage=f"sqlite:///{db}"))  # another process's view
    assert summary.compile_pick == pick
    assert summary.recommended_config == TrainConfig(micro_batch_size=8, grad_accum_steps=2, compile="default")

    console = Console(record=True, width=400, file=io.StringIO())
    console.print(summary_view(summary))
    lines = console.export_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("recommended: trial 0"))
    assert lines[at + 1] == WINS

    out, err = {}, {}
    for fmt in ("json", "python", "deepspeed"):
        assert main(["best", "s", "--storage", str(db), "--format", fmt, "--no-retime"]) == 0
        out[fmt], err[fmt] = capsys.readouterr()
    assert TrainConfig.from_json(out["json"]).compile == "default"
    measured = json.loads(out["json"])["measured"]["compile"]
    assert measured == {"compiled": True, "line": WINS, "trial": 0, "check": WINNING.to_dict()}
    said = f"autotune best: the recommendation compiled (default): {WINS}\n"
    assert err["json"] == err["python"] == said
    assert "    model.compile()  # torch.compile in place (default), as it was measured\n" in out["python"]
    assert err["deepspeed"].startswith(said)
    assert "call engine.compile() after deepspeed.initialize" in err["deepspeed"]


def test_a_compile_within_the_noise_leaves_the_recommendation_eager_and_says_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    study = _study(f"sqlite:///{db}")
    pick, _ = _pick(study, _Compare(CLOSE))
    assert pick is not None and not pick.compiled and pick.line == NOISE
    assert summarize(study).recommended_config == TrainConfig(micro_batch_size=8, grad_accum_steps=2)
    assert main(["best", "s", "--storage", str(db), "--format", "json", "--no-retime"]) == 0
    out, err = capsys.readouterr()
    assert TrainConfig.from_json(out).compile == "none"
    assert err == f"autotune best: the recommendation stays eager: {NOISE}\n"


def test_a_failed_comparison_and_a_deepspeed_recommendation_stay_eager_with_the_reason() -> None:
    study = _study(None)
    pick, _ = _pick(study, _Compare(MeasurementFailed("the compile check exceeded the time limit of 900 s")))
    assert pick == CompilePick(
        trial=0, reason="the comparison failed: the compile check exceeded the time limit of 900 s"
    )
    assert pick.line == (
        "torch.compile: not checked (the comparison failed: the compile check exceeded the time limit of 900 s)"
    )
    assert pick.export_line == (
        "the recommendation stays eager: torch.compile not checked (the comparison failed: the compile check "
        "exceeded the time limit of 900 s)"
    )
    ranks = _study(None, TrainConfig(micro_batch_size=8, grad_accum_steps=2, zero_stage=2))
    compare = _Compare(WINNING)
    pick, notes = _pick(ranks, compare)
    assert compare.asked == [] and notes == []
    assert pick == CompilePick(trial=0, reason="it runs on DeepSpeed ranks: call engine.compile() there")
    assert summarize(ranks).recommended_config == TrainConfig(micro_batch_size=8, grad_accum_steps=2, zero_stage=2)


def test_a_recommendation_is_checked_once_and_a_check_of_another_trial_is_not_read() -> None:
    study = _study(None)
    _pick(study, _Compare(WINNING))
    again = _Compare(CLOSE)
    pick, notes = _pick(study, again)
    assert again.asked == [] and notes == [] and pick == CompilePick(trial=0, check=WINNING)
    study.set_user_attr(COMPILE_CHECK, {"trial": 7, "check": WINNING.to_dict()})  # another trial's
    summary = summarize(study)
    assert summary.compile_pick is None
    assert summary.recommended_config == TrainConfig(micro_batch_size=8, grad_accum_steps=2)


def test_the_child_replies_with_the_check_and_the_parent_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both sides of the ``compile`` command, the pipe replaced by the child's own reply."""
    asked: list[tuple[TrainConfig, str | None, int | None]] = []

    def compare_compiled(workload: Any, config: TrainConfig, *, device: str | None, memory_budget: int | None) -> Any:
        asked.append((config, device, memory_budget))
        return WINNING

    monkeypatch.setattr("autotune.measurement.compiled.compare_compiled", compare_compiled)
    sent: list[dict[str, Any]] = []

    class Pipe:
        def send_bytes(self, data: bytes) -> None:
            sent.append(decode(data))

    child = isolation.MeasurementProcess("tiny")
    monkeypatch.setattr(child, "start", lambda: None)
    child._conn = Pipe()  # type: ignore[assignment]

    def receive(timeout: float, *, what: str) -> dict[str, Any]:
        assert (timeout, what) == (900.0, "the compile check")
        return decode(encode(isolation._compile(object(), sent[-1]["args"], "cpu")))

    monkeypatch.setattr(child, "_receive", receive)
    config = TrainConfig(micro_batch_size=8, grad_accum_steps=2)
    assert child.compare_compiled(config, memory_budget=GIB, timeout=900.0) == WINNING
    assert sent[0]["op"] == "compile" and asked == [(config, "cpu", GIB)]

    def fails(workload: Any, config: TrainConfig, **kwargs: Any) -> Any:
        raise RuntimeError("backend='inductor' raised: CppCompileError")

    monkeypatch.setattr("autotune.measurement.compiled.compare_compiled", fails)
    with pytest.raises(MeasurementFailed, match=r"^RuntimeError: backend='inductor' raised: CppCompileError$"):
        child.compare_compiled(config, memory_budget=None, timeout=900.0)


def test_the_flag_defaults_to_cuda_only() -> None:
    from autotune.search.study import _compile_wanted

    assert [_compile_wanted(None, "cuda"), _compile_wanted(None, "cpu")] == [True, False]
    assert [_compile_wanted(True, "cpu"), _compile_wanted(False, "cuda")] == [True, False]


@pytest.mark.slow
def test_a_one_trial_study_with_compile_check_stores_a_real_comparison(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real compile of the tiny workload in the measuring child: about a minute on 2 cores."""
    db = tmp_path / "s.db"
    args = ["study", f"{TINY_WORKLOAD}:build", "--trials", "1", "--storage", str(db), "--no-cache"]
    args += ["--steps", "2", "--warmup", "1", "--threads", "1", "--no-progress", "--no-memory-model"]
    assert main([*args, "--no-policy-proposal", "--compile-check", "--artifact-dir", str(tmp_path / "a")]) == 0
    printed = capsys.readouterr().out
    study = optuna.load_study(study_name="tiny", storage=f"sqlite:///{db}")
    pick = CompilePick.from_dict(study.user_attrs[COMPILE_CHECK])
    assert pick.trial == 0 and pick.check is not None, pick.reason
    assert pick.check.samples == 16 and pick.check.compile_seconds > 0
    assert pick.line in printed.splitlines()  # after the recommendation, in whole rows (not a terminal)


def _candidate(study: optuna.Study, number: int, value: float, spread: float = 0.0) -> Candidate:
    return Candidate(record=summarize(study).trials[number], value=value, spread=spread)


def _finalists_study(storage: str | None) -> optuna.Study:
    """Trial 0 (8 x 2) re-timed first at 100 samples/s per GiB, trial 1 (16 x 1, every block
    recomputed) second at 90: both at 1 GiB, so that a value per GiB is the samples/s."""
    study = _study(storage)
    config = TrainConfig(micro_batch_size=16, checkpoint=True)
    attrs = {ATTR.CONFIG: config.to_dict(), ATTR.STATUS: "ok", ATTR.THROUGHPUT: 90.0, ATTR.PEAK: GIB}
    study.add_trial(optuna.trial.create_trial(values=[90.0, 1024.0], user_attrs=attrs))
    for number, rate in ((0, 100.0), (1, 90.0)):
        retimed = {
            TRIAL_ATTRS.THROUGHPUT: rate,
            TRIAL_ATTRS.SPREAD: 0.01,
            TRIAL_ATTRS.PER_GIB: rate,
            TRIAL_ATTRS.RANK: number + 1,
            TRIAL_ATTRS.ROUNDS: 3,
            TRIAL_ATTRS.WITH: [0, 1],
        }
        set_finished_trial_attrs(study, number, retimed)
    study.set_user_attr(RETIMED, {"trials": [0, 1], "winner": 0, "decided": True, "rounds": 3, "note": None})
    return study


class _ByConfig(_Compare):
    """The comparison scripted per configuration (by its micro-batch)."""

    def __init__(self, replies: dict[int, CompileCheck | MeasurementFailed]) -> None:
        super().__init__(WINNING)
        self.replies = replies

    def __call__(self, config: TrainConfig) -> CompileCheck:
        self.reply = self.replies[config.micro_batch_size]
        return super().__call__(config)


SLOWER = _check((128.0, 128.0, 128.0), (119.0, 119.0, 119.0))  # 0.93x: the recommendation stays eager


def test_a_finalist_that_wins_compiled_becomes_the_recommendation_compiled(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    study = _finalists_study(f"sqlite:///{db}")
    finalists = [_candidate(study, 0, 100.0, 0.01), _candidate(study, 1, 90.0, 0.01)]
    compare = _ByConfig({8: SLOWER, 16: WINNING})
    notes: list[str] = []
    pick = check_recommendation(study, summarize(study).recommended, compare, note=notes.append, finalists=finalists)
    assert [c.micro_batch_size for c in compare.asked] == [8, 16]
    assert all(c.compile == "none" for c in compare.asked)
    assert notes == [
        "timing the recommendation (trial 0) eager and compiled side by side (torch.compile)",
        "timing finalist trial 1 eager and compiled side by side (torch.compile)",
    ]
    # Trial 0 stays eager (0.93x): 100; trial 1 compiled 2.00x: 180, beyond both spreads.
    assert pick == CompilePick(trial=1, check=WINNING, of=0, values=((0, 100.0, None), (1, 180.0, 2.0)))
    stored = study.user_attrs[COMPILE_CHECK]
    assert stored["of"] == 0 and stored["trial"] == 1 and stored["values"] == [[0, 100.0, None], [1, 180.0, 2.0]]
    summary = summarize(optuna.load_study(study_name="s", storage=f"sqlite:///{db}"))
    assert summary.recommended is not None and summary.recommended.number == 1
    assert summary.compile_pick == pick
    assert summary.recommended_config == TrainConfig(micro_batch_size=16, checkpoint=True, compile="default")
    assert pick.line == (
        f"{WINS}; under compile trial 1 beats the eager pick, trial 0: trial 0 100.0 per GiB (eager), "
        "trial 1 180.0 per GiB (compiled 2.00x)"
    )
    assert main(["best", "s", "--storage", str(db), "--format", "json", "--no-retime"]) == 0
    out, err = capsys.readouterr()
    assert TrainConfig.from_json(out) == TrainConfig(micro_batch_size=16, checkpoint=True, compile="default")
    assert err == f"autotune best: the recommendation compiled (default): {pick.line}\n"


def test_a_finalist_ahead_compiled_within_the_spreads_leaves_the_recommendation_and_a_failed_one_is_left_out() -> None:
    study = _finalists_study(None)
    # Trial 1 compiled, 1.13x beyond the noise: 101.7 against 100, their spreads 1% each: within them.
    near = _check((100.0, 100.0, 100.0), (113.0, 113.0, 113.0))
    finalists = [_candidate(study, 0, 100.0, 0.01), _candidate(study, 1, 90.0, 0.01)]
    pick = check_recommendation(
        study, summarize(study).recommended, _ByConfig({8: SLOWER, 16: near}), note=lambda _: None, finalists=finalists
    )
    assert pick is not None and pick.trial == 0 and pick.of is None and not pick.compiled
    assert pick.values == ((0, 100.0, None), (1, 90.0 * near.speedup, near.speedup))
    assert summarize(study).recommended_config == TrainConfig(micro_batch_size=8, grad_accum_steps=2)

    study = _finalists_study(None)
    notes: list[str] = []
    failed = MeasurementFailed("the compile check exceeded the time limit of 90 s")
    pick = check_recommendation(
        study, summarize(study).recommended, _ByConfig({8: WINNING, 16: failed}), note=notes.append, finalists=finalists
    )
    assert pick == CompilePick(trial=0, check=WINNING)
    assert notes[-1] == (
        "finalist trial 1 left out of the compiled choice: the comparison failed: the compile check exceeded "
        "the time limit of 90 s"
    )


def test_per_gib_a_compiled_peak_measured_in_the_check_counts_in_the_choice() -> None:
    light = dataclasses.replace(WINNING, eager_peak=2 * GIB, compiled_peak=GIB)  # 2x faster, half the memory
    heavy = dataclasses.replace(WINNING, eager_peak=GIB, compiled_peak=2 * GIB)  # 2x faster, twice the memory
    first, second = Candidate(record=None, value=100.0), Candidate(record=None, value=60.0)  # type: ignore[arg-type]
    assert compiled_value(second, light, "per-gib") == 240.0 and compiled_value(second, light, "throughput") == 120.0
    assert compiled_value(first, heavy, "per-gib") == 100.0
    assert compiled_choice([(first, heavy), (second, light)], "per-gib") == 1
    assert compiled_choice([(first, heavy), (second, light)], "throughput") == 0  # 200 against 120


@pytest.mark.parametrize("recipes", [(), ((1, "hf-bf16"),)], ids=["finalists", "with-a-recipe"])
def test_a_stored_check_reads_back_as_it_was_with_its_objective(recipes: tuple[tuple[int, str], ...]) -> None:
    pick = CompilePick(
        trial=1,
        check=WINNING,
        of=0,
        values=((0, 100.0, None), (1, 180.0, 2.0)),
        recipes=recipes,
        objective="throughput",
    )
    stored = json.loads(json.dumps(pick.to_dict()))  # as the study's storage keeps it
    assert stored["objective"] == "throughput" and ("recipes" in stored) == bool(recipes)
    assert CompilePick.from_dict(stored) == pick
    named = "trial 1 (the HF bf16-only recipe) 180.0 samples/s" if recipes else "trial 1 180.0 samples/s"
    assert pick.line.endswith(f"{named} (compiled 2.00x)")
