"""Whether the study's recommendation is compiled: it timed eager and ``torch.compile``-d side by side.

After the finalists' re-timing (:mod:`autotune.search.finalists`) the recommended configuration
is timed both ways in the measuring child
(:meth:`autotune.procs.isolation.MeasurementProcess.compare_compiled`, over
:func:`autotune.measurement.compiled.compare_compiled`). The outcome goes on the study as one user
attribute (:data:`COMPILE_CHECK`: the trial it is of, and the check or why there is none), where
the summary, ``autotune best`` and the exports read it: compile is part of the recommendation only
when the check recommends it (faster beyond both spreads, its peak within the budget); otherwise
the recommendation stays eager and one line says why.

Where the finalists were re-timed side by side, each of them is timed eager and compiled too:
compiling speeds configurations up by different factors (``benchmarks/compile_ranking.py``), so
the best configuration compiled need not be the best eager one. The recommendation is then the
finalist with the most value under compile (its re-timed value times its compile gain where
compile is recommended for it) when that beats the eager recommendation's beyond both their
spreads; the line says so. The Hugging Face recipes re-timed beside the finalists are compiled too,
whatever their eager rank (:func:`candidates`): a Trainer user compiles them with one flag.

A check is of one recommendation: once another trial is recommended eagerly (a resumed study,
``autotune best`` re-timing new finalists) the stored one is no longer read, and the next study run
checks the new recommendation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.measurement.compiled import CompileCheck, compile_line
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName, format_value
from autotune.search.baselines import COMPARED, HF_BF16, HF_RECIPE

if TYPE_CHECKING:
    import optuna

    from autotune.config import TrainConfig
    from autotune.search.results import StudySummary
    from autotune.search.trial_record import TrialRecord

__all__ = [
    "COMPILED_RECIPES",
    "COMPILE_CHECK",
    "Candidate",
    "CompilePick",
    "candidates",
    "check_recommendation",
    "read_compile_pick",
]

#: The study's user attribute: {"trial", "check" or "reason"}, and where the finalists were
#: checked "values", "objective" and, where one of them replaced the eager pick, "of"; where a
#: recipe users run was among them, "recipes" (its trial and name).
COMPILE_CHECK = "compile_check"

#: The baselines :func:`candidates` compiles wherever they were re-timed: the Hugging Face recipes,
#: which users compile with one flag (``TrainingArguments(torch_compile=True)``).
COMPILED_RECIPES: tuple[str, ...] = (HF_RECIPE, HF_BF16)

#: The recommended configuration timed eager and compiled; raises ``MeasurementFailed`` where it cannot be.
Comparer = Callable[["TrainConfig"], CompileCheck]


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A finalist the compile check times: its trial, its eager value under the study's objective
    (re-timed side by side with the others) and that value's relative spread."""

    record: TrialRecord
    value: float
    spread: float = 0.0


def candidates(summary: StudySummary) -> list[Candidate]:
    """The finalists ``summary``'s study times compiled: its re-timed trials, best first, with
    their values side by side under its objective; as many as the finalists proper
    (:data:`autotune.search.finalists.FINALISTS`), then the Hugging Face recipes re-timed beside
    them that rank below those (:data:`COMPILED_RECIPES`). The PyTorch default is compiled only
    where it ranks among the finalists (a compile is tens of seconds at real size)."""
    # The recipes whatever their eager rank: compiling gains most where the step recomputes (the
    # every-block-recomputed recipe gained most on a GPU, docs/benchmark-log.md), and a Trainer
    # user compiles it with one flag, so a compiled recommendation has to beat it compiled.
    from autotune.search.finalists import FINALISTS, value_scale

    records = {r.number: r for r in summary.trials}
    ordered = sorted(summary.retimed.items(), key=lambda item: item[1].rank)
    ranked = ordered[:FINALISTS] + [(n, f) for n, f in ordered[FINALISTS:] if records[n].baseline in COMPILED_RECIPES]
    return [
        Candidate(
            record=records[n],
            value=f.retimed_throughput * value_scale(records[n], summary.objective),
            spread=f.retimed_spread,
        )
        for n, f in ranked
    ]


