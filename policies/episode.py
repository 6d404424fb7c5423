"""One episode of a policy on the real training loop, as a record: what ``autotune tune`` shows.

:func:`run_episode` drives a :class:`~autotune.envs.training.TrainingEnv` with a policy and
returns an :class:`Episode`: every step's action, the configuration it led to (the shared
:class:`~autotune.Knobs` encoding and the full :class:`~autotune.TrainConfig`), what the step
measured and its reward. The CLI prints it as a table or, with ``--json``, as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from autotune.config import TrainConfig
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName
from autotune.measurement.progress import phase_line
from autotune.tuning import TUNING

if TYPE_CHECKING:
    from autotune.envs.training import TrainingEnv
    from autotune.policies.ppo import Policy

    from autotune.knobs import Knobs
    from autotune.measurement.objective import Score
    from autotune.measurement.sidebyside import Timing
    from autotune.workload import Workload

__all__ = ["FINALISTS", "Episode", "EpisodeStep", "retime_best", "run_episode"]

#: The best steps re-timed side by side before ``tune`` names its best (as a study's finalists).
FINALISTS = TUNING.finalists


@dataclass(frozen=True, kw_only=True)
class EpisodeStep:
    """One environment step (step 0: the configuration the episode starts from, no action)."""

    step: int
    action: tuple[int, ...] | None
    knobs: str  # Knobs.describe(): batch, split, precision and recompute counts, ZeRO stage
    batch: int  # the effective batch (all ranks): the user's unless batch adaptation is on
    config: TrainConfig
    throughput: float
    peak_bytes: int
    b_noise: float | None
    loss: float
    reward: float | None
    #: Who chose the step's action: "policy", "climb" (:mod:`autotune.policies.climb`), None at step 0.
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "config": self.config.to_dict()}


@dataclass(frozen=True, kw_only=True)
class Episode:
    """A whole episode: ``steps[0]`` is the start, ``steps[-1]`` where the policy left the run."""

    workload: str
    budget_bytes: int
    steps: tuple[EpisodeStep, ...]
    adapt_batch: bool = False  # the batch was a knob: steps are judged by goodput
    #: Which step within the budget is best: the most value per GiB of peak, or the most value
    #: (:data:`autotune.measurement.objective.OBJECTIVES`).
    objective: ObjectiveName = DEFAULT_OBJECTIVE
    #: The best steps re-timed side by side (:func:`retime_best`): their step numbers, re-timed
    #: samples/s and spread, the winner and whether it was separated from the runner-up.
    retimed: dict[str, Any] | None = None

    @property
    def total_reward(self) -> float:
        return sum(s.reward for s in self.steps if s.reward is not None)

    @property
    def best(self) -> EpisodeStep | None:
        """The measured step within the budget with the most throughput (goodput with batch
        adaptation) per GiB of peak, or the most throughput under the ``throughput``
        :attr:`objective`, by the objective the study and the environments use
        (:func:`autotune.measurement.objective.score`); None if no step with a finite loss fitted
        the budget (:attr:`nothing_fits` says by how much)."""
        if self.retimed is not None:  # the winner of the best steps re-timed side by side
            winner: int = self.retimed["winner"]
            return next(s for s in self.steps if s.step == winner)
        ranked = self.ranked()
        return ranked[0] if ranked else None

    def per_gib(self, s: EpisodeStep) -> float:
        """``s``'s objective per GiB of its peak (:func:`autotune.measurement.objective.score`)."""
        return self._score(s).per_gib

    def value(self, s: EpisodeStep) -> float:
        """What :attr:`objective` ranks ``s`` by (:meth:`autotune.measurement.objective.Score.under`)."""
        return self._score(s).under(self.objective)

    def _score(self, s: EpisodeStep) -> Score:
        from autotune.measurement.objective import score

        return score(
            throughput=s.throughput,
            peak_bytes=s.peak_bytes,
            batch_size=s.batch,
            base_batch_size=self.steps[0].batch,
            noise_scale=s.b_noise,
            batch_is_knob=self.adapt_batch,
        )

    def ranked(self, *, distinct: bool = True) -> list[EpisodeStep]:
        """Steps with a finite loss within the budget, best first by :attr:`objective`, one per
        configuration (``distinct=False``: every such step)."""
        fits = [s for s in self.steps if s.peak_bytes <= self.budget_bytes and math.isfinite(s.loss)]
        fits.sort(key=lambda s: (-self.value(s), s.step))
        if not distinct:
            return fits
        out: list[EpisodeStep] = []
        for s in fits:
            if all(o.config != s.config for o in out):
                out.append(s)
        return out

    @property
    def nothing_fits(self) -> str | None:
        """Why there is no :attr:`best`, in one line (None when there is one): a start over the
        budget and every action refused must not read as a configuration that fits."""
        if self.best is not None:
            return None
        from autotune.units import format_bytes

        lowest = min(self.steps, key=lambda s: s.peak_bytes)
        return (
            f"nothing measured fitted the budget of {format_bytes(self.budget_bytes)}: the lowest peak was "
            f"{format_bytes(lowest.peak_bytes)} (step {lowest.step}, {lowest.knobs})"
        )

    @property
    def start_config(self) -> TrainConfig:
        return self.steps[0].config

    @property
    def final_config(self) -> TrainConfig:
        return self.steps[-1].config

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        # The objective only when it is not the default (per GiB: what an episode without the key means).
        objective = {} if self.objective == DEFAULT_OBJECTIVE else {"objective": self.objective}
        return {
            "workload": self.workload,
            "budget_bytes": self.budget_bytes,
            "adapt_batch": self.adapt_batch,
            **objective,
            "return": self.total_reward,
            "start_config": self.start_config.to_dict(),
            "final_config": self.final_config.to_dict(),
            "best_step": None if best is None else best.step,  # None: nothing fitted the budget
            "best_config": None if best is None else best.config.to_dict(),
            "nothing_fits": self.nothing_fits,
            "retimed": self.retimed,
            "steps": [s.to_dict() for s in self.steps],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def run_episode(
    env: TrainingEnv,
    policy: Policy,
    *,
    workload: str,
    seed: int,
    steps: int,
    refine: int = 0,
    objective: ObjectiveName = DEFAULT_OBJECTIVE,
    note: Callable[[str], None] | None = None,
) -> Episode:
    """Reset ``env`` with ``seed`` and let ``policy`` act for at most ``steps`` steps (fewer if the
    episode terminates). Each step trains the real model ``env.steps_per_action`` optimizer steps.

    The last ``refine`` steps, and with ``refine`` > 0 every step after the policy first proposes
    to stay where it is or a move the environment refuses, are a greedy climb from the best step
    so far by ``objective`` instead (:class:`~autotune.policies.climb.Climb`; ``tune`` passes a
    quarter of its steps); a step the climb has no move for is the policy's. ``refine=0`` is the
    policy alone. The policy acts on its observation and reward either way (the environment's
    reward is per GiB); ``objective`` decides the climb's incumbent and the episode's best.
    ``note`` gets one line per step (who chose it, where it went, what it measured, its seconds)."""
    from autotune.policies.climb import Climb, settled

    start = time.perf_counter()
    obs, info = env.reset(seed=seed)
    records = [_record(env, 0, None, info, None, None)]
    _say(note, records[-1], start)
    knobs = [info["knobs"]]
    climb = Climb(env) if refine > 0 else None
    climbing = False
    for t in range(1, steps + 1):
        action: tuple[int, ...] | None = tuple(int(a) for a in policy.act(obs))
        source = "policy"
        if climb is not None:
            assert action is not None
            climbing = climbing or t > steps - refine or settled(env, action)
            if climbing:
                partial = Episode(
                    workload=workload,
                    budget_bytes=int(info["budget_bytes"]),
                    steps=tuple(records),
                    adapt_batch=env.adapt_batch,
                    objective=objective,
                )
                chosen = climb.action(_measured(partial, knobs))
                if chosen is not None:
                    action, source = chosen, "climb"
        assert action is not None
        start = time.perf_counter()
        obs, reward, terminated, _, info = env.step(np.asarray(action))
        if climb is not None:
            climb.stepped(info["knobs"])
            # A move the environment refused (over the budget, a precision this machine cannot
            # run) leaves the run where it was, as staying does, and the policy, seeing nearly
            # the same observation, proposes it again: on lstm-lm on an AVX2 CPU it asked for
            # bf16 blocks six steps running (the picks benchmark, docs/benchmark-log.md).
            climbing = climbing or (source == "policy" and "over_budget" in info["reward_terms"])
        records.append(_record(env, t, action, info, float(reward), source))
        _say(note, records[-1], start)
        knobs.append(info["knobs"])
        if terminated:
            break
    return Episode(
        workload=workload,
        budget_bytes=int(info["budget_bytes"]),
        steps=tuple(records),
        adapt_batch=env.adapt_batch,
        objective=objective,
    )


def _measured(partial: Episode, knobs: list[Knobs]) -> list[tuple[Knobs, float | None]]:
    """Each step's knobs with its value by the episode's objective, None for a step its ranking
    does not count (what the climb chooses its incumbent among)."""
    counted = {s.step for s in partial.ranked(distinct=False)}
    return [(k, partial.value(s) if s.step in counted else None) for k, s in zip(knobs, partial.steps, strict=True)]


def _say(note: Callable[[str], None] | None, s: EpisodeStep, start: float) -> None:
    """A step's line: ``step 1 (policy): 8x4 ckpt:2: 12.0 samples/s, peak 39.35 MiB (2.1 s)``."""
    from autotune.units import format_bytes

    if note is not None:
        what = f"step {s.step} ({s.source or 'start'}): {s.knobs}: {s.throughput:.1f} samples/s"
        note(phase_line(f"{what}, peak {format_bytes(s.peak_bytes)}", start))


def _record(
    env: TrainingEnv,
    step: int,
    action: tuple[int, ...] | None,
    info: dict[str, Any],
    reward: float | None,
    source: str | None,
) -> EpisodeStep:
    return EpisodeStep(
        step=step,
        action=action,
        knobs=env.knobs.describe(),
        batch=int(info["batch"]),
        config=env.config_of(env.knobs),
        throughput=float(info["throughput"]),
        peak_bytes=int(info["peak_bytes"]),
        b_noise=None if info["b_noise"] is None else float(info["b_noise"]),
        loss=float(info["loss"]),
        reward=reward,
        source=source,
    )


def retime_best(
    episode: Episode,
    workload: Workload,
    *,
    beside: Sequence[tuple[TrainConfig, float]] = (),
    device: str | None = None,
    threads: int = 1,
) -> tuple[Episode, tuple[Timing, ...]]:
    """``episode`` with its best :data:`FINALISTS` distinct configurations re-timed side by side
    (:func:`autotune.measurement.sidebyside.retime_configs`, valued by the episode's objective:
    per GiB of each step's measured peak, or samples/s; the re-timed value per GiB is recorded
    either way): one step of an episode is one stint, and on a busy machine one configuration measured
    10.2 and 126.6 samples/s in two steps of one episode.

    Args:
        episode: The episode whose best steps are re-timed.
        workload: Its workload (a private copy of its model is trained).
        beside: Other configurations timed in the same interleaved run, each with the scale
            that turns its samples/s into the value compared (``tune``'s baselines: 1 / GiB of
            its peak, or 1): they compete for the rounds but never for the episode's best. One
            equal to a best step's configuration is that step's timing, not timed twice.
        device: Where the loop runs (None: CUDA when available).
        threads: torch's threads, for the busy-machine note.

    Returns:
        The episode (its ``retimed`` record: the steps, their re-timed samples/s, spread and
        value per GiB, the winner among them and whether it was separated from the runner-up)
        and the timings of ``beside`` in order. Unchanged, and no timings, with no step within
        the budget, with a ZeRO configuration among the best (those run on ranks), or with one
        best step and nothing beside it. Cost: each configuration's warm-up and 6-12 steps on
        one training loop.
    """
    from autotune.measurement.sidebyside import busy_note, retime_configs, separated

    chosen = episode.ranked()[:FINALISTS]
    if not chosen or len(chosen) + len(beside) < 2 or any(s.config.on_deepspeed for s in chosen):
        return episode, ()
    configs = [s.config for s in chosen]
    scales = [episode.value(s) / s.throughput for s in chosen]
    where = []  # beside[j]'s index among the configurations timed
    for config, scale in beside:
        if config not in configs:
            configs.append(config)
            scales.append(scale)
        where.append(configs.index(config))
    per_gib = [episode.per_gib(s) / s.throughput for s in chosen]
    result = retime_configs(workload, configs, scales=scales, device=device)
    steps = result.timings[: len(chosen)]
    order = sorted(range(len(chosen)), key=lambda i: (-steps[i].median * scales[i], chosen[i].step))
    decided = len(order) == 1 or separated(
        steps[order[0]], steps[order[1]], scale_a=scales[order[0]], scale_b=scales[order[1]]
    )
    record = {
        "steps": [s.step for s in chosen],
        "retimed_throughput": [t.median for t in steps],
        "retimed_spread": [t.relative_spread for t in steps],
        "retimed_per_gib": [t.median * k for t, k in zip(steps, per_gib, strict=True)],
        "winner": chosen[order[0]].step,
        "decided": decided,
        "rounds": result.rounds,
        "note": busy_note(result.other_cores, threads=threads),
    }
    return dataclasses.replace(episode, retimed=record), tuple(result.timings[i] for i in where)
