"""Output a person reads off a terminal: whole table rows in a file or a CI log, no live progress."""

from __future__ import annotations

import io

from autotune.config import TrainConfig
from autotune.console import OFF_TERMINAL_WIDTH, make_console
from autotune.search.display import ProgressDisplay, summary_view
from autotune.search.finalists import Finalist
from autotune.search.results import Improvement, StudySummary
from autotune.search.trial_record import TrialRecord

MIB = 2**20


def _trial(number: int, config: TrainConfig, throughput: float, peak: int, baseline: str | None) -> TrialRecord:
    return TrialRecord(
        number=number,
        state="COMPLETE",
        config=config,
        baseline=baseline,
        status="ok",
        reason=None,
        throughput=throughput,
        objective=throughput,
        peak_bytes=peak,
        memory=None,
        noise_scale=None,
        efficiency=None,
        feasible=True,
    )


def _summary() -> StudySummary:
    default = _trial(0, TrainConfig(micro_batch_size=32), 1500.0, 129 * MIB, "pytorch-default")
    best = _trial(
        5,
        TrainConfig(micro_batch_size=8, grad_accum_steps=4, precision=("bf16", "fp32", "bf16"), checkpoint=True),
        1380.5,
        int(22.48 * MIB),
        None,
    )
    return StudySummary(
        name="gpt-tiny",
        trials=(default, best),
        front=(best, default),
        recommended=best,
        baselines={"pytorch-default": default},
        improvements=(
            Improvement(baseline="pytorch-default", trial=0, throughput=0.92, peak_memory=0.17, per_gib=5.27),
        ),
        states={"COMPLETE": 2},
        metric="throughput",
        retimed={
            5: Finalist(
                trial=5,
                first_throughput=1380.5,
                retimed_throughput=1371.0,
                retimed_spread=0.012,
                retimed_per_gib=62450.3,
                rank=0,
                rounds=5,
            )
        },
    )


def test_off_a_terminal_the_study_tables_keep_one_line_per_row() -> None:
    out = io.StringIO()
    console = make_console(file=out)
    assert (console.is_terminal, console.width) == (False, OFF_TERMINAL_WIDTH)
    console.print(summary_view(_summary()))
    # rich pads a table's title to the table's width with spaces: the only trailing ones.
    assert [line.rstrip() for line in out.getvalue().splitlines()] == EXPECTED
    assert out.getvalue().endswith("trials: 2 complete\n")


EXPECTED = [
    "                                    Pareto front of 'gpt-tiny': max throughput, min peak memory",
    "┏━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━┳━━━━━━┳━━━━━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━┓",
    "┃ trial ┃ micro x acc x ranks ┃ precision ┃ ckpt ┃ ZeRO ┃ throughput/s ┃      peak ┃ per GiB ┃ re-timed per GiB ┃ note            ┃",  # noqa: E501
    "┡━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━╇━━━━━━╇━━━━━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━┩",
    "│     5 │               8x4x1 │ bf16 2/3  │  all │    0 │       1380.5 │ 22.48 MiB │ 62884.0 │      62450.3 ±1% │ RECOMMENDED     │",  # noqa: E501
    "│     0 │              32x1x1 │ fp32      │ none │    0 │       1500.0 │   129 MiB │ 11907.0 │                - │ pytorch-default │",  # noqa: E501
    "└───────┴─────────────────────┴───────────┴──────┴──────┴──────────────┴───────────┴─────────┴──────────────────┴─────────────────┘",
    "           finalists re-timed side by side (median of interleaved rounds)",
    "┏━━━━━━━┳━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━━━━━━━━━━┳━━━━━━━━┓",
    "┃ trial ┃ first samples/s ┃ re-timed samples/s ┃ spread ┃ re-timed per GiB ┃   rank ┃",
    "┡━━━━━━━╇━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━━━━━━━━━╇━━━━━━━━┩",
    "│     5 │          1380.5 │             1371.0 │   1.2% │          62450.3 │ WINNER │",
    "└───────┴─────────────────┴────────────────────┴────────┴──────────────────┴────────┘",
    "                                      recommended / baseline",
    "┏━━━━━━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━━━━┳━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━━━━━━━┳━━━━━━━━━━━━━━━━━━━━┓",
    "┃ baseline        ┃ trial ┃ throughput ┃  peak ┃ per GiB ┃ baseline per GiB ┃ timed              ┃",
    "┡━━━━━━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━╇━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━━━━━━━╇━━━━━━━━━━━━━━━━━━━━┩",
    "│ pytorch-default │     0 │      0.92x │ 0.17x │   5.27x │          11907.0 │ first measurements │",
    "└─────────────────┴───────┴────────────┴───────┴─────────┴──────────────────┴────────────────────┘",
    # one line, as long as it is: a log is read with its lines whole
    "recommended: trial 5: micro x acc x ranks 8x4x1 | bf16 2/3 | ckpt all | ZeRO 0: 1380.5 samples/s, "
    "peak 22.48 MiB, 62884.0 samples/s per GiB (5.27x the PyTorch default per GiB); "
    "re-timed side by side: 62450.3 per GiB (spread 1.2%)",
    "trials: 2 complete",
]