@dataclass(frozen=True, kw_only=True)
class CompilePick:
    """The compile check of trial ``trial``'s configuration: ``check`` where it ran, else
    ``reason`` (why it was not checked, or how it failed).

    ``of``: the eager recommendation the check was made for, where the finalists' checks made
    another finalist the recommendation under compile (None: ``trial`` itself). ``values``: each
    finalist checked, its value under compile (the study's objective) and its compile speedup
    where compile is recommended for it (None: it stays eager), in the order checked."""

    trial: int
    check: CompileCheck | None = None
    reason: str | None = None
    of: int | None = None
    values: tuple[tuple[int, float, float | None], ...] = ()
    recipes: tuple[tuple[int, str], ...] = ()
    objective: ObjectiveName = DEFAULT_OBJECTIVE

    def __post_init__(self) -> None:
        assert (self.check is None) != (self.reason is None), "a check or the reason there is none"
        assert self.of is None or self.check is not None, "a finalist replaces the recommendation only by its check"

    @property
    def checked_for(self) -> int:
        """The eager recommendation this check was made for."""
        return self.trial if self.of is None else self.of

    @property
    def compiled(self) -> bool:
        """Compile is part of the recommendation: the check recommends it."""
        return self.check is not None and self.check.recommended

    def config(self, config: TrainConfig) -> TrainConfig:
        """``config`` as recommended: compiled in the check's mode where it won, else as measured."""
        if self.check is None or not self.compiled:
            return config
        return dataclasses.replace(config, compile=self.check.mode)

    @property
    def line(self) -> str:
        """The line the study prints after its recommendation (:func:`compile_line`), and where the
        finalists were checked, each one's value under compile."""
        if self.check is None:
            return f"torch.compile: not checked ({self.reason})"
        return compile_line(self.check) + self._finalists_words()

    def _finalists_words(self) -> str:
        if len(self.values) < 2:
            return ""
        recipes = dict(self.recipes)

        def named(n: int) -> str:
            return f"trial {n}" if n not in recipes else f"trial {n} (the {_recipe_words(recipes[n])})"

        each = ", ".join(
            f"{named(n)} {format_value(v, self.objective)} ({'eager' if s is None else f'compiled {s:.2f}x'})"
            for n, v, s in self.values
        )
        if self.of is None:
            return f"; the finalists under compile: {each}"
        return f"; under compile trial {self.trial} beats the eager pick, trial {self.of}: {each}"

    @property
    def export_line(self) -> str:
        """What ``autotune best`` says of the exported configuration, in one line."""
        if self.check is None:
            return f"the recommendation stays eager: torch.compile not checked ({self.reason})"
        head = f"compiled ({self.check.mode})" if self.compiled else "stays eager"
        return f"the recommendation {head}: {self.line}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"trial": self.trial}
        if self.check is None:
            out["reason"] = self.reason
        else:
            out["check"] = self.check.to_dict()
        if self.of is not None:
            out["of"] = self.of
        if self.values:
            out["values"] = [list(v) for v in self.values]
            out["objective"] = self.objective
        if self.recipes:
            out["recipes"] = [list(r) for r in self.recipes]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompilePick:
        check = d.get("check")
        return cls(
            trial=d["trial"],
            check=None if check is None else CompileCheck.from_dict(check),
            reason=d.get("reason"),
            of=d.get("of"),
            values=tuple((int(n), float(v), None if s is None else float(s)) for n, v, s in d.get("values", ())),
            recipes=tuple((int(n), str(name)) for n, name in d.get("recipes", ())),
            objective=d.get("objective", DEFAULT_OBJECTIVE),
        )


def _recipe_words(name: str) -> str:
    """A recipe's name in the words the recommendation line uses (``"HF recipe"``)."""
    return dict(COMPARED)[name]


def read_compile_pick(study: optuna.Study, recommended: TrialRecord | None) -> CompilePick | None:
    """The stored compile check of the eager recommendation ``recommended``, or None (none
    stored, or of another recommendation). Its ``trial`` is what is recommended under compile."""
    stored = study.user_attrs.get(COMPILE_CHECK)
    if not stored or recommended is None:
        return None
    pick = CompilePick.from_dict(stored)
    return pick if pick.checked_for == recommended.number else None


def compiled_value(candidate: Candidate, check: CompileCheck, objective: ObjectiveName) -> float:
    """``candidate``'s value under compile: its eager value times what compiling gains where the
    check recommends it (the speedup, and per GiB the eager peak over the compiled one where the
    allocator measured both in the check's own loop), else its eager value."""
    if not check.recommended:
        return candidate.value
    gain = check.speedup
    if objective == "per-gib" and check.compiled_peak and check.eager_peak:
        gain *= check.eager_peak / check.compiled_peak
    return candidate.value * gain


