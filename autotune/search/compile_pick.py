"""Whether the study's recommendation is compiled: it timed eager and ``torch.compile``-d side by side.

After the finalists' re-timing (:mod:`autotune.search.finalists`) the recommended configuration
is timed both ways in the measuring child
(:meth:`autotune.procs.isolation.MeasurementProcess.compare_compiled`, over
:func:`autotune.measurement.compiled.compare_compiled`). The outcome goes on the study as one user
attribute (:data:`COMPILE_CHECK`: the trial it is of, and the check or why there is none), where
the summary, ``autotune best`` and the exports read it: compile is part of the recommendation only
when the check recommends it (faster beyond both spreads, its peak within the budget); otherwise
the recommendation stays eager and one line says why.

A check is of one trial: once another trial is recommended (a resumed study, ``autotune best``
re-timing new finalists) the stored one is no longer read, and the next study run checks the new
recommendation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.measurement.compiled import CompileCheck, compile_line

if TYPE_CHECKING:
    import optuna

    from autotune.config import TrainConfig
    from autotune.search.trial_record import TrialRecord

__all__ = ["COMPILE_CHECK", "CompilePick", "check_recommendation", "read_compile_pick"]

COMPILE_CHECK = "compile_check"  # the study's user attribute: {"trial", "check" or "reason"}

#: The recommended configuration timed eager and compiled; raises ``MeasurementFailed`` where it cannot be.
Comparer = Callable[["TrainConfig"], CompileCheck]


@dataclass(frozen=True, kw_only=True)
class CompilePick:
    """The compile check of trial ``trial``'s configuration: ``check`` where it ran, else
    ``reason`` (why it was not checked, or how it failed)."""

    trial: int
    check: CompileCheck | None = None
    reason: str | None = None

    def __post_init__(self) -> None:
        assert (self.check is None) != (self.reason is None), "a check or the reason there is none"

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
        """The line the study prints after its recommendation (:func:`compile_line`)."""
        if self.check is None:
            return f"torch.compile: not checked ({self.reason})"
        return compile_line(self.check)

    @property
    def export_line(self) -> str:
        """What ``autotune best`` says of the exported configuration, in one line."""
        if self.check is None:
            return f"the recommendation stays eager: torch.compile not checked ({self.reason})"
        head = f"compiled ({self.check.mode})" if self.compiled else "stays eager"
        return f"the recommendation {head}: {compile_line(self.check)}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"trial": self.trial}
        if self.check is None:
            out["reason"] = self.reason
        else:
            out["check"] = self.check.to_dict()
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CompilePick:
        check = d.get("check")
        return cls(
            trial=d["trial"],
            check=None if check is None else CompileCheck.from_dict(check),
            reason=d.get("reason"),
        )


def read_compile_pick(study: optuna.Study, recommended: TrialRecord | None) -> CompilePick | None:
    """The stored compile check of ``recommended``, or None (none stored, or of another trial)."""
    stored = study.user_attrs.get(COMPILE_CHECK)
    if not stored or recommended is None or stored.get("trial") != recommended.number:
        return None
    return CompilePick.from_dict(stored)


def check_recommendation(
    study: optuna.Study,
    recommended: TrialRecord | None,
    compare: Comparer,
    *,
    note: Callable[[str], None],
) -> CompilePick | None:
    """Time ``recommended``'s configuration eager and compiled with ``compare`` unless it was
    checked already; store the outcome on ``study`` and return it (None: nothing recommended).

    A configuration on DeepSpeed ranks is not checked (DeepSpeed compiles its engine itself:
    ``engine.compile()``); a comparison that fails (``MeasurementFailed``: the compile errs, the
    child crashes or runs past its limit) leaves the recommendation eager with the reason.
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
    study.set_user_attr(COMPILE_CHECK, pick.to_dict())
    return pick
