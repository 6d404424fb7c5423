"""``Adaptive``: the user's own training run, kept at the best configuration as training changes.

The user's model and optimizer are trained in place (no copy) by the local training loop
(:class:`autotune.adapt.loop.InPlaceTrainer`); :meth:`Adaptive.on_ranks` trains a workload on
DeepSpeed ranks instead (:class:`autotune.adapt.ranks.RankLoop`), where the ZeRO stage is a knob
too. Either way, every ``decide_every`` steps a decision source (the pretrained policy, a fixed
configuration, a user's policy file, any :class:`DecisionSource`) may propose another
configuration; the budget gate (:mod:`autotune.adapt.gate`) admits it only if its peak memory
(per rank) is known to fit. The first step under each configuration runs under exact memory
tracking (~2x a step, once per configuration); a configuration measured over the budget is left
at once. Every decision, applied or refused, is in :attr:`Adaptive.history`.
"""

from __future__ import annotations

import dataclasses
import inspect
import statistics
import time
from collections.abc import Sized
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from autotune.adapt.batch import grow_batch
from autotune.adapt.gate import BudgetGate, Verdict, as_budget
from autotune.adapt.loop import AdaptLoop, InPlaceTrainer
from autotune.adapt.records import AdaptStep, Change, ConfigRecord
from autotune.adapt.sources import DecisionSource, FixedConfig, Observation, Proposal, RunContext
from autotune.config import TrainConfig
from autotune.errors import ConfigError, UnsupportedError
from autotune.measurement.objective import score
from autotune.units import MemoryBudget
from autotune.workload import Workload

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torch.utils.data import Dataset

    from autotune.procs.session import RankSession


__all__ = ["Adaptive", "decision_source"]

PolicyArg = str | Path | TrainConfig | DecisionSource | None
#: How much better (objective per GiB) a measured configuration must be to be returned to, and how
#: much worse one must be to be left: ~ the spread of a median of a few timed steps on a busy CPU.
_MARGIN = 0.03
_TRUSTED_STEPS = 3  # timed steps (a median of) before measurement may overrule the decision source
_NOISE_STEPS = 4  # steps before each decision whose gradients feed the noise estimate
_LOSSES = 16  # recent losses an observation carries


def decision_source(policy: PolicyArg) -> DecisionSource | None:
    """``"pretrained"`` (the shipped policy), a policy directory, a :class:`TrainConfig` (fixed),
    a :class:`DecisionSource`, or None (no decisions: the run stays where it starts)."""
    if policy is None or isinstance(policy, DecisionSource):
        return policy
    if isinstance(policy, TrainConfig):
        return FixedConfig(policy)
    if isinstance(policy, (str, Path)):
        from autotune.adapt.policy import PolicySource

        return PolicySource(None if policy == "pretrained" else Path(policy))
    raise ConfigError(
        "policy must be 'pretrained', a policy directory, a TrainConfig, a DecisionSource or None, "
        f"but got {type(policy).__name__}."
    )


