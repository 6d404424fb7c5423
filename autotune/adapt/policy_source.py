"""A trained policy (the shipped pretrained PPO one, or a user's policy file) as a decision source.

The policy sees the observation vector of the tuning environments (:class:`autotune.envs.core.TuningEnv`'s
table: gradient noise, memory pressure, loss trend, throughput, knob levels, model and machine
descriptors) built from what the user's run measured, and answers with a ``MultiDiscrete`` action.
Its actions mean what they mean in the environments (the codec's ``apply_action``, ``autotune/envs/_codec.py``):
the split of the user's effective batch moves (micro-batch x2 and accumulation /2, or the
reverse), never the batch; precision, checkpointing and selective recompute move by quarters of
the blocks, hungriest first, and the outer parts (embeddings, final norm, head, loss) between fp32
and the run's reduced precision; the ZeRO stage is the action's on DeepSpeed ranks and 0 on one
process. A split the environments' level tables cannot express (a batch that is not a power of
two) gets no proposal.

With a start plan (on the CPU by default) the source also holds the model's calibrated simulator:
the run starts at its best configuration; a policy action the simulator rates well below where
the run is (under :data:`_NEIGHBOUR_WITHIN` of it) is not tried, and when the policy has nothing
new to propose, the source proposes the untried neighbour the simulator ranks best; the run's
measurements judge every proposal (:class:`autotune.adapt.decider.Decider`). Without a plan (on a
GPU by default, on ranks) the policy's actions are proposed as they are.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.adapt.sources import DecisionSource, Observation, Proposal, RunContext, reduced_of, selective_in_play
from autotune.dependencies import install_command
from autotune.envs._codec import ZERO_STAGES, apply_action, knobs_to_config, levels_of
from autotune.errors import MissingDependencyError
from autotune.measurement.probe import probe_workload
from autotune.measurement.progress import PhaseClock, phase_line
from autotune.tuning import TUNING
from autotune.units import format_bytes

if TYPE_CHECKING:
    from collections.abc import Mapping

    import numpy as np

    from autotune.config import TrainConfig
    from autotune.envs._codec import Levels
    from autotune.envs.calibration import WorkloadProfile
    from autotune.envs.core import MachineDescriptor, ModelDescriptor
    from autotune.knobs import Knobs
    from autotune.measurement.probe import MachineSpeeds

__all__ = ["PolicySource"]

#: The neighbours tried, and the policy's actions tried, are those the plan's simulator rates at
#: least this fraction of the run's configuration: below it, tried neighbours measured worse and
#: raised the run's peak (docs/benchmark-log.md, "Why the run starts at the simulator's plan").
_NEIGHBOUR_WITHIN = 0.9


def _load(directory: Path | None) -> Any:
    try:
        from autotune.policies.ppo import PRETRAINED_DIR, load_policy
    except ImportError as e:
        raise MissingDependencyError(
            f"a policy decision source needs stable-baselines3 and gymnasium, which cannot be imported ({e}): "
            f"{install_command()} installs them."
        ) from None
    return load_policy(directory or PRETRAINED_DIR)


def _probed(speeds: MachineSpeeds) -> str:
    """What the machine probe found, in words (``bf16 0.42x fp32's step time, recompute +31%``)."""
    recompute = f"recompute {speeds.recompute_cost:+.0%}"
    if speeds.reduced_speed <= 0:
        return f"no bf16 steps ({speeds.reduced_failure}), {recompute}"
    return f"bf16 {1 / speeds.reduced_speed:.2f}x fp32's step time, {recompute}"


class PolicySource(DecisionSource):
    """Decisions from a policy file (default: the shipped pretrained policy).

    ``policy="pretrained"`` or a policy directory makes one (:func:`autotune.adapt.decision_source`).

    Args:
        directory: The policy's directory (None: the shipped pretrained policy).
        horizon: Decisions after which the observation's "fraction of the training budget used"
            reads 1 (the policy was trained on 16-step episodes).
        plan: Start the run at the calibrated simulator's best configuration (:meth:`plan`);
            None (default): on when the run's model is on the CPU, off on a GPU, where the
            profile's copies of the model would take memory the budget does not count.

    Raises:
        MissingDependencyError: stable-baselines3 or gymnasium is not installed.

    Example:
        >>> from autotune.adapt import PolicySource
        >>> source = PolicySource(plan=False)  # the shipped pretrained policy
        >>> source.name, source.needs_noise
        ('policy', True)
    """

    name = "policy"
    needs_noise = True

    def __init__(
        self, directory: str | Path | None = None, *, horizon: int = TUNING.horizon, plan: bool | None = None
    ) -> None:
        self.policy = _load(None if directory is None else Path(directory))
        self.horizon = horizon
        self.plan_start = plan
        self._context: RunContext | None = None
        self._model: ModelDescriptor | None = None
        self._machine: MachineDescriptor | None = None
        self._decisions = 0
        self._first: Observation | None = None
        self._reduced_ok = True
        self._held = False  # the model is held in 16 bits: the user's precisions stay (_kept)
        self._ranks = 1
        self._profile: WorkloadProfile | None = None  # the plan's calibrated simulator
        self._proposed: set[TrainConfig] = set()

    def start(self, context: RunContext) -> None:
        """Measure the machine on a copy of the run's model (bf16 speed, recompute cost) and describe the model."""
        from autotune.envs.core import MachineDescriptor, ModelDescriptor, model_state_bytes

        self._context = context
        self._ranks = context.start.ranks
        began = time.perf_counter()
        speeds = probe_workload(context.workload, context.start)
        context.note(phase_line(f"machine probe: {_probed(speeds)}", began, "real steps on a copy"))
        self._reduced_ok = speeds.reduced_speed > 0
        self._held = context.workload.held_in_16_bits is not None
        blocks, params = context.blocks, context.workload.num_parameters
        self._model = ModelDescriptor.describe(
            num_parameters=params, block_bytes=blocks.saved_bytes, samples=blocks.micro_batch_size
        )
        states = model_state_bytes(context.workload.model)
        self._machine = MachineDescriptor(
            reduced_speed=speeds.reduced_speed,
            recompute_cost=speeds.recompute_cost,
            budget_ratio=context.budget_bytes / states,
        )

    def state_dict(self) -> dict[str, Any]:
        """The decisions made, the configurations proposed (never proposed again) and the first
        observation (what the policy's observation is relative to)."""
        first = self._first
        return {
            "decisions": self._decisions,
            # sorted: a set's order depends on its history, and equal states should save equal
            "proposed": sorted((c.to_dict() for c in self._proposed), key=lambda d: json.dumps(d, sort_keys=True)),
            "first": None if first is None else {**dataclasses.asdict(first), "config": first.config.to_dict()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (a resumed run proposes nothing it proposed before)."""
        from autotune.config import TrainConfig

        self._decisions = state["decisions"]
        self._proposed = {TrainConfig.from_dict(c) for c in state["proposed"]}
        first = state["first"]
        self._first = (
            None
            if first is None
            else Observation(
                **{**first, "config": TrainConfig.from_dict(first["config"]), "losses": tuple(first["losses"])}
            )
        )

    def plan(self, context: RunContext) -> Proposal | None:
        """Where the run starts: the best configuration on the model's calibrated simulator
        (:func:`autotune.policies.transfer.simulated_best` over a quick profile on copies of the
        model, seconds) that the run's budget gate admits, over the split, the blocks' precision,
        whole and selective recompute (where
        :func:`~autotune.adapt.sources.selective_in_play` says the run's gate profiles it)
        and the outer parts' precision; fp32 only (blocks and outer parts) where the machine probe
        found no usable bf16. The run then starts near its optimum instead of walking there one
        decision at a time from the default, whose peak it would hold first; the policy and the
        run's measurements take it from there. One process only; None when the model cannot be
        profiled (the run then starts where the budget put it).

        The profile holds copies of the model (one per timed configuration, with their optimizer
        state) and runs the default configuration among them: so on a GPU it is off unless asked
        for (``PolicySource(plan=True)``), and ``plan=False`` turns it off everywhere. Why it is
        on by default on the CPU: docs/benchmark-log.md, "Why the run starts at the simulator's plan".

        Args:
            context: What the source knows of the run.

        Returns:
            The simulator's best admitted configuration, or None.
        """
        wanted = context.device_type == "cpu" if self.plan_start is None else self.plan_start
        if not wanted or context.start.ranks != 1:
            return None
        from autotune.errors import ProposalError
        from autotune.policies.transfer import quick_profile, simulated_best

        started = time.perf_counter()
        clock = PhaseClock(context.note, "start plan: ")
        try:
            profile = quick_profile(context.workload, progress=clock)
        except ProposalError as e:  # the run starts where the budget put it, and says why
            import warnings

            from autotune.errors import AutotuneWarning

            clock.end()
            warnings.warn(AutotuneWarning(f"no start plan: {e}"), stacklevel=2)
            return None
        clock.end()  # a phase that raised anything else is not said: the error says what happened

        def admits(knobs: Knobs) -> bool:
            return context.admits(self._kept(knobs.to_config(context.ranking, base=context.start), context.start))

        batch = context.start.effective_batch_size
        # The policy moves the selective level and the outer precision, so the run may start at
        # them where the run's gate profiles them (selective_in_play, outer_in_play: for the
        # policy, both), the outer parts where the blocks' reduced precision may run (the probe's rule).
        selective = selective_in_play(self, context.start, len(context.ranking))
        best = simulated_best(
            profile,
            batch_size=batch,
            admits=admits,
            reduced=self._reduced_ok,
            selective=selective,
            outer=self._reduced_ok,
        )
        if best is None:
            budget = format_bytes(context.budget_bytes)
            # The callbacks' default budget is the run's own peak: under bf16 + every block
            # recomputed (Hugging Face's recipe) nothing else fits, and the run stays where it is.
            context.note(phase_line(f"start plan: nothing fits the memory budget of {budget}; the run stays", started))
            return None
        self._profile = profile
        config = self._kept(best[0].to_config(context.ranking, base=context.start), context.start)
        self._proposed.add(config)
        seconds = time.perf_counter() - started
        context.note(phase_line(f"start plan: {config.describe()}", started, "the calibrated simulator's best"))
        reason = f"the best of the calibrated simulator ({best[1]:.0f} samples/s per GiB simulated; {seconds:.0f} s)"
        return Proposal(config=config, reason=reason)

    def observation(self, obs: Observation) -> np.ndarray:
        """The environments' observation vector (:func:`autotune.envs.core.observation_vector`) for ``obs``."""
        from autotune.envs.core import Interval, observation_vector

        assert self._context is not None and self._first is not None, "start() and a first observation"
        assert self._model is not None and self._machine is not None
        levels = levels_of(obs.config, len(self._context.ranking))
        assert levels is not None, "propose() only observes configurations the levels can express"

        def interval(o: Observation) -> Interval:
            return Interval(
                batch=o.config.effective_batch_size,
                throughput=o.throughput,
                peak_bytes=o.peak_bytes,
                b_noise=o.b_noise,
                loss=o.losses[-1] if o.losses else 0.0,
                train_seconds=0.0,
                reconfig_seconds=0.0,
            )

        batch = obs.config.effective_batch_size
        return observation_vector(
            interval(obs),
            first=interval(self._first),
            losses=list(obs.losses),
            t=min(self._decisions, self.horizon),
            horizon=self.horizon,
            levels=levels,
            model=self._model,
            machine=self._machine,
            budget=self._context.budget_bytes,
            batch=batch,
            batch0=batch,
            ranks=self._ranks,
            adapt_batch=False,
        )

    def propose(self, observation: Observation) -> Proposal | None:
        """The policy's move from ``observation``, or a close neighbour the simulator rates as good; None to stay."""

        assert self._context is not None, "start() first"
        ranking = self._context.ranking
        levels = levels_of(observation.config, len(ranking))
        if levels is None:  # a split the level tables cannot express (not powers of two): keep it
            return None
        if self._first is None:
            self._first = observation
        action = tuple(int(a) for a in self.policy.act(self.observation(observation)))
        self._decisions += 1
        # The environments' action semantics, applied by their own function: the split moves, the
        # effective batch never does (no batch adaptation here); ZeRO only on ranks.
        moved = apply_action(levels, action, max_zero_stage=ZERO_STAGES - 1 if self._ranks > 1 else 0)
        if not self._reduced_ok:  # a reduced precision this machine cannot run is never proposed
            moved = dataclasses.replace(moved, precision=0, outer=False)
        config = self._kept(
            knobs_to_config(
                moved, ranking, reduced=reduced_of(observation.config), ranks=self._ranks, base=observation.config
            ),
            observation.config,
        )
        if config == observation.config or config in self._proposed:
            return self._neighbour(observation, levels, "")
        self._proposed.add(config)
        rated = self._rated(moved, levels, observation.config.effective_batch_size)
        if rated is not None and rated < _NEIGHBOUR_WITHIN:
            # A real trial of it would cost steps at a configuration this model's own calibrated
            # simulator rates well below where the run is.
            return self._neighbour(
                observation,
                levels,
                f"policy action {action} rated {rated:.2f} of this configuration on the simulator, not tried; ",
            )
        return Proposal(config=config, reason=f"policy action {action}")

    def _kept(self, config: TrainConfig, base: TrainConfig) -> TrainConfig:
        """``config`` with ``base``'s precisions on a model held in 16 bits (:attr:`Workload.held_in_16_bits`):
        no precision knob changes its step there, so none moves away from the user's own (their
        ``bf16=True`` autocast stays on every block)."""
        if not self._held:
            return config
        return dataclasses.replace(config, precision=base.precision, outer_precision=base.outer_precision)

    def _rated(self, moved: Levels, levels: Levels, batch: int) -> float | None:
        """``moved``'s simulated samples/s per GiB over ``levels``' on the plan's calibrated
        simulator, or None without one (no plan, or on ranks, whose collectives it does not model)."""
        if self._profile is None or self._ranks != 1:
            return None
        return self._simulated(moved, batch) / self._simulated(levels, batch)

    def _simulated(self, knobs: Levels, batch: int) -> float:
        from autotune.envs.costmodel import step_cost
        from autotune.measurement.objective import per_gib

        assert self._profile is not None
        if self._profile.reduced_failure is not None:
            # An fp32-only profile prices reduced settings as infeasible (0 per GiB). The run's own
            # reduced outer precision is the user's autocast over a model held in 16 bits (no
            # proposal moves into one otherwise): the same step as fp32 there, so priced as fp32.
            knobs = dataclasses.replace(knobs, precision=0, outer=False)
        cost = step_cost(self._profile, knobs)
        return per_gib(batch / cost.seconds, cost.peak_bytes)

    def _neighbour(self, observation: Observation, levels: Levels, why: str) -> Proposal | None:
        """When the policy has nothing new (its action keeps the configuration, or proposes one
        it proposed before, which the run measured or refused): the untried neighbour (one knob
        moved by one level: :func:`autotune.knobs.neighbours` through the level tables, as the
        climb that ends a ``tune`` episode moves; more reduced precision only where the machine
        probe found it usable; the ZeRO stage stays) with the most simulated samples/s per GiB
        on the plan's calibrated simulator, if the run's gate admits it. The run's measurements
        judge it like any proposal (a worse one is left for the best measured configuration),
        so from the plan the run climbs to a measured local optimum: the policy, trained to walk
        toward less memory from the default, does not propose the neighbours with more (on a
        4-block GPT-2 it walked 4x8 -> 2x16 -> 1x32 and back, while a study's best was 8x4).
        Only neighbours the simulator rates within :data:`_NEIGHBOUR_WITHIN` of the current
        configuration are tried: each trial costs a decision interval at a configuration that may
        be worse, and a tried one with more memory raises the run's peak. None without a plan (no
        simulator), or when no untried neighbour is that close."""
        assert self._context is not None
        if self._profile is None or self._ranks != 1:
            return None
        from autotune.policies.climb import level_neighbours

        ranking = self._context.ranking
        around = level_neighbours(levels, num_blocks=len(ranking), selective=True, outer=True)
        if not self._reduced_ok:  # a reduced precision this machine cannot run is never proposed
            around = [m for m in around if m.precision <= levels.precision and m.outer <= levels.outer]
        batch = observation.config.effective_batch_size
        floor = _NEIGHBOUR_WITHIN * self._simulated(levels, batch)
        ranked: list[tuple[float, TrainConfig]] = []
        for moved in around:
            config = knobs_to_config(moved, ranking, reduced=reduced_of(observation.config), base=observation.config)
            config = self._kept(config, observation.config)
            if config in self._proposed or config == observation.config or not self._context.admits(config):
                continue
            value = self._simulated(moved, batch)
            if value >= floor:
                ranked.append((value, config))
        if not ranked:
            return None
        value, config = max(ranked, key=lambda t: t[0])
        self._proposed.add(config)
        return Proposal(config=config, reason=f"{why}an untried neighbour ({value:.0f} samples/s per GiB simulated)")
