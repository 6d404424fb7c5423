"""The one-line config summary of the progress display and tables."""

from __future__ import annotations

import io

import optuna
from rich.console import Console

from autotune.config import TrainConfig
from autotune.search.display import ProgressDisplay, config_summary
from autotune.search.trial_record import ATTR


def test_uniform_knobs() -> None:
    config = TrainConfig(micro_batch_size=8, grad_accum_steps=4, precision="bf16", checkpoint=True)
    assert config_summary(config) == "micro x acc x ranks 8x4x1 | bf16 | ckpt all | ZeRO 0"


def test_per_block_knobs_count_blocks() -> None:
    config = TrainConfig(
        micro_batch_size=2, grad_accum_steps=8, precision=("bf16", "fp32", "bf16"), checkpoint=(True, False, False)
    )
    assert config_summary(config) == "micro x acc x ranks 2x8x1 | bf16 2/3 | ckpt 1/3 | ZeRO 0"


def test_the_progress_shows_the_best_by_the_study_s_objective() -> None:
    study = optuna.create_study(directions=["maximize", "minimize"])
    for micro, rate, gib in ((2, 100.0, 1), (4, 150.0, 2)):  # 100 and 75 per GiB
        attrs = {
            ATTR.CONFIG: TrainConfig(micro_batch_size=micro).to_dict(),
            ATTR.STATUS: "ok",
            ATTR.THROUGHPUT: rate,
            ATTR.PEAK: gib * 2**30,
        }
        study.add_trial(optuna.trial.create_trial(values=[rate, gib * 1024.0], user_attrs=attrs))
    shown = {}
    for objective in ("per-gib", "throughput"):
        display = ProgressDisplay(total=2, done=0, console=Console(file=io.StringIO()), objective=objective)  # type: ignore[arg-type]
        for trial in study.trials:
            display.trial_finished(study, trial)
        shown[objective] = (display.best, display.now.plain)
    assert shown == {
        "per-gib": (100.0, "  last: trial 1 complete: 75.0 per GiB"),
        "throughput": (150.0, "  last: trial 1 complete: 150.0 samples/s"),
    }