def test_off_a_terminal_the_progress_display_draws_nothing_but_its_notes() -> None:
    out = io.StringIO()
    with ProgressDisplay(total=4, done=0, console=make_console(file=out)) as display:
        assert not display.live.is_started
        display.trial_started(0, TrainConfig(micro_batch_size=32), "pytorch-default")
        display.note("cache: 1 trial measured before")
    assert out.getvalue() == "cache: 1 trial measured before\n"


def _recommended_line(summary: StudySummary) -> str:
    out = io.StringIO()
    make_console(file=out).print(summary_view(summary))
    return next(line for line in out.getvalue().splitlines() if line.startswith("recommended:"))


def test_the_recommendation_says_how_it_compares_with_the_pytorch_default_and_the_hf_recipe() -> None:
    import dataclasses

    summary = _summary()
    recipe = _trial(
        1,
        TrainConfig(micro_batch_size=32, precision="bf16", outer_precision="bf16", checkpoint=True),
        1400.0,
        30 * MIB,
        "hf-recipe",
    )
    versus = Improvement(baseline="hf-recipe", trial=1, throughput=0.99, peak_memory=0.75, per_gib=1.31)
    both = dataclasses.replace(
        summary,
        baselines={**summary.baselines, "hf-recipe": recipe},
        improvements=(*summary.improvements, versus),
        retimed={},
    )
    assert _recommended_line(both) == (
        "recommended: trial 5: micro x acc x ranks 8x4x1 | bf16 2/3 | ckpt all | ZeRO 0: 1380.5 samples/s, "
        "peak 22.48 MiB, 62884.0 samples/s per GiB (5.27x the PyTorch default and 1.31x the HF recipe per GiB)"
    )
    infeasible = dataclasses.replace(
        both,
        baselines={**summary.baselines, "hf-recipe": dataclasses.replace(recipe, feasible=False)},
        improvements=summary.improvements,
    )
    assert _recommended_line(infeasible) == (
        "recommended: trial 5: micro x acc x ranks 8x4x1 | bf16 2/3 | ckpt all | ZeRO 0: 1380.5 samples/s, "
        "peak 22.48 MiB, 62884.0 samples/s per GiB (5.27x the PyTorch default per GiB); "
        "the HF recipe (bf16 + checkpointing) was infeasible"
    )


def test_brackets_in_a_line_are_printed_not_taken_for_markup() -> None:
    # rich would read "[dashboard]" as a style tag and drop it from the install command.
    out = io.StringIO()
    make_console(file=out).print("note: pip install 'torch-autotune[dashboard]' (blocks [0, 4])")
    assert out.getvalue() == "note: pip install 'torch-autotune[dashboard]' (blocks [0, 4])\n"


def test_a_baseline_the_study_has_not_reached_is_not_run_yet_not_infeasible() -> None:
    import dataclasses

    summary = _summary()
    waiting = dataclasses.replace(
        _trial(3, TrainConfig(micro_batch_size=16), 0.0, 0, "policy"), state="WAITING", throughput=None, feasible=False
    )
    out = io.StringIO()
    make_console(file=out).print(summary_view(dataclasses.replace(summary, baselines={"policy": waiting})))
    row = next(line for line in out.getvalue().splitlines() if line.startswith("│ policy"))
    assert [cell.strip() for cell in row.split("│")[1:-1]] == ["policy", "3", "-", "-", "-", "not run yet", "-"]