def _check_int(name: str, value: object, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ConfigError(f"{name} must be an int >= {low}, but got {value!r}.")


def _like(optimizer: torch.optim.Optimizer) -> Callable[[Any], torch.optim.Optimizer]:
    """A factory for the user's optimizer class and defaults: the memory model counts *its* state.

    Only the defaults its constructor takes (torch's AdamW keeps ``decoupled_weight_decay`` in its
    defaults without accepting it)."""
    accepted = inspect.signature(type(optimizer)).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    return lambda params: type(optimizer)(params, **defaults)


class Adaptive:
    """Train ``model`` with ``optimizer`` in place, adapting how each step is computed.

    On DeepSpeed ranks, with the ZeRO stage as a knob too: :meth:`on_ranks` (a workload
    reference: the model lives in the rank processes).

    Args:
        model, optimizer: The user's objects; they are the ones trained (no copy, nothing moved).
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``.
        dataset: Map-style dataset; batches use the default collate.
        batch_size: The effective batch: by default it never changes (only its split into
            micro-batches x accumulation does).
        memory_budget: Peak tensor bytes allowed: ``"8GiB"``, bytes, ``"75%"`` of the default
            configuration's predicted peak, or None (100%: adaptation never uses more memory
            than the default run). A budget below the default's peak starts from the first of
            smaller micro-batches, then recompute, that fits.
        policy: Where decisions come from (see :func:`decision_source`); default the pretrained policy.
        decide_every: Steps between decisions (>= 2: never every step).
        adapt_batch: Let the effective batch grow with the gradient noise scale (see
            :mod:`autotune.adapt.batch`), up to ``max_batch_size`` (default 8 x ``batch_size``).
        blocks: Block module names (default: auto-detected, see :func:`autotune.workload.find_blocks`).
        device: Where batches go (default: the model's device).
        grad_clip, lr_scaling, seed: As in :class:`TrainConfig` (no clipping by default: the
            user's loop decides that).
        track_memory: Track the first step of each configuration exactly (needed for the gate to
            admit configs whose prediction is unverified, and for ``history``'s measured bytes).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
        dataset: Dataset[Any],
        *,
        batch_size: int,
        memory_budget: MemoryBudget | str | int | None = None,
        policy: PolicyArg = "pretrained",
        decide_every: int = 50,
        adapt_batch: bool = False,
        min_efficiency: float = 0.9,
        max_batch_size: int | None = None,
        blocks: Sequence[str] | None = None,
        device: str | torch.device | None = None,
        grad_clip: float | None = None,
        lr_scaling: str = "linear",
        seed: int = 0,
        track_memory: bool = True,
        name: str = "user",
    ) -> None:
        _check_int("batch_size", batch_size, 1)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"optimizer must be a torch.optim.Optimizer, but got {type(optimizer).__name__}.")
        workload = Workload(name=name, model=model, dataset=dataset, loss_fn=loss_fn, blocks=blocks,
                            optimizer=_like(optimizer), batch_size=batch_size)  # fmt: skip
        size = len(dataset) if isinstance(dataset, Sized) else batch_size
        default = TrainConfig(micro_batch_size=min(batch_size, size), grad_clip=grad_clip, lr_scaling=lr_scaling,  # type: ignore[arg-type]
                              seed=seed)  # fmt: skip

        def loop(start: TrainConfig, noise: bool) -> AdaptLoop:
            return InPlaceTrainer(workload, start, model=model, optimizer=optimizer, device=device, track_noise=noise)

        device_type = next((p.device.type for p in model.parameters()), "cpu")
        self._setup(workload, default, loop, memory_budget=memory_budget, policy=policy, decide_every=decide_every,
                    adapt_batch=adapt_batch, min_efficiency=min_efficiency, max_batch_size=max_batch_size,
                    track_memory=track_memory, device_type=device_type)  # fmt: skip

    @classmethod
    def on_ranks(
        cls,
        workload: str | Workload,
        *,
        ranks: int,
        memory_budget: MemoryBudget | str | int | None = None,
        policy: PolicyArg = "pretrained",
        decide_every: int = 50,
        device: str | None = None,
        grad_clip: float | None = None,
        lr_scaling: str = "linear",
        seed: int = 0,
        track_memory: bool = True,
        timeout: float = 600.0,
        session: RankSession | None = None,
    ) -> Adaptive:
        """Train a workload on ``ranks`` DeepSpeed ranks, adapting its configuration, ZeRO stage included.

        The model lives in the rank processes, each rebuilding it from the workload's reference
        (a built-in name such as ``"gpt-tiny"``, ``"path/to/file.py:build"``, ``"package.module:build"``,
        or a :class:`Workload` from :func:`autotune.load_workload`), so this takes a reference, not
        model and optimizer objects: the trained state stays in the ranks (no ``model`` here).

        The workload's batch is the effective batch over all ranks, split evenly (it must divide
        by ``ranks``). Decisions, the budget gate and :attr:`history` are the local run's; the
        memory budget is per rank (a percentage: of the default configuration's predicted peak
        per rank: fp32, one micro-batch per rank, ZeRO stage 0) and the gate predicts each config
        with ZeRO's partitioning. A ZeRO stage (or bf16-engine) change builds new engines with
        the training state carried over; its seconds are in the history's ``seconds``. No batch
        adaptation and no gradient noise (ZeRO reduces gradients inside the engine). The ranks
        start after every argument is checked (~10 s on 2 CPU cores) and end at :meth:`close`,
        on an error, Ctrl-C, or when the parent dies.

        Args:
            ranks: DeepSpeed data-parallel ranks, >= 2 (one process: construct :class:`Adaptive`).
            device: ``cpu``, ``cuda`` (one GPU per rank) or None (CUDA when available).
            timeout: Seconds one command to the ranks (a step, a reconfiguration) may take.
            session: A running :class:`~autotune.procs.session.RankSession` of ``ranks`` ranks to
                train in instead of starting one (a start costs ~10 s: runs can share one, as the
                environment's episodes do); what it trained before ends, its device is used, and
                :meth:`close` leaves it open for its owner.
            Others: as for :class:`Adaptive`.
        """
        from autotune.adapt.ranks import RankLoop
        from autotune.procs.session import check_configs, device_type_of
        from autotune.resolve import load_workload

        if not isinstance(ranks, int) or isinstance(ranks, bool) or ranks < 2:
            raise ConfigError(f"ranks must be an int >= 2 (one process: Adaptive(model, ...)), but got {ranks!r}.")
        if session is not None and (session.closed or session.ranks != ranks):
            state = "closed" if session.closed else f"of {session.ranks} ranks"
            raise ConfigError(f"session must be an open RankSession of ranks={ranks}, but got one {state}.")
        wl = load_workload(workload) if isinstance(workload, str) else workload
        if wl.batch_size % ranks:
            raise ConfigError(
                f"the batch of workload {wl.name!r} ({wl.batch_size}) must divide evenly by ranks={ranks}."
            )
        default = TrainConfig(micro_batch_size=wl.batch_size // ranks, ranks=ranks, grad_clip=grad_clip,
                              lr_scaling=lr_scaling, seed=seed)  # type: ignore[arg-type]  # fmt: skip
        device_type = device_type_of(device) if session is None else session.device_type
        check_configs(wl, [default], device_type)  # a reference and a micro-batch the ranks can take

        def loop(start: TrainConfig, noise: bool) -> AdaptLoop:
            if session is not None:
                return RankLoop(session, wl, start, owned=False)
            return RankLoop.launch(wl, start, device_type=device_type, timeout=timeout)

        self = cls.__new__(cls)
        self._setup(wl, default, loop, memory_budget=memory_budget, policy=policy, decide_every=decide_every,
                    adapt_batch=False, min_efficiency=1.0, max_batch_size=None, track_memory=track_memory,
                    device_type=device_type)  # fmt: skip
        return self

    def _setup(
        self,
        workload: Workload,
        default: TrainConfig,
        loop: Callable[[TrainConfig, bool], AdaptLoop],
        *,
        memory_budget: MemoryBudget | str | int | None,
        policy: PolicyArg,
        decide_every: int,
        adapt_batch: bool,
        min_efficiency: float,
        max_batch_size: int | None,
        track_memory: bool,
        device_type: str,
    ) -> None:
        """What both loops share: the source, the gate, the starting config, then ``loop(start, noise)``."""
        batch_size = workload.batch_size
        _check_int("decide_every", decide_every, 2)
        if not 0.0 < min_efficiency <= 1.0:
            raise ConfigError(f"min_efficiency must be in (0, 1], but got {min_efficiency!r}.")
        self.max_batch_size = 8 * batch_size if max_batch_size is None else max_batch_size
        _check_int("max_batch_size", self.max_batch_size, batch_size)
        self.workload = workload
        self.source = decision_source(policy)
        self.decide_every, self.adapt_batch, self.min_efficiency = decide_every, adapt_batch, min_efficiency
        self.track_memory = track_memory
        self._device_type = device_type
        budget = as_budget(memory_budget)
        self._default, self._fraction = default, budget.fraction
        reduced = self.source is not None  # only a decision source proposes bf16 blocks
        self.gate = BudgetGate.build(workload, budget, default, reduced_precision=reduced, device_type=device_type)
        self.budget_bytes = self.gate.budget
        start, why = self._start(default, budget)
        by = "budget"
        if isinstance(self.source, FixedConfig):  # a fixed configuration runs from the first step if it fits
            self.source.start(self._context(start))
            verdict = self.gate.check(self.source.config)
            if verdict.admitted:
                start, why, by = self.source.config, f"the fixed configuration; {verdict.reason}", self.source.name
        refused_plan: Change | None = None
        if self.source is not None and not isinstance(self.source, FixedConfig):
            context = self._context(start)
            self.source.start(context)
            plan = self.source.plan(context)
            planned = None if plan is None or plan.config == start else self.gate.check(plan.config)
            if plan is not None and planned is not None:
                if planned.admitted:
                    start, why, by = plan.config, f"{plan.reason}; {planned.reason}", self.source.name
                else:  # logged after the start below
                    refused_plan = Change(step=0, source=self.source.name, before=start, after=plan.config,
                                          applied=False, reason=f"{plan.reason}; {planned.reason}",
                                          predicted_bytes=planned.predicted)  # fmt: skip
        wants_noise = adapt_batch or (self.source is not None and self.source.needs_noise)
        self.trainer = loop(start, wants_noise)  # the ranks start here: after every check above
        self._noise = wants_noise and self.trainer.noise is not None
        self.steps: list[AdaptStep] = []
        self._history: list[Change] = []
        self._judged: dict[TrainConfig, ConfigRecord] = {}
        self._on_trial = False  # the current config came from a proposal, and the one it replaced may be better
        self._refused: set[TrainConfig] = set()
        self._recent: list[float] = []  # samples/s of the untracked steps since the last change
        self._timed: dict[TrainConfig, list[float]] = {}  # the same, of every stint under each config
        self._previous = start
        if start != default:
            self._history.append(Change(step=0, source=by, before=default, after=start, applied=True, reason=why))
        if refused_plan is not None:
            self._history.append(refused_plan)

    def _context(self, start: TrainConfig) -> RunContext:
        from autotune.memory.blocks import profile_blocks

        blocks = profile_blocks(self.workload, micro_batch_size=2)
        return RunContext(workload=self.workload, start=start, budget_bytes=self.budget_bytes, blocks=blocks,
                          device_type=self._device_type,
                          admits=lambda config: self.gate.check(config).admitted)  # fmt: skip

    # ---- setup ------------------------------------------------------------------------------------

    def _start(self, default: TrainConfig, budget: MemoryBudget) -> tuple[TrainConfig, str]:
        """The default if it fits (or the budget is at least the default's own peak), else the first
        of smaller micro-batches (on ranks: each at the lowest ZeRO stage that fits), then
        recompute on every block, that the gate admits."""
        verdict = self.gate.check(default)
        if verdict.admitted or (budget.fraction is not None and budget.fraction >= 1.0):
            return default, ""
        batch, tried = default.micro_batch_size, []
        stages = range(4) if default.ranks > 1 else range(1)
        for ckpt in (False, True):
            micro = batch
            while micro >= 1:
                for stage in stages if batch % micro == 0 else ():
                    config = _split(default, micro, ckpt, stage)
                    candidate = self.gate.check(config)
                    if candidate.admitted:
                        return config, f"the default {_over(verdict)}; {candidate.reason}"
                    tried.append(candidate)
                micro //= 2
        smallest = min((v.predicted for v in tried if v.predicted is not None), default=None)
        per_rank = " per rank" if default.ranks > 1 else ""
        raise ConfigError(
            f"memory_budget {self.budget_bytes} B{per_rank} is below every fp32 configuration of batch "
            f"{default.effective_batch_size} (smallest predicted peak {smallest} B, +{self.gate.headroom:.0%} "
            "headroom): raise the budget."
        )

    # ---- the run ------------------------------------------------------------------------------------

    @property
    def config(self) -> TrainConfig:
        """The configuration the next step runs under."""
        return self.trainer.config

    @property
    def history(self) -> tuple[Change, ...]:
        """Every decision so far: applied, refused by the budget gate, or reverted."""
        return tuple(self._history)

    @property
    def configs(self) -> tuple[ConfigRecord, ...]:
        """Every configuration judged so far (measured peak and throughput), in the order first run."""
        return tuple(self._judged.values())

    @property
    def best(self) -> ConfigRecord | None:
        """The judged configuration with the most throughput (goodput with ``adapt_batch``) per GiB
        of peak within the budget: what a study would recommend among them."""
        fits = [r for r in self._judged.values() if r.score.peak_bytes <= self.budget_bytes]
        return max(fits, key=lambda r: r.score.per_gib, default=None)

    @property
    def model(self) -> torch.nn.Module:
        """The user's model (on ranks there is none here: each rank trains its own copy)."""
        return self._in_place().model

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._in_place().optimizer

    def _in_place(self) -> InPlaceTrainer:
        if not isinstance(self.trainer, InPlaceTrainer):
            raise UnsupportedError(
                "Adaptive.on_ranks trains the model in the rank processes: there is no model or optimizer "
                "object in this one."
            )
        return self.trainer

    def step(self) -> AdaptStep:
        """One optimizer step of the user's model; every ``decide_every`` steps, one decision."""
        t, config = self.trainer, self.trainer.config
        index, peak = t.step_count, None
        decision_due = (index + 1) % self.decide_every == 0
        if t.noise is not None:
            # The noise estimate folds in only the last steps before a decision (see SampledNoise).
            t.noise.enabled = self._noise and (-(index + 1)) % self.decide_every < _NOISE_STEPS
        # Adam creates its state in the first step, after the activation peak: track from step 1.
        if self.track_memory and index >= 1 and config not in self.gate.measured:
            result, peak = t.measured_step()
            self.gate.record(config, peak)
            if config == self._default and self._fraction is not None:
                # A percentage is of the default's peak: its measurement replaces its prediction
                # (they differ by a few hundred bytes on the local runner).
                self.budget_bytes = self.gate.budget = max(self.budget_bytes, int(peak * self._fraction))
        elif self._noise and decision_due and t.noise_split == 2:
            result = t.step(split=2)  # two batch sizes for the noise estimate: same gradient
        else:
            result = t.step()
            if index >= 1:
                self._recent.append(result.samples / result.seconds)
                self._timed.setdefault(config, []).append(result.samples / result.seconds)
        record = AdaptStep(step=index, loss=result.loss, samples=result.samples, seconds=result.seconds, lr=result.lr,
                           config=config, peak_bytes=peak)  # fmt: skip
        self.steps.append(record)
        if peak is not None and peak > self.budget_bytes and config != self._previous:
            self._revert(config, peak)
        elif decision_due:
            self._decide()
        return record

    def _observation(self) -> Observation:
        t, config = self.trainer, self.trainer.config
        peak = self.gate.measured.get(config)
        if peak is None:
            predicted = self.gate.predict(config)
            peak = predicted[0] if predicted is not None else self.budget_bytes
        return Observation(
            step=t.step_count,
            config=config,
            throughput=statistics.median(self._recent) if self._recent else 0.0,
            peak_bytes=peak,
            b_noise=t.noise.estimate().b_simple if self._noise and t.noise is not None else None,
            losses=tuple(s.loss for s in self.steps[-_LOSSES:]),
        )

    def _decide(self) -> None:
        obs = self._observation()
        self._judge(obs)
        if self._back_if_worse(obs):
            return
        proposal: Proposal | None = None
        source = "adapt_batch"
        if self.adapt_batch:
            proposal = grow_batch(obs, base_batch_size=self.workload.batch_size, min_efficiency=self.min_efficiency,
                                  max_batch_size=self.max_batch_size)  # fmt: skip
        if proposal is None and self.source is not None:
            proposal, source = self.source.propose(obs), self.source.name
        if proposal is None or proposal.config == obs.config:
            return
        known, here = self._trusted(proposal.config), self._trusted(obs.config)
        if known is not None and here is not None and known.score.per_gib < (1 + _MARGIN) * here.score.per_gib:
            # Measured before, and not clearly better: going there again would only pay the move.
            if proposal.config not in self._refused:
                self._refused.add(proposal.config)
                why = (f"measured at step {known.step}: {known.score.per_gib:.1f} per GiB, not {_MARGIN:.0%} above "
                       f"this configuration's {here.score.per_gib:.1f}")  # fmt: skip
                self._history.append(Change(step=obs.step, source=source, before=obs.config, after=proposal.config,
                                            applied=False, reason=f"{proposal.reason}; {why}",
                                            measured_bytes=known.score.peak_bytes))  # fmt: skip
            return
        verdict = self.gate.check(proposal.config)
        if not verdict.admitted:
            if proposal.config not in self._refused:  # once per config: a fixed source proposes it every time
                self._refused.add(proposal.config)
                self._history.append(self._change(obs, proposal, source, verdict, applied=False))
            return
        start = time.perf_counter()
        rebuilt = self.trainer.reconfigure(proposal.config)
        change = self._change(obs, proposal, source, verdict, applied=True)
        if rebuilt is not None:  # new DeepSpeed engines, the state carried over: what the seconds paid for
            change = dataclasses.replace(change, reason=f"{change.reason}; new engines: {rebuilt.partition(':')[0]}")
        self._history.append(dataclasses.replace(change, seconds=time.perf_counter() - start))
        self._previous, self._recent, self._on_trial = obs.config, [], True

    def _back_if_worse(self, obs: Observation) -> bool:
        """Measurement overrules the decision source: a configuration a proposal brought is kept
        only if it measures more than the margin above the best configuration measured so far
        (objective per GiB, :func:`autotune.measurement.objective.score`, within the budget);
        otherwise the run goes back to that best, and the source's later proposals of it are
        refused (above). The best, not only the one it replaced: a source that keeps walking one
        way (the pretrained policy toward less memory: 4x8 -> 2x16 -> 1x32 on hf-gpt2, each step
        a little worse) would otherwise be taken back one step only; and more than the margin
        above it: a configuration of about equal worth that stayed would, on a machine whose
        timings wander by 10%, let the run drift from neighbour to neighbour on noise. Each trial
        is decided once, at the first decision its throughput is a median of enough timed steps:
        the run then loses against its best only for the ``decide_every`` steps it takes to find
        out, and does not go back and forth on re-measures."""
        if not self._on_trial:  # the run is where measurement put it: no going back and forth on noise
            return False
        here = self._trusted(obs.config)
        if here is None:  # not enough timed steps yet: the trial goes on
            return False
        self._on_trial = False
        others = [r for c, r in self._judged.items() if c != obs.config and r.score.peak_bytes <= self.budget_bytes
                  and self._trusted(c) is not None]  # fmt: skip
        best = max(others, key=lambda r: r.score.per_gib, default=None)
        if best is None or here.score.per_gib > (1 + _MARGIN) * best.score.per_gib:
            return False
        start = time.perf_counter()
        self.trainer.reconfigure(best.config)
        which = "the configuration it replaced" if best.config == self._previous else "the best measured configuration"
        reason = (f"measured {here.score.per_gib:.1f} per GiB, not {_MARGIN:.0%} above the {best.score.per_gib:.1f} "
                  f"of {which}: back to it")  # fmt: skip
        self._history.append(Change(step=obs.step, source="measured", before=obs.config, after=best.config,
                                    applied=True, reason=reason, measured_bytes=best.score.peak_bytes,
                                    seconds=time.perf_counter() - start))  # fmt: skip
        self._previous, self._recent = obs.config, []
        return True

    def _trusted(self, config: TrainConfig) -> ConfigRecord | None:
        """``config``'s record if its throughput is a median of enough timed steps to act on."""
        record = self._judged.get(config)
        return record if record is not None and record.timed_steps >= _TRUSTED_STEPS else None

    def _judge(self, obs: Observation) -> None:
        """Record ``obs.config``'s objective once its peak is measured and its steps timed: the
        median throughput of its untracked steps over every stint the run spent in it, so that
        the configuration the run keeps returning to is not judged by its latest stint alone
        (on a shared machine one stint can time 20% off another, and a latest slow one would
        make a configuration left long ago look like the best)."""
        timed = self._timed.get(obs.config, [])
        if not timed or obs.config not in self.gate.measured:
            return
        judged = score(throughput=statistics.median(timed), peak_bytes=obs.peak_bytes,
                       batch_size=obs.config.effective_batch_size, base_batch_size=self.workload.batch_size,
                       noise_scale=obs.b_noise,
                       batch_is_knob=self.adapt_batch)  # fmt: skip
        # A config judged again keeps its place (dicts keep first insertion order).
        self._judged[obs.config] = ConfigRecord(step=obs.step, config=obs.config, timed_steps=len(timed),
                                                noise_scale=obs.b_noise, score=judged)  # fmt: skip

    def _change(self, obs: Observation, proposal: Proposal, source: str, verdict: Verdict, *, applied: bool) -> Change:
        return Change(step=obs.step, source=source, before=obs.config, after=proposal.config, applied=applied,
                      reason=f"{proposal.reason}; {verdict.reason}", predicted_bytes=verdict.predicted,
                      measured_bytes=verdict.measured)  # fmt: skip

    def _revert(self, config: TrainConfig, peak: int) -> None:
        """A tracked step measured ``config`` over the budget (the prediction was off): go back."""
        self.trainer.reconfigure(self._previous)
        reason = f"measured {peak} B > budget {self.budget_bytes} B: back to {self._previous.describe()}"
        self._history.append(Change(step=self.trainer.step_count, source="budget", before=config, after=config,
                                    applied=False, reverted=True, reason=reason, measured_bytes=peak))  # fmt: skip
        self._refused.add(config)
        self._recent = []

    def close(self) -> None:
        """Remove every wrapper and hook from the user's model: it is exactly as it was given (on
        ranks: close their engines and reap every process)."""
        self.trainer.close()

    def __enter__(self) -> Adaptive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _split(config: TrainConfig, micro: int, checkpoint: bool, zero_stage: int = 0) -> TrainConfig:
    accum = config.micro_batch_size * config.grad_accum_steps // micro  # per rank: the ranks stay
    return dataclasses.replace(config, micro_batch_size=micro, grad_accum_steps=accum, checkpoint=checkpoint,
                               zero_stage=zero_stage)  # fmt: skip


def _over(verdict: Verdict) -> str:
    return f"is over the budget ({verdict.reason})"
