"""The study's finalists re-timed side by side: the figures go on each finalist's trial (where the
dashboard and ``autotune best --format json`` show them), the winner is recommended, and the
tables show the first and the re-timed measurement. Scripted re-timings (never the wall clock)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from rich.console import Console

from autotune.cli.main import main
from autotune.config import TrainConfig
from autotune.measurement.sidebyside import Retimed, Timing
from autotune.search.display import summary_view
from autotune.search.finalists import (
    RETIMED,
    TRIAL_ATTRS,
    retime_finalists,
    set_finished_trial_attrs,
    standing,
    to_retime,
)
from autotune.search.results import summarize
from autotune.search.spec import StudySpec, spec_to_dict
from autotune.search.trial_record import ATTR, trial_record

GIB = 1024**3


def _study(storage: str | None) -> optuna.Study:
    study = optuna.create_study(study_name="s", storage=storage, directions=["maximize", "minimize"])
    # per GiB (throughput / 1 GiB): 100, 98, 96, 50: three finalists, the fourth left out
    for micro, rate in ((8, 100.0), (4, 98.0), (2, 96.0), (1, 50.0)):
        config = TrainConfig(micro_batch_size=micro, grad_accum_steps=16 // micro)
        attrs = {ATTR.CONFIG: config.to_dict(), ATTR.STATUS: "ok", ATTR.THROUGHPUT: rate, ATTR.PEAK: GIB}
        study.add_trial(optuna.trial.create_trial(values=[rate, 1024.0], user_attrs=attrs))
    return study


def _retimer(configs: list[TrainConfig], scales: list[float]) -> Retimed:
    # Re-timed, trial 1 (micro-batch 4) is the fastest: 110 samples/s against 90 and 95.
    assert [c.micro_batch_size for c in configs] == [8, 4, 2] and scales == [1 / GIB * GIB / 1] * 3
    return Retimed(
        timings=(Timing(rates=(90.0, 92.0, 88.0)), Timing(rates=(110.0, 111.0, 109.0)), Timing(rates=(95.0,) * 3)),
        ranking=(1, 2, 0),
        decided=True,
        rounds=3,
        warmup=(2, 2, 2),
        other_cores=0.0,
    )


@pytest.mark.parametrize("on_disk", [True, False], ids=["sqlite", "in-memory"])
def test_the_figures_go_on_each_finalists_trial(tmp_path: Path, on_disk: bool) -> None:
    storage = f"sqlite:///{tmp_path / 's.db'}" if on_disk else None
    study = _study(storage)
    record = retime_finalists(study, _retimer, threads=1)
    assert record == {"trials": [0, 1, 2], "winner": 1, "decided": True, "rounds": 3, "note": None}
    assert study.user_attrs[RETIMED] == record
    studies = [study] + ([optuna.load_study(study_name="s", storage=storage)] if storage else [])
    for s in studies:  # this process's (cached) trials, and another process's view of the storage
        attrs = [t.user_attrs for t in s.get_trials()]
        assert [a.get(TRIAL_ATTRS.THROUGHPUT) for a in attrs] == [90.0, 110.0, 95.0, None]
        assert [a.get(TRIAL_ATTRS.RANK) for a in attrs] == [3, 1, 2, None]
        assert attrs[1][TRIAL_ATTRS.SPREAD] == 1.0 / 110.0
        assert attrs[1][TRIAL_ATTRS.PER_GIB] == 110.0
        assert (attrs[1][TRIAL_ATTRS.ROUNDS], attrs[1][TRIAL_ATTRS.WITH]) == (3, [0, 1, 2])
        assert attrs[1][ATTR.THROUGHPUT] == 98.0  # the first measurement stays
        summary = summarize(s)
        assert summary.recommended is not None and summary.recommended.number == 1
        assert (summary.retimed[1].first_throughput, summary.retimed[1].retimed_throughput) == (98.0, 110.0)
        assert summary.retimed_decided is True
    assert to_retime(study) == []  # these finalists are done: best does not re-time them again


def test_the_tables_show_the_first_and_the_re_timed_measurement() -> None:
    study = _study(None)
    retime_finalists(study, _retimer, threads=1)
    console = Console(record=True, width=200)
    console.print(summary_view(summarize(study)))
    text = console.export_text()
    assert "re-timed per GiB" in text
    row = next(line for line in text.splitlines() if "RECOMMENDED" in line)
    assert "98.0" in row and "110.0 ±1%" in row
    finalists = [line for line in text.splitlines() if "WINNER" in line]
    assert len(finalists) == 1 and "98.0" in finalists[0] and "110.0" in finalists[0]


def test_best_json_carries_the_re_timed_figures_and_stays_a_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    study = _study(f"sqlite:///{db}")
    study.set_user_attr("blocks", ["blocks.0", "blocks.1"])
    study.set_user_attr("largest_parameter", 64)
    retime_finalists(study, _retimer, threads=1)
    assert main(["best", "s", "--storage", str(db), "--format", "json"]) == 0
    out = capsys.readouterr().out
    assert TrainConfig.from_json(out).micro_batch_size == 4  # still a --config file
    assert json.loads(out)["measured"] == {
        "study": "s",
        "trial": 1,
        "throughput": 98.0,
        "metric": "throughput",
        "objective": 98.0,
        "peak_bytes": GIB,
        "per_gib": 98.0,
        "recommended_for": "per-gib",
        "retimed": {
            "throughput": 110.0,
            "spread": 1.0 / 110.0,
            "per_gib": 110.0,
            "rank": 1,
            "rounds": 3,
            "with": [0, 1, 2],
            "decided": True,
        },
    }


def test_a_trial_beaten_side_by_side_is_no_finalist_ahead_of_the_one_that_beat_it() -> None:
    # Seen on unet-tiny (AVX2): the refinement's duels showed trials 9 and 10 worse than trial 2,
    # yet their lucky first stints made them finalists and trial 2 was never re-timed.
    study = _study(None)
    for number in (0, 2):  # 100 and 96 per GiB first, both beaten by trial 3 (50 first)
        set_finished_trial_attrs(study, number, {ATTR.BEATEN_BY: 3})
    # Trial 3 ranks as the best trial it beat (100 per GiB), trial 1 next.
    assert [r.number for r in to_retime(study)] == [3, 1]
    configs_seen: list[list[int]] = []

    def retimer(configs: list[TrainConfig], scales: list[float]) -> Retimed:
        configs_seen.append([c.micro_batch_size for c in configs])
        return Retimed(
            timings=(Timing(rates=(120.0,) * 3), Timing(rates=(90.0,) * 3)),
            ranking=(0, 1),
            decided=True,
            rounds=3,
            warmup=(2, 2),
            other_cores=0.0,
        )

    record = retime_finalists(study, retimer, threads=1)
    assert configs_seen == [[1, 4]] and record is not None and record["winner"] == 3
    summary = summarize(study)
    assert summary.recommended is not None and summary.recommended.number == 3


def test_a_duel_too_close_to_call_leaves_the_loser_a_finalist_behind_its_winner() -> None:
    study = _study(None)  # per GiB first: 100, 98, 96, 50
    # Trial 3 (50 first) beat trial 0 (100) within their spreads, and trial 1 (98) beyond them.
    set_finished_trial_attrs(study, 0, {ATTR.BEATEN_BY: 3, ATTR.BEATEN_DECIDED: False})
    set_finished_trial_attrs(study, 1, {ATTR.BEATEN_BY: 3, ATTR.BEATEN_DECIDED: True})
    # Trial 3 ranks as the trial it beat (100), ahead of it; trial 1 is out; trial 2 is third.
    assert [r.number for r in to_retime(study)] == [3, 0, 2]
    # A winner beaten in turn passes its rank on: trial 2 beat trial 3 (too close to call).
    set_finished_trial_attrs(study, 3, {ATTR.BEATEN_BY: 2, ATTR.BEATEN_DECIDED: False})
    assert [r.number for r in to_retime(study)] == [2, 3, 0]


def test_the_standing_passes_a_beaten_trial_s_value_up_the_chain_of_duels_and_ends_on_a_cycle() -> None:
    study = _study(None)  # per GiB first: 100, 98, 96, 50
    set_finished_trial_attrs(study, 0, {ATTR.BEATEN_BY: 3})  # 3 (50) beat 0 (100)
    set_finished_trial_attrs(study, 3, {ATTR.BEATEN_BY: 2})  # 2 (96) beat 3
    records = tuple(trial_record(t) for t in study.trials)
    assert standing(records) == {0: 100.0, 1: 98.0, 2: 100.0, 3: 100.0}
    set_finished_trial_attrs(study, 2, {ATTR.BEATEN_BY: 0})  # a cycle: 0 beat 2 in turn
    assert standing(tuple(trial_record(t) for t in study.trials)) == {0: 100.0, 1: 98.0, 2: 100.0, 3: 100.0}


def test_under_throughput_the_finalists_are_the_fastest_and_the_winner_the_fastest_re_timed() -> None:
    study = _study(None)  # per GiB and samples/s: 100, 98, 96, 50 (all at 1 GiB)
    config = TrainConfig(micro_batch_size=16)
    attrs = {ATTR.CONFIG: config.to_dict(), ATTR.STATUS: "ok", ATTR.THROUGHPUT: 200.0, ATTR.PEAK: 4 * GIB}
    study.add_trial(optuna.trial.create_trial(values=[200.0, 4096.0], user_attrs=attrs))  # 50 per GiB
    assert [r.number for r in to_retime(study)] == [0, 1, 2]  # per GiB: trial 4 is no finalist
    study.set_user_attr("spec", spec_to_dict(StudySpec(workload="tiny", objective="throughput")))
    assert [r.number for r in to_retime(study)] == [4, 0, 1]  # the fastest three
    seen: list[list[float]] = []

    def retimer(configs: list[TrainConfig], scales: list[float]) -> Retimed:
        seen.append(scales)  # samples/s ranked as they are: no division by the peak
        return Retimed(
            timings=(Timing(rates=(180.0,) * 3), Timing(rates=(120.0,) * 3), Timing(rates=(90.0,) * 3)),
            ranking=(0, 1, 2),
            decided=True,
            rounds=3,
            warmup=(2, 2, 2),
            other_cores=0.0,
        )

    record = retime_finalists(study, retimer, threads=1)
    assert seen == [[1.0, 1.0, 1.0]] and record is not None and record["winner"] == 4
    # The re-timed value per GiB is stored either way: 180 samples/s at 4 GiB.
    assert study.trials[4].user_attrs[TRIAL_ATTRS.PER_GIB] == 45.0
    summary = summarize(study)
    assert summary.recommended is not None and (summary.objective, summary.recommended.number) == ("throughput", 4)
    console = Console(record=True, width=300)
    console.print(summary_view(summary))
    line = next(x for x in console.export_text().splitlines() if x.startswith("recommended for"))
    assert line.endswith("re-timed side by side: 180.0 samples/s (spread 0.0%)")


def test_best_says_a_recommendation_is_for_throughput(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "s.db"
    study = _study(f"sqlite:///{db}")
    study.set_user_attr("blocks", ["blocks.0", "blocks.1"])
    study.set_user_attr("largest_parameter", 64)
    study.set_user_attr("spec", spec_to_dict(StudySpec(workload="tiny", objective="throughput")))
    out, err = {}, {}
    for fmt in ("json", "deepspeed", "python"):
        assert main(["best", "s", "--storage", str(db), "--format", fmt, "--no-retime"]) == 0
        out[fmt], err[fmt] = capsys.readouterr()
    assert json.loads(out["json"])["measured"]["recommended_for"] == "throughput"
    note = "recommended for the most samples/s within the memory budget (objective throughput), not per GiB"
    assert err["deepspeed"].splitlines()[1] == f"autotune best: {note}"
    assert f"Objective: {note}.\n" in out["python"]
    assert err["json"] == err["python"] == ""


def _with_baselines() -> optuna.Study:
    """:func:`_study` and two baselines: the PyTorch default (trial 4, 20 per GiB first) and the
    HF recipe (trial 5, 90 per GiB first: no finalist by its first stint)."""
    study = _study(None)  # per GiB first: 100, 98, 96, 50
    for name, config, rate, peak in (
        ("pytorch-default", TrainConfig(micro_batch_size=16), 40.0, 2 * GIB),  # 20 per GiB
        ("hf-recipe", TrainConfig(micro_batch_size=16, precision="bf16", checkpoint=True), 90.0, GIB),
    ):
        attrs = {
            ATTR.CONFIG: config.to_dict(),
            ATTR.STATUS: "ok",
            ATTR.THROUGHPUT: rate,
            ATTR.PEAK: peak,
            ATTR.BASELINE: name,
        }
        study.add_trial(optuna.trial.create_trial(values=[rate, peak / 2**20], user_attrs=attrs))
    return study


def _retimer_of(rates: tuple[float, ...]) -> Callable[[list[TrainConfig], list[float]], Retimed]:
    def retimer(configs: list[TrainConfig], scales: list[float]) -> Retimed:
        assert scales == [1.0, 1.0, 1.0, 0.5, 1.0]  # per GiB of each one's measured peak
        values = [r * s for r, s in zip(rates, scales, strict=True)]
        return Retimed(
            timings=tuple(Timing(rates=(r,) * 3) for r in rates),
            ranking=tuple(sorted(range(len(rates)), key=lambda i: -values[i])),
            decided=False,
            rounds=3,
            warmup=(2,) * len(rates),
            other_cores=0.0,
        )

    return retimer


def _line(study: optuna.Study) -> str:
    console = Console(record=True, width=400)
    console.print(summary_view(summarize(study)))
    return next(x for x in console.export_text().splitlines() if x.startswith("recommended:"))


def test_the_compared_baselines_are_re_timed_beside_the_best_and_their_ratios_are_side_by_side() -> None:
    # Seen on hf-llama (Xeon): the HF recipe's first stint 36.1 samples/s, 51.1 re-timed, and the
    # recommendation claimed 1.41x it per GiB from first measurements; side by side it was 1.02x.
    study = _with_baselines()
    assert [r.number for r in to_retime(study)] == [0, 1, 2, 4, 5]  # the best three, then the baselines
    notes: list[str] = []
    record = retime_finalists(study, _retimer_of((90.0, 110.0, 95.0, 30.0, 100.0)), threads=1, note=notes.append)
    assert record is not None and (record["trials"], record["winner"]) == ([0, 1, 2, 4, 5], 1)
    assert notes == [
        "re-timing the 3 best configurations side by side (trials [0, 1, 2]), with the baselines compared: "
        "pytorch-default (trial 4), hf-recipe (trial 5)"
    ]
    summary = summarize(study)
    assert summary.recommended is not None and summary.recommended.number == 1
    default, recipe = summary.improvement("pytorch-default"), summary.improvement("hf-recipe")
    assert default is not None and recipe is not None
    # 110 / 30 samples/s; per GiB 110 / (30 / 2 GiB); the peaks are the trials' own.
    assert (default.throughput, default.per_gib, default.peak_memory, default.side_by_side) == (
        110 / 30,
        110 / 15,
        0.5,
        True,
    )
    assert (recipe.throughput, recipe.per_gib, recipe.side_by_side) == (1.1, 1.1, True)
    assert "(7.33x the PyTorch default and 1.10x the HF recipe per GiB, timed side by side)" in _line(study)
    console = Console(record=True, width=250)
    console.print(summary_view(summary))
    text = console.export_text()
    row = next(x for x in text.splitlines() if "│ hf-recipe" in x and "side by side" in x)
    assert "1.10x" in row and "100.0" in row  # the baseline's re-timed per GiB beside its ratio
    # Its first stint (90 per GiB) would have read 98 / 90 = 1.09x: not the figure shown.
    assert "1.09x" not in row


def test_a_recipe_that_wins_the_re_timing_is_recommended_by_name_with_what_the_search_found_of_it() -> None:
    study = _with_baselines()
    retime_finalists(study, _retimer_of((90.0, 110.0, 95.0, 30.0, 120.0)), threads=1)
    summary = summarize(study)
    assert summary.recommended is not None and summary.recommended.number == 5
    assert _line(study) == (
        "recommended: trial 5, the HF recipe: micro x acc x ranks 16x1x1 | bf16 | ckpt all | ZeRO 0: 90.0 samples/s, "
        "peak 1 GiB, 90.0 samples/s per GiB (8.00x the PyTorch default per GiB, timed side by side); re-timed side "
        "by side: 120.0 per GiB (spread 0.0%); the best other configuration, trial 1, is 0.92x of it per GiB, "
        "timed side by side"
    )


def test_the_compile_check_times_as_many_re_timed_configurations_as_the_finalists_best_first() -> None:
    from autotune.search.compile_pick import candidates

    study = _with_baselines()
    retime_finalists(study, _retimer_of((90.0, 110.0, 95.0, 30.0, 120.0)), threads=1)
    chosen = candidates(summarize(study))  # five re-timed: the recipe first, the default last
    assert [(c.record.number, c.value, c.spread) for c in chosen] == [(5, 120.0, 0.0), (1, 110.0, 0.0), (2, 95.0, 0.0)]


def test_the_compile_check_times_the_hf_recipe_re_timed_beside_the_finalists_whatever_its_eager_rank() -> None:
    from autotune.search.compile_pick import candidates

    study = _with_baselines()
    # Per GiB side by side: trial 1 110, trial 2 95, trial 0 90, the recipe 80, the default 15.
    retime_finalists(study, _retimer_of((90.0, 110.0, 95.0, 30.0, 80.0)), threads=1)
    chosen = candidates(summarize(study))
    assert [(c.record.number, c.value) for c in chosen] == [(1, 110.0), (2, 95.0), (0, 90.0), (5, 80.0)]
    assert chosen[-1].record.baseline == "hf-recipe"  # compiled too; the PyTorch default (15) is not


def test_a_recipe_that_wins_compiled_is_recommended_compiled_by_name() -> None:
    from autotune.measurement.compiled import CompileCheck
    from autotune.search.compile_pick import candidates, check_recommendation

    def check(speedup: float) -> CompileCheck:
        return CompileCheck(
            mode="default",
            eager=Timing(rates=(100.0,) * 3),
            compiled=Timing(rates=(100.0 * speedup,) * 3),
            samples=16,
            warmup_seconds=(20.0, 0.1),
            eager_peak=None,
            compiled_peak=None,
            rounds=3,
        )

    study = _with_baselines()
    retime_finalists(study, _retimer_of((90.0, 110.0, 95.0, 30.0, 80.0)), threads=1)
    summary = summarize(study)
    asked: list[TrainConfig] = []

    def compare(config: TrainConfig) -> CompileCheck:
        asked.append(config)
        return check(2.0 if config.checkpoint else 0.9)  # only the recipe recomputes: it gains 2x

    notes: list[str] = []
    pick = check_recommendation(study, summary.recommended, compare, note=notes.append, finalists=candidates(summary))
    assert [c.micro_batch_size for c in asked] == [4, 2, 8, 16]  # trials 1, 2, 0, then the recipe
    assert notes[-1] == "timing the HF recipe (trial 5) eager and compiled side by side (torch.compile)"
    # The recipe: 80 per GiB eager, 160 compiled, against the eager pick's 110 (0.9x: not compiled).
    assert pick is not None and (pick.trial, pick.of, pick.compiled, pick.recipes) == (5, 1, True, ((5, "hf-recipe"),))
    assert pick.line.endswith(
        "under compile trial 5 beats the eager pick, trial 1: trial 1 110.0 per GiB (eager), trial 2 95.0 per GiB "
        "(eager), trial 0 90.0 per GiB (eager), trial 5 (the HF recipe) 160.0 per GiB (compiled 2.00x)"
    )
    after = summarize(study)
    assert after.compile_pick == pick  # as stored on the study and read back
    assert after.recommended is not None and after.recommended.baseline == "hf-recipe"
    assert after.recommended_config == TrainConfig(
        micro_batch_size=16, precision="bf16", checkpoint=True, compile="default"
    )
    line = _line(study)
    assert line.startswith("recommended: trial 5, the HF recipe: ")
    # Of it under compile (110 eager against 160), not eager (110 against 80: 1.38x).
    assert line.endswith(
        "; the best other configuration, trial 1, is 0.69x of it per GiB under compile, timed side by side"
    )