def compiled_choice(
    checked: Sequence[tuple[Candidate, CompileCheck]], objective: ObjectiveName = DEFAULT_OBJECTIVE
) -> int:
    """The index in ``checked`` (the eager recommendation first) of the recommendation under
    compile: the finalist with the most :func:`compiled_value` if it beats the first's beyond
    both their spreads (each the re-timing's, plus the compiled timing's where compiled), else 0.

    Example:
        >>> from autotune.measurement.sidebyside import Timing
        >>> def check(eager, compiled):
        ...     rates = {"eager": Timing(rates=(eager,) * 3), "compiled": Timing(rates=(compiled,) * 3)}
        ...     return CompileCheck(mode="default", samples=8, warmup_seconds=(9.0,), eager_peak=None,
        ...                         compiled_peak=None, rounds=3, **rates)
        >>> pick, other = Candidate(record=None, value=100.0), Candidate(record=None, value=90.0)
        >>> compiled_choice([(pick, check(10.0, 9.5)), (other, check(10.0, 13.0))])  # 100 eager vs 117 compiled
        1
    """

    def spread(candidate: Candidate, check: CompileCheck) -> float:
        return candidate.spread + (check.compiled.relative_spread if check.recommended else 0.0)

    values = [compiled_value(c, k, objective) for c, k in checked]
    best = max(range(len(checked)), key=lambda i: (values[i], -i))
    first, top = values[0], values[best]
    if best == 0 or top - first <= top * spread(*checked[best]) + first * spread(*checked[0]):
        return 0
    return best


def check_recommendation(
    study: optuna.Study,
    recommended: TrialRecord | None,
    compare: Comparer,
    *,
    note: Callable[[str], None],
    finalists: Sequence[Candidate] = (),
    objective: ObjectiveName = DEFAULT_OBJECTIVE,
) -> CompilePick | None:
    """Time ``recommended``'s configuration eager and compiled with ``compare`` unless it was
    checked already, then each other of ``finalists`` (the re-timed ones, with their values under
    ``objective``), and pick the recommendation under compile (:func:`compiled_choice`); store the
    outcome on ``study`` and return it (None: nothing recommended).

    A configuration on DeepSpeed ranks is not checked (DeepSpeed compiles its engine itself:
    ``engine.compile()``); a comparison that fails (``MeasurementFailed``: the compile errs, the
    child crashes or runs past its limit) leaves the recommendation eager with the reason, and
    leaves another finalist out of the choice (a line says why).
    Cost: one compile per configuration checked (on an H200 ~30-60 s at GPT-2-small size).
    """
    from autotune.errors import MeasurementFailed

    if recommended is None or recommended.config is None:
        return None
    done = read_compile_pick(study, recommended)
    if done is not None:
        return done
    config = recommended.config
    if config.on_deepspeed:
        pick = CompilePick(trial=recommended.number, reason="it runs on DeepSpeed ranks: call engine.compile() there")
    else:
        note(f"timing the recommendation (trial {recommended.number}) eager and compiled side by side (torch.compile)")
        try:
            pick = CompilePick(trial=recommended.number, check=compare(dataclasses.replace(config, compile="none")))
        except MeasurementFailed as e:
            pick = CompilePick(trial=recommended.number, reason=f"the comparison failed: {e}")
    if pick.check is not None:
        pick = _among_finalists(pick.check, recommended, compare, note, finalists, objective)
    study.set_user_attr(COMPILE_CHECK, pick.to_dict())
    return pick


def _among_finalists(
    check: CompileCheck,
    recommended: TrialRecord,
    compare: Comparer,
    note: Callable[[str], None],
    finalists: Sequence[Candidate],
    objective: ObjectiveName,
) -> CompilePick:
    """The pick among ``recommended`` (compared already: ``check``) and the other ``finalists``
    on local runners, each compared in turn."""
    from autotune.errors import MeasurementFailed

    first = next((c for c in finalists if c.record.number == recommended.number), None)
    others = [
        c
        for c in finalists
        if c.record.number != recommended.number and c.record.config is not None and not c.record.config.on_deepspeed
    ]
    if first is None or not others:
        return CompilePick(trial=recommended.number, check=check)
    checked = [(first, check)]
    for c in others:
        assert c.record.config is not None
        what = f"finalist trial {c.record.number}"
        if c.record.baseline in COMPILED_RECIPES:
            what = f"the {_recipe_words(c.record.baseline)} (trial {c.record.number})"
        note(f"timing {what} eager and compiled side by side (torch.compile)")
        try:
            checked.append((c, compare(dataclasses.replace(c.record.config, compile="none"))))
        except MeasurementFailed as e:
            note(f"finalist trial {c.record.number} left out of the compiled choice: the comparison failed: {e}")
    if len(checked) < 2:  # every other finalist's comparison failed
        return CompilePick(trial=recommended.number, check=check)
    best = compiled_choice(checked, objective)
    values = tuple(
        (c.record.number, compiled_value(c, k, objective), k.speedup if k.recommended else None) for c, k in checked
    )
    winner, won = checked[best]
    return CompilePick(
        trial=winner.record.number,
        check=won,
        of=None if best == 0 else recommended.number,
        values=values,
        recipes=tuple((c.record.number, b) for c, _ in checked if (b := c.record.baseline) in COMPILED_RECIPES),
        objective=objective,
    )
