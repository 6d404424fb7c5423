"""Where the budget puts an adaptive run before any decision source has a say.

:meth:`autotune.adapt.controller.Controller.start` runs it: the default if the gate admits it,
else the first of :mod:`autotune.memory.start`'s candidates the loop can take that it admits,
else a :class:`~autotune.errors.ConfigError` that says why nothing does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.errors import ConfigError
from autotune.knobs import smallest_micro_batch
from autotune.memory.gate import admission
from autotune.memory.start import first_within, start_candidates

if TYPE_CHECKING:
    from autotune.adapt.frontend import FrontEnd
    from autotune.config import TrainConfig
    from autotune.memory.gate import BudgetGate, Verdict

__all__ = ["budget_start"]


def budget_start(
    default: TrainConfig,
    *,
    gate: BudgetGate,
    frontend: FrontEnd,
    min_micro_batch: int | None,
    micro_why: str,
    whole: bool,
) -> tuple[TrainConfig, str, int | None]:
    """Where the budget puts a run (see :meth:`Controller.start`).

    Args:
        default: The run's own configuration.
        gate: The run's budget gate.
        frontend: The loop: what of a candidate it takes, whether it splits before its first step.
        min_micro_batch: The smallest micro-batch of a rank's batch (None: no accumulation).
        micro_why: Why, in a few words.
        whole: The budget is at least the default's own peak (``"100%"``): the default starts
            even where the prediction's headroom would refuse it.

    Returns:
        The configuration, why (empty: the default) and its predicted peak in bytes (None for
        the default).

    Raises:
        ConfigError: no configuration fits the budget.
    """
    verdict = gate.admits(default)
    if verdict.admitted or whole:
        return default, "", None
    batch = default.micro_batch_size
    candidates = start_candidates(
        default, min_micro_batch=min_micro_batch, stages=range(4) if default.ranks > 1 else (0,)
    )
    found, tried = first_within(
        (
            c
            for c in candidates
            if c == frontend.takes(default, c) and (c.micro_batch_size == batch or frontend.splits_now)
        ),
        gate.admits,
    )
    if found is not None:
        config, candidate = found
        return config, f"the default {_over(verdict)}; {candidate.reason}", candidate.predicted
    raise _nothing_fits(
        default,
        gate=gate,
        frontend=frontend,
        verdict=verdict,
        tried=tried,
        min_micro_batch=min_micro_batch,
        micro_why=micro_why,
    )


def _nothing_fits(
    default: TrainConfig,
    *,
    gate: BudgetGate,
    frontend: FrontEnd,
    verdict: Verdict,
    tried: list[Verdict],
    min_micro_batch: int | None,
    micro_why: str,
) -> ConfigError:
    """Why no candidate fits: the first one small enough but not verified, else why none could be
    predicted, else the smallest predicted peak against the budget."""
    batch = default.micro_batch_size
    floor = min(batch, smallest_micro_batch(batch * default.grad_accum_steps, min_micro_batch))
    per_rank = " per rank" if default.ranks > 1 else ""
    split = "" if frontend.splits_now else f" at the loop's split {batch} x {default.grad_accum_steps}"
    if floor > 1 and frontend.splits_now:
        split = f" with micro-batches of at least {floor} ({micro_why})"
    # The candidates keep the run's precision (its flags: bf16=True is the run's, not a fp32 start).
    precision = default.knob_cells()[1]
    kind = "fp32 configuration" if precision == "fp32" else f"configuration in the run's precision ({precision})"
    fitting = [v for v in tried if v.predicted is not None and _would_fit(gate, v.predicted)]
    if fitting:  # small enough, but predicted by a memory model that was not verified for it
        return ConfigError(
            f"no {kind} of batch {default.effective_batch_size}{split} is known to fit memory_budget "
            f"{gate.budget} B{per_rank}: {fitting[0].reason}"
        )
    smallest = min((v.predicted for v in tried if v.predicted is not None), default=None)
    if smallest is None:  # nothing could be predicted: say why, not a missing number
        return ConfigError(
            f"no {kind} of batch {default.effective_batch_size}{split} is known to fit memory_budget "
            f"{gate.budget} B{per_rank}: {(tried[0] if tried else verdict).reason}"
        )
    return ConfigError(
        f"memory_budget {gate.budget} B{per_rank} is below every {kind} of batch "
        f"{default.effective_batch_size}{split} (smallest predicted peak {smallest} B, "
        f"+{gate.headroom:.0%} headroom): raise the budget."
    )


def _would_fit(gate: BudgetGate, predicted: int) -> bool:
    """Whether the gate would admit ``predicted`` bytes were the prediction verified."""
    return admission(budget=gate.budget, headroom=gate.headroom, predicted=predicted, verified=True).admitted


def _over(verdict: Verdict) -> str:
    return f"is over the budget ({verdict.reason})"
