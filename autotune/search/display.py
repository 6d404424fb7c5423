"""What the user sees: a live progress display while a study runs, and the final tables.

Progress (stderr, on a terminal only): trials done / total, best throughput per GiB so far (or
best throughput, under the ``throughput`` objective), the
config being measured, elapsed and remaining time. Tables (stdout): the Pareto front, the
recommended configuration, and its improvement over each baseline, one line per row wherever they
are printed (see :mod:`autotune.console`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from autotune.config import TrainConfig
from autotune.console import make_console
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName, format_value
from autotune.search.baselines import COMPARED, recommended_line
from autotune.search.finalists import Finalist
from autotune.search.results import StudySummary
from autotune.search.study import StudyObserver, count_done
from autotune.search.trial_record import TrialRecord, trial_record
from autotune.units import format_bytes

if TYPE_CHECKING:
    import optuna

__all__ = ["ProgressDisplay", "config_summary", "summary_view"]


def config_summary(c: TrainConfig) -> str:
    """One line: ``micro x acc x ranks 8x4x1 | bf16 6/6 | ckpt 3/6 | ZeRO 0``."""
    return c.describe()


class ProgressDisplay(StudyObserver):
    """A rich progress bar over the study's counted trials (resumed ones included), on a terminal.

    Anywhere else (a file, a pipe, a CI log) nothing is drawn: a redrawn bar has no place in a log,
    and rich would print its last frame there. Notes (:meth:`note`) are printed either way.
    """

    def __init__(
        self,
        *,
        total: int,
        done: int,
        console: Console | None = None,
        objective: ObjectiveName = DEFAULT_OBJECTIVE,
    ) -> None:
        self.console = console or make_console(stderr=True)
        self.best: float | None = None
        self.objective = objective
        unit = "samples/s per GiB" if objective == "per-gib" else "samples/s"
        self.progress = Progress(
            TextColumn("[bold]trials"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(f"best {{task.fields[best]}} {unit}"),
            TimeElapsedColumn(),
            TextColumn("elapsed,"),
            TimeRemainingColumn(),
            TextColumn("left"),
            console=self.console,
        )
        self.task = self.progress.add_task("study", total=total, completed=done, best="-")
        self.now = Text("  now: starting the measurement process")
        self.live = Live(Group(self.progress, self.now), console=self.console, refresh_per_second=4)

    def __enter__(self) -> ProgressDisplay:
        if self.console.is_terminal:
            self.live.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if not self.live.is_started:
            return
        # Ctrl-C: erase the display, so the CLI's one line ("interrupted") is all that remains.
        self.live.transient = exc_type is KeyboardInterrupt
        self.live.stop()

    def note(self, message: str) -> None:
        self.console.print(message, markup=False, highlight=False)

    def trial_started(self, number: int, config: TrainConfig, baseline: str | None) -> None:
        self.now.plain = (
            f"  now: trial {number}" + (f" ({baseline})" if baseline else "") + f": {config_summary(config)}"
        )

    def trial_finished(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        r = trial_record(trial)
        value = r.under(self.objective)
        if r.feasible and value is not None and (self.best is None or value > self.best):
            self.best = value
        outcome = format_value(value, self.objective) if r.feasible and value else (r.reason or r.state.lower())
        self.progress.update(
            self.task, completed=count_done(study), best="-" if self.best is None else f"{self.best:.1f}"
        )
        self.now.plain = f"  last: trial {r.number} {r.state.lower()}: {outcome}"


def _num(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def _front_table(s: StudySummary) -> Table:
    t = Table(title=f"Pareto front of {s.name!r}: max {s.metric}, min peak memory")
    columns = ["trial", "micro x acc x ranks", "precision", "ckpt", "ZeRO", f"{s.metric}/s", "peak", "per GiB"]
    if s.retimed:  # the finalists' first measurement (per GiB) next to their re-timed one
        columns.append("re-timed per GiB")
    for col in (*columns, "note"):
        t.add_column(col, justify="left" if col in ("precision", "note") else "right")
    # Finalists behind the front too: the re-timing may recommend one the first stint ranked lower.
    behind = [r for r in s.trials if r.number in s.retimed and r not in s.front]
    for r in sorted((*s.front, *behind), key=lambda r: (r.peak_bytes or 0, r.number)):
        assert r.config is not None
        where = "finalist behind the front" if r in behind else None
        note = ", ".join(x for x in (r.baseline, where, r.number == _number(s.recommended) and "RECOMMENDED") if x)
        cells = [_num(r.objective), format_bytes(r.peak_bytes), _num(r.per_gib)]
        if s.retimed:
            f = s.retimed.get(r.number)
            cells.append("-" if f is None else f"{_num(f.retimed_per_gib)} ±{f.retimed_spread:.0%}")
        t.add_row(str(r.number), *r.config.knob_cells(), *cells, note)
    return t


def _number(r: TrialRecord | None) -> int | None:
    return None if r is None else r.number


def _finalists_table(s: StudySummary) -> Table | None:
    if not s.retimed:
        return None
    t = Table(title="finalists re-timed side by side (median of interleaved rounds)")
    for col in ("trial", "first samples/s", "re-timed samples/s", "spread", "re-timed per GiB", "rank"):
        t.add_column(col, justify="right")
    for f in sorted(s.retimed.values(), key=lambda f: f.rank):
        t.add_row(
            str(f.trial),
            _num(f.first_throughput),
            _num(f.retimed_throughput),
            f"{f.retimed_spread:.1%}",
            _num(f.retimed_per_gib),
            "WINNER" if f.rank == 0 else str(f.rank + 1),
        )
    return t


def _improvement_table(s: StudySummary) -> Table:
    t = Table(title="recommended / baseline")
    for col in ("baseline", "trial", s.metric, "peak", "per GiB", "baseline per GiB", "timed"):
        t.add_column(col, justify="left" if col in ("baseline", "timed") else "right")
    for name, b in s.baselines.items():
        i = s.improvement(name)
        if i is None:
            # A baseline the study has not reached yet (fewer trials than baselines) is not infeasible.
            why = "not run yet" if b.state in ("WAITING", "RUNNING") else f"infeasible: {b.reason or b.state.lower()}"
            t.add_row(name, str(b.number), "-", "-", "-", why, "-")
            continue
        t.add_row(
            name,
            str(i.trial),
            f"{i.throughput:.2f}x",
            f"{i.peak_memory:.2f}x",
            f"{i.per_gib:.2f}x",
            _num(s.retimed[b.number].retimed_per_gib if i.side_by_side else b.per_gib),
            "side by side" if i.side_by_side else "first measurements",
        )
    return t


def _recommended_line(r: TrialRecord | None, s: StudySummary) -> str:
    if r is None or r.config is None:
        return "no feasible trial yet: nothing to recommend"
    # A recipe users run without autotune, recommended: named, and not compared with itself.
    recipe = dict(COMPARED).get(r.baseline or "")
    ratios = {
        name: None if (i := s.improvement(name)) is None else i.per_gib if s.objective == "per-gib" else i.throughput
        for name, b in s.baselines.items()
        if b.state not in ("WAITING", "RUNNING")  # not measured yet: neither compared nor infeasible
        and name != r.baseline
    }
    line = recommended_line(
        f"trial {r.number}" if recipe is None else f"trial {r.number}, the {recipe}",
        config_summary(r.config),
        throughput=r.objective,
        peak_bytes=r.peak_bytes,
        per_gib=r.per_gib,
        objective=s.objective,
        ratios=ratios,
        side_by_side={i.baseline for i in s.improvements if i.side_by_side},
    )
    f = s.retimed.get(r.number)
    if f is not None:
        retimed = (
            f"{_num(f.retimed_per_gib)} per GiB"
            if s.objective == "per-gib"
            else f"{_num(f.retimed_throughput)} samples/s"
        )
        line += f"; re-timed side by side: {retimed} (spread {f.retimed_spread:.1%})"
        if recipe is not None:
            line += _searched_beside(f, s)
    return line


def _searched_beside(recommended: Finalist, s: StudySummary) -> str:
    """Where a recipe users run is recommended: what the best configuration re-timed beside it
    that is none of those recipes is of it (as ``tune`` says its best step of a recommended
    baseline), or nothing where none was; under compile where the compile check made the recipe
    the recommendation (its values are then the finalists' under compile)."""
    recipes = {name for name, _ in COMPARED}
    per = s.objective == "per-gib"
    pick = s.compile_pick
    compiled = pick is not None and pick.of is not None and pick.trial == recommended.trial
    if pick is not None and compiled:
        values = {n: v for n, v, _ in pick.values}
    else:
        values = {n: f.retimed_per_gib if per else f.retimed_throughput for n, f in s.retimed.items()}
    others = [n for n in values if n != recommended.trial and _trial(s, n).baseline not in recipes]
    if not others:
        return ""
    best = max(others, key=lambda n: (values[n], -n))
    return (
        f"; the best other configuration, trial {best}, is {values[best] / values[recommended.trial]:.2f}x "
        f"of it {'per GiB' if per else 'samples/s'}{' under compile' if compiled else ''}, timed side by side"
    )


def _trial(s: StudySummary, number: int) -> TrialRecord:
    return next(r for r in s.trials if r.number == number)


def summary_view(s: StudySummary) -> Group:
    """The final report: front table, baselines table, the recommended line (and its compile
    check's), trial counts."""
    states = ", ".join(f"{n} {k.lower()}" for k, n in sorted(s.states.items()))
    compiled = None if s.compile_pick is None else s.compile_pick.line
    parts = [
        _front_table(s),
        _finalists_table(s),
        _improvement_table(s),
        _recommended_line(s.recommended, s),
        compiled,
    ]
    return Group(*(p for p in parts if p is not None), f"trials: {states}")
