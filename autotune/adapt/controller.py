"""The adaptive controller: one sequence of decisions, whichever loop trains the model.

:class:`autotune.Adaptive` (its own loop, local or on DeepSpeed ranks), the Hugging Face callback
and the Lightning callback (:mod:`autotune.integrations`) each hold one :class:`Controller`. It
owns what an adaptive run decides and the order it decides it in:

1. **the start within the budget** (:meth:`Controller.begin`): the default if the gate admits it,
   else the first of smaller micro-batches (where the loop can take another split before its
   first step), then recompute on every block (on ranks: each at the lowest ZeRO stage that
   fits) that it admits; if none does, a :class:`~autotune.errors.ConfigError` (raised by
   ``Adaptive(...)``, and by the callbacks' train-begin hooks: a framework's run started over its
   budget would end in an out-of-memory error, or train on a budget the user did not give);
   then the decision source's plan;
2. **each step** (:meth:`Controller.after_step`): a non-finite loss stops a run that decides;
   a step measured over the budget is recorded, warned of and left at once for the configuration
   before it; a side-by-side trial (:class:`~autotune.adapt.side_by_side.SideBySide`, where the loop
   can switch every step) goes on to its verdict; every ``decide_every`` steps, one decision;
3. **resume** (:meth:`Controller.state_dict`, :meth:`Controller.restore`).

What differs between the loops is a :class:`~autotune.adapt.frontend.FrontEnd`: how a configuration is applied (a
reconfiguration of the trainer, block wrappers on a framework's model, a split that waits for
the framework's next epoch), whether the loop can switch every step, what of a configuration
it can take, and how a peak is measured (a tracked step, the caching allocator's statistics).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import TYPE_CHECKING, Any

from autotune.adapt.budget_start import budget_start
from autotune.adapt.decider import Decider
from autotune.adapt.losses import Losses
from autotune.adapt.peaks import Peaks
from autotune.adapt.records import Change, OverBudgetStep
from autotune.adapt.sources import Observation, RunContext
from autotune.config import TrainConfig
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName
from autotune.measurement.progress import Note, quiet, ranked_line
from autotune.tuning import TUNING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from autotune.adapt.frontend import FrontEnd
    from autotune.adapt.recompiles import Recompiles
    from autotune.adapt.sources import DecisionSource
    from autotune.measurement.cuda_memory import AllocatorStats
    from autotune.memory.gate import BudgetGate
    from autotune.workload import Workload

__all__ = ["Controller"]


class Controller:
    """What an adaptive run decides, in one order, whatever loop makes it.

    Args:
        frontend: The loop's hooks.
        source: Where proposals come from (None: the run moves only for the budget).
        gate: The budget gate every configuration passes.
        default: The run's own configuration (the user's split, fp32, no recompute).
        fraction: The budget as a fraction of the default's peak (None: bytes): a measurement of
            the default replaces its prediction as that basis.
        decide_every: Optimizer steps between decisions.
        adapt_batch: As for :class:`autotune.Adaptive`.
        min_efficiency: As for :class:`autotune.Adaptive` (default 1.0: the batch never grows
            at a cost).
        max_batch_size: As for :class:`autotune.Adaptive`.
        min_micro_batch: The smallest micro-batch of a rank's batch (the workload's
            :attr:`~autotune.Workload.micro_batch_floor`; None: no accumulation): neither the
            start search nor a proposal goes below it.
        micro_why: Why, in a few words (:attr:`~autotune.Workload.micro_batch_reason`).
        objective: As for :class:`autotune.Adaptive`.
        recompiles: On a user's compiled model, its recompiles measured, capped and counted
            (:mod:`autotune.adapt.recompiles`); None: an eager model.
        note: Says each phase of :meth:`begin` in one line with its seconds (the block ranking,
            and the source's own: :attr:`RunContext.note`).

    Example:
        The loops drive it in this order (the callbacks' hooks do the same; see
        :class:`autotune.Adaptive` for a run that uses it)::

            start = controller.begin(workload, device_type="cpu")  # raises if nothing fits
            for index in range(steps):
                want = controller.before_step()  # a side-by-side trial may switch the next step
                ...  # one optimizer step under want or controller.config
                controller.after_step(index, config=config, loss=loss, throughput=samples_per_s)
    """

    def __init__(
        self,
        *,
        frontend: FrontEnd,
        source: DecisionSource | None,
        gate: BudgetGate,
        default: TrainConfig,
        fraction: float | None,
        decide_every: int,
        adapt_batch: bool = False,
        min_efficiency: float = 1.0,
        max_batch_size: int | None = None,
        min_micro_batch: int | None = 1,
        micro_why: str = "",
        objective: ObjectiveName = DEFAULT_OBJECTIVE,
        recompiles: Recompiles | None = None,
        note: Note = quiet,
    ) -> None:
        self.frontend, self.source, self.gate = frontend, source, gate
        self.note = note
        self.recompiles = recompiles
        self.default, self.fraction, self.decide_every = default, fraction, decide_every
        self.adapt_batch = adapt_batch
        self.decider = Decider(
            source=source,
            gate=gate,
            base_batch_size=default.effective_batch_size,
            adapt_batch=adapt_batch,
            min_efficiency=min_efficiency,
            max_batch_size=max_batch_size,
            takes=frontend.takes,
            paired=frontend.paired,
            min_micro_batch=min_micro_batch,
            micro_why=micro_why,
            objective=objective,
            recompiles=recompiles,
        )
        self.config = default  # the configuration the loop runs
        self.pending: Change | None = None  # a change that waits for the loop (see FrontEnd.apply)
        self._pending_logged = False  # the pending change is a revert, already in the history
        self.losses = Losses()  # the recent losses an observation carries, and the NaN rule
        self.peaks = Peaks(gate=gate, decider=self.decider, default=default, fraction=fraction)

    @property
    def history(self) -> list[Change]:
        """Every decision so far, applied or refused, in order."""
        return self.decider.history

    @property
    def over_budget(self) -> list[OverBudgetStep]:
        """Every step measured over the budget, in order."""
        return self.peaks.over_budget

    @property
    def decides(self) -> bool:
        """Whether the run makes decisions (a decision source, or the batch rule)."""
        return self.source is not None or self.adapt_batch

    # ---- before the first step ---------------------------------------------------------------------

    def begin(self, workload: Workload, *, device_type: str) -> TrainConfig:
        """Put the run where the budget and the source's plan say: :meth:`start`, then the plan.

        Args:
            workload: The run's workload (profiled per block for the source's plan).
            device_type: ``"cpu"`` or ``"cuda"``: what the source is told the run trains on.

        Returns:
            The configuration the loop starts in.

        Raises:
            ConfigError: no configuration fits the budget.
        """
        config = self._begin(workload, device_type=device_type)
        if self.recompiles is not None:  # the user's compile is of the block knobs the run starts with
            self.recompiles.started(config)
        return config

    def _begin(self, workload: Workload, *, device_type: str) -> TrainConfig:
        start, why, predicted = self.start()
        context = None
        if self.source is not None:  # the profile is only for a source's plan and observations
            from autotune.memory.blocks import profile_blocks

            began = time.perf_counter()
            blocks = profile_blocks(workload, micro_batch_size=TUNING.profile_micro_batch)
            self.note(ranked_line(began))
            context = RunContext(
                workload=workload,
                start=start,
                budget=lambda: self.gate.budget,
                blocks=blocks,
                device_type=device_type,
                # What the loop cannot run as it is (a Trainer keeps its split, the user's flags
                # pin a precision) would be refused as a plan: it is not a candidate.
                admits=lambda c: self.frontend.takes(start, c) == c and self.gate.admits(c).admitted,
                note=self.note,
            )
        change = self.decider.begin(start=start, default=self.default, why=why, context=context)
        if change is None:
            return self.config
        if change.after == start:
            change = dataclasses.replace(change, predicted_bytes=predicted)
        began = time.perf_counter()
        made = self.frontend.apply(change)
        if made is not None:
            self.config = made.after
            self.decider.started(made, seconds=time.perf_counter() - began)
            return self.config
        self.pending, self._pending_logged = change, False
        if start != self.default:  # the plan waits for the loop; the budget's start cannot
            budget = Change(
                step=0,
                source="budget",
                before=self.default,
                after=start,
                applied=True,
                reason=why,
                predicted_bytes=predicted,
            )
            made = self.frontend.apply(budget)
            assert made is not None, "a start within the loop's split is applied at once"
            self.config = start
            self.decider.started(made)
        return self.config

    def start(self) -> tuple[TrainConfig, str, int | None]:
        """Where the budget puts the run, before any decision source has a say: THE search of
        :mod:`autotune.memory.start`, as :func:`~autotune.adapt.budget_start.budget_start` runs it.

        Returns:
            The configuration, why (empty: the default) and its predicted peak in bytes (None
            for the default).

        Raises:
            ConfigError: no configuration fits the budget.
        """
        return budget_start(
            self.default,
            gate=self.gate,
            frontend=self.frontend,
            min_micro_batch=self.decider.min_micro_batch,
            micro_why=self.decider.micro_why,
            whole=self.peaks.whole,
        )

    # ---- each step ----------------------------------------------------------------------------------

    def before_step(self) -> TrainConfig | None:
        """The configuration the next step must run under, if not the loop's current one.

        Returns:
            While a side-by-side trial lasts (only where the loop is ``paired``), the side it
            alternates to; else None.
        """
        want = self.decider.trial_config(self.config)
        if want is None or want == self.config:
            return None
        self.config = want
        return want

    def after_step(
        self,
        index: int,
        *,
        config: TrainConfig,
        loss: float | None,
        throughput: float | None = None,
        peak: int | None = None,
        allocator: AllocatorStats | None = None,
        skipped: bool = False,
        seconds: float | None = None,
    ) -> None:
        """Step ``index`` (0-based: ``index + 1`` steps are done) ran under ``config``.

        Args:
            index: The step's 0-based index.
            config: The configuration it ran under.
            loss: Its loss, where the loop read it (None: not read, e.g. between a framework's logs).
            throughput: Samples/s where the step counts towards the configuration's time (not the
                first of a configuration, which pays one-time costs, nor a tracked step).
            peak: Its measured peak bytes, where it was measured (a tracked step).
            allocator: On CUDA, the caching allocator's peaks over that measured step.
            skipped: The loop found the loss or a gradient NaN or infinite before its optimizer
                step and skipped the update (the weights and optimizer state are the step before's).
            seconds: The step's wall time, where the loop reports it: on a compiled model the
                recompile after a change of block knobs is measured from it (the recompiling
                step is then not timed).

        Raises:
            NonFiniteLossError: a NaN or infinite loss (or gradient, ``skipped``) in a run that
                decides (its decisions, the policy's observation and the objective, would act on
                it); a run that does not decide warns once (:class:`NonFiniteLossWarning`) and goes on.
        """
        step = index + 1
        if self.recompiles is not None and seconds is not None:
            throughput = self._recompiled(config, seconds, tracked=peak is not None, throughput=throughput)
        if throughput is not None:
            self.decider.timed(config, throughput)
        if loss is not None:
            self.losses.add(loss)
        if (loss is not None and not math.isfinite(loss)) or skipped:
            self.diverged(index, config=config, loss=loss, skipped=skipped)
        over = None
        if peak is not None:
            self.peaks.measured(config, peak, allocator, step=step)
            # Over the budget as the gate reads a measurement (on CUDA: reserved memory with headroom).
            over = peak if not self.gate.admits(config).admitted else None
        if over is not None:
            self.peaks.over(index, config, over)
        if over is not None and config != self.decider.previous:
            # A measured step put the config over the budget (its prediction was off): go back at once.
            back = self.decider.revert(config, over, step)
            self._make(
                Change(step=step, source="budget", before=config, after=back, applied=True, reason="back"), logged=True
            )
            return
        due = step % self.decide_every == 0 and self.pending is None  # none while a change waits for the loop
        change = self.decider.on_step(step, config, due=due, observe=lambda: self._observe(step, config))
        if change is not None:
            self._make(change)

    def _recompiled(
        self, config: TrainConfig, seconds: float, *, tracked: bool, throughput: float | None
    ) -> float | None:
        """On a compiled model: the step's throughput, None where it recompiled (not the
        configuration's speed); a measured recompile goes in the history of the change that caused it."""
        assert self.recompiles is not None, "a compiled model's run"
        recompiled, measured = self.recompiles.stepped(config, seconds, tracked=tracked)
        if measured is not None:
            at, cost = measured
            self.history[at] = dataclasses.replace(self.history[at], recompile_seconds=cost)
        return None if recompiled else throughput

    def made(self, step: int, taken: bool, why: str = "") -> None:
        """The loop reached the point a pending change waited for (:meth:`FrontEnd.apply` returned None).

        Args:
            step: Optimizer steps done.
            taken: Whether the loop made the change.
            why: When not taken, why: the change is logged as refused with it.
        """
        change, self.pending = self.pending, None
        if change is None:
            return
        if not taken:
            if not self._pending_logged:
                self.decider.refuse(dataclasses.replace(change, step=step, reason=f"{change.reason}; {why}"))
            return
        self.config = change.after
        if not self._pending_logged:
            self.decider.moved(dataclasses.replace(change, step=step))
        if self.recompiles is not None:
            self.recompiles.moved(change.before, change.after, len(self.history) - 1)

    def _make(self, change: Change, *, logged: bool = False) -> None:
        """Make ``change`` through the front-end (``logged``: a revert, already in the history)."""
        began = time.perf_counter()
        made = self.frontend.apply(change)
        if made is None:
            self.pending, self._pending_logged = change, logged
            return
        self.config = made.after
        if not logged:
            self.decider.moved(made, seconds=time.perf_counter() - began)
        if self.recompiles is not None:
            self.recompiles.moved(change.before, made.after, len(self.history) - 1)

    def _observe(self, step: int, config: TrainConfig) -> Observation:
        stats = self.frontend.run_stats()
        if stats is not None:
            self.gate.observe(stats)  # the run's peaks so far: they scale the gate's predictions
        return self.decider.observation(
            step=step, config=config, b_noise=self.frontend.b_noise(), losses=tuple(self.losses.recent)
        )

    def diverged(self, index: int, *, config: TrainConfig, loss: float | None, skipped: bool) -> None:
        """The NaN rule: step ``index``'s loss (or, with a finite or unread ``loss``, a gradient) is
        NaN or infinite.

        Args:
            index: The step's 0-based index.
            config: The configuration it ran under.
            loss: Its loss (None: not read, e.g. in a framework's hook before its optimizer step).
            skipped: The loop skipped the step's update: said in the message, so the user knows
                the weights are the step before's.

        Raises:
            NonFiniteLossError: in a run that decides; a run that does not decide warns once
                (:class:`NonFiniteLossWarning`) and goes on.
        """
        self.losses.diverged(index, config=config, loss=loss, skipped=skipped, decides=self.decides)

    def refused(self, step: int, source: str, reason: str) -> bool:
        """Log what the loop forbids, once: a refused change that stays where the run is.

        Args:
            step: Optimizer steps done.
            source: Which loop forbids it (the history's ``source``).
            reason: What it forbids and why.

        Returns:
            Whether it was new (False: the history said it already, e.g. before a resume).
        """
        if any(c.source == source and c.reason == reason for c in self.history):
            return False
        self.decider.note(
            Change(step=step, source=source, before=self.config, after=self.config, applied=False, reason=reason)
        )
        return True

    # ---- resume ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Every decision and measurement, the source's state and the recent losses, as plain values.

        Returns:
            A dict for :meth:`load_state_dict`.
        """
        return {
            "measured": [{"config": c.to_dict(), "peak_bytes": b} for c, b in self.gate.measured.items()],
            "decider": self.decider.state_dict(),
            "source": self.source.state_dict() if self.source is not None else {},
            "over_budget": [o.to_dict() for o in self.over_budget],
            "losses": list(self.losses.recent),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`: nothing measured or refused there is explored again.

        Args:
            state: What :meth:`state_dict` returned.
        """
        for m in state.get("measured", []):
            self.peaks.measured(TrainConfig.from_dict(m["config"]), m["peak_bytes"])
        self.decider.load_state_dict(state["decider"])
        if self.source is not None:
            self.source.load_state_dict(state["source"])
        self.peaks.over_budget = [OverBudgetStep.from_dict(o) for o in state.get("over_budget", [])]
        self.resume_losses(state.get("losses", []))

    def resume_losses(self, losses: list[float]) -> None:
        """Set the losses of the run so far, on a resume (a non-finite one was warned of before the restart).

        Args:
            losses: Every step's loss, oldest first.
        """
        self.losses.resume(losses)

    def restore(self, saved: TrainConfig, *, step: int, run: str) -> TrainConfig:
        """Put a resumed run at its saved configuration if this run's gate admits it.

        Args:
            saved: The configuration the saved run was in.
            step: Optimizer steps done.
            run: ``"run"`` or ``"fit"``, as the history's message says.

        Returns:
            ``saved``, or where this run started (a ``budget`` change in the history).
        """
        target = self.peaks.resumed(saved, current=self.config, step=step, run=run)
        if target != self.config:
            made = self.frontend.apply(
                Change(step=step, source="resume", before=self.config, after=target, applied=True, reason="resumed")
            )
            assert made is not None, "a resumed configuration is within the loop's split"
            self.config = target
        return target
