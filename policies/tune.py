"""``autotune tune`` as one function: a policy's episode on a workload's real training loop.

:func:`tune` is the whole flow the command runs, and the one the picks benchmark measures: the
training environment at the budget, the policy fine-tuned on the workload's calibrated simulator,
one episode (its last steps a climb from the best, :mod:`autotune.policies.climb`), and the best
steps re-timed side by side before the best is named; then the study's baselines measured (the
PyTorch default and the HF recipes, :mod:`autotune.search.baselines`) to compare it with, re-timed
beside it: where one of them beats the best step beyond both spreads, that baseline is the
recommendation (:attr:`Tuned.beaten_by`), as a study recommends its best trial, baselines
included. Every phase says one line with its seconds through ``note``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.policies.tune_baselines import Status, TunedBaseline, measure_baselines

from autotune.errors import ConfigError, ProposalError
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName, check_objective
from autotune.measurement.progress import phase_line
from autotune.units import MemoryBudget

if TYPE_CHECKING:
    from autotune.envs.training import TrainingEnv
    from autotune.policies.episode import Episode
    from autotune.policies.ppo import Policy

    from autotune.knobs import Knobs
    from autotune.measurement.compiled import CompileCheck
    from autotune.workload import Workload

__all__ = ["TunedBaseline", "Tuned", "tune"]


@dataclass(frozen=True, kw_only=True)
class Tuned:
    """What :func:`tune` did: the episode and the knobs the environment ended on.

    The knobs are in the study's terms (:class:`~autotune.Knobs`).

    Attributes:
        episode: Every step of the episode (the start first), its best steps re-timed side by side.
        final_knobs: The knobs the environment ended on.
        compile_check: The recommended configuration (the best step's, or :attr:`beaten_by`'s)
            timed eager and compiled side by side (``tune(compile_check=True)``), or None where it
            was not.
        baselines: The PyTorch default and, where bf16 runs, the HF recipe (bf16 + every block
            recomputed, the whole batch in one micro-batch) and, under the ``"throughput"``
            objective, the HF bf16-only recipe, measured at the episode's budget
            (``tune(baselines=True)``); empty where they were not.

    Example:
        >>> from autotune import load_workload
        >>> from autotune.policies import load_policy
        >>> from autotune.policies.tune import tune
        >>> tuned = tune(load_workload("mlp-digits"), load_policy(), steps=2, fine_tune_seconds=0, retime=False)
        >>> type(tuned.final_knobs).__name__, len(tuned.episode.steps)  # the start, then 2 steps
        ('Knobs', 3)
    """

    episode: Episode
    final_knobs: Knobs
    compile_check: CompileCheck | None = None
    baselines: tuple[TunedBaseline, ...] = ()

    @property
    def side_by_side(self) -> bool:
        """Whether :meth:`ratios` come from one interleaved run: the best step re-timed, and beside
        it every baseline within the budget (there is at least one)."""
        retimed, best = self.episode.retimed, self.episode.best
        within = [b for b in self.baselines if b.within_budget]
        return (
            retimed is not None
            and best is not None
            and best.step in retimed["steps"]
            and bool(within)
            and all(b.retimed_throughput is not None for b in within)
        )

    def _best_figures(self) -> tuple[float, float]:
        """The best step's samples/s and value per GiB: re-timed where :attr:`side_by_side`."""
        best, retimed = self.episode.best, self.episode.retimed
        assert best is not None
        if self.side_by_side:
            assert retimed is not None
            i = retimed["steps"].index(best.step)
            return float(retimed["retimed_throughput"][i]), float(retimed["retimed_per_gib"][i])
        return best.throughput, self.episode.per_gib(best)

    def _best_value(self) -> tuple[float, float]:
        """The best step's value under the episode's objective and its relative spread (0 where
        it was not re-timed)."""
        throughput, per = self._best_figures()
        spread = 0.0
        if self.side_by_side:
            retimed, best = self.episode.retimed, self.episode.best
            assert retimed is not None and best is not None
            spread = float(retimed["retimed_spread"][retimed["steps"].index(best.step)])
        return (per if self.episode.objective == "per-gib" else throughput), spread

    @property
    def beaten_by(self) -> TunedBaseline | None:
        """The baseline recommended instead of the best step: within the budget, re-timed side by
        side with it, and better under the episode's objective beyond both their spreads (of
        several, the best); None where the best step holds, or nothing was timed side by side
        (first measurements of separate stints do not decide it). The study recommends its best
        trial, baselines included, alike."""
        if not self.side_by_side:
            return None
        mine, spread = self._best_value()
        beating = []
        for b in self.baselines:
            theirs = b.value(self.episode.objective, retimed=True) if b.within_budget else None
            if theirs is not None and theirs - mine > theirs * (b.retimed_spread or 0.0) + mine * spread:
                beating.append((theirs, b))
        return max(beating, key=lambda pair: pair[0])[1] if beating else None

    def ratios(self) -> dict[str, float | None]:
        """The best step's value over each baseline's under the episode's objective (per GiB, or
        samples/s), None where the baseline is infeasible; empty without a best step. Both
        re-timed in one run where :attr:`side_by_side`, else each its own first measurement."""
        if self.episode.best is None:
            return {}
        objective = self.episode.objective
        throughput, per = self._best_figures()
        mine = per if objective == "per-gib" else throughput
        out: dict[str, float | None] = {}
        for b in self.baselines:
            theirs = b.value(objective, retimed=self.side_by_side) if b.within_budget else None
            out[b.name] = None if not theirs else mine / theirs
        return out

    def recommended_line(self) -> str:
        """The study's recommendation line for the best step (:func:`autotune.search.baselines.recommended_line`),
        its figures re-timed where :attr:`side_by_side`, or why there is none."""
        from autotune.search.baselines import recommended_line

        best = self.episode.best
        if best is None:
            return self.episode.nothing_fits or "nothing measured within the budget: nothing to recommend"
        baseline = self.beaten_by
        if baseline is not None:
            return self._baseline_line(baseline)
        throughput, per = self._best_figures()
        return recommended_line(
            f"step {best.step}",
            best.config.describe(),
            throughput=throughput,
            peak_bytes=best.peak_bytes,
            per_gib=per,
            objective=self.episode.objective,
            ratios=self.ratios(),
            side_by_side=self.side_by_side,
        )

    def _baseline_line(self, baseline: TunedBaseline) -> str:
        """The recommendation line of ``baseline`` (:attr:`beaten_by`), against the other
        baselines re-timed beside it, and what the policy's best step is of it."""
        from autotune.search.baselines import recommended_line

        objective, best = self.episode.objective, self.episode.best
        assert best is not None and baseline.retimed_throughput is not None
        theirs = baseline.value(objective, retimed=True)
        assert theirs is not None
        ratios: dict[str, float | None] = {}
        for b in self.baselines:
            other = b.value(objective, retimed=True) if b.within_budget else None
            if b.name != baseline.name:
                ratios[b.name] = None if not other else theirs / other
        mine, _ = self._best_value()
        unit = " per GiB" if objective == "per-gib" else " samples/s"
        line = recommended_line(
            f"baseline {baseline.name}",
            baseline.config.describe(),
            throughput=baseline.retimed_throughput,
            peak_bytes=baseline.peak_bytes,
            per_gib=baseline.retimed_per_gib,
            objective=objective,
            ratios=ratios,
            side_by_side=True,
        )
        return f"{line}; the policy's best, step {best.step}, is {mine / theirs:.2f}x of it{unit}, timed side by side"

    @property
    def recommended(self) -> dict[str, Any] | None:
        """What is recommended, for ``--json``: ``{"step": N, "config": ...}`` (the best step) or
        ``{"baseline": NAME, "config": ...}`` (:attr:`beaten_by`); None where nothing fits."""
        baseline, best = self.beaten_by, self.episode.best
        if baseline is not None:
            return {"baseline": baseline.name, "config": baseline.config.to_dict()}
        return None if best is None else {"step": best.step, "config": best.config.to_dict()}

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` form: the episode's (:meth:`Episode.to_dict`), then ``baselines``
        (:meth:`TunedBaseline.to_dict` each), ``ratios``, ``side_by_side`` and ``recommended``."""
        return {
            **self.episode.to_dict(),
            "baselines": [b.to_dict() for b in self.baselines],
            "ratios": self.ratios(),
            "side_by_side": self.side_by_side,
            "recommended": self.recommended,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def tune(
    workload: Workload,
    policy: Policy,
    *,
    memory_budget: MemoryBudget | str | int | float = "75%",
    steps: int = 8,
    steps_per_action: int = 4,
    fine_tune_seconds: float = 30.0,
    ranks: int = 1,
    adapt_batch: bool = False,
    seed: int = 0,
    refine: bool = True,
    retime: bool = True,
    status: Status | None = None,
    objective: ObjectiveName = DEFAULT_OBJECTIVE,
    note: Callable[[str], None] | None = None,
    compile_check: bool | None = None,
    baselines: bool = True,
) -> Tuned:
    """Run ``policy`` for one episode of ``steps`` on ``workload``'s real training loop.

    Args:
        workload: The model, data and loss to tune, trained for real.
        policy: The policy that acts (:func:`~autotune.policies.load_policy`; the shipped one by default).
        memory_budget: Peak allowed (:meth:`MemoryBudget.parse`; a fraction is of the default
            configuration's peak measured on the running loop).
        steps: Environment steps; each trains ``steps_per_action`` real optimizer steps.
        steps_per_action: Real optimizer steps per environment step.
        ranks: Data-parallel ranks (DeepSpeed; the ZeRO stage becomes a knob when > 1).
        adapt_batch: Let the policy grow the effective batch (goodput per GiB), never below the user's.
        seed: Seeds the environment and the fine-tuning.
        fine_tune_seconds: Profile the model and fine-tune the policy on its calibrated simulator
            this long first (0: the policy as is).
        refine: The last quarter of the steps, and every step after the policy first proposes to
            stay, climb from the best step (:func:`autotune.search.refine.refine_trials`).
        retime: Re-time the best steps side by side before naming the best (skipped when a loss
            was not finite: the episode ended there).
        status: Shows what runs during the long parts (profiling, fine-tuning, re-timing).
        note: Gets a line about the run (why the policy was not fine-tuned); default: stderr.
        objective: Which measured configuration within the budget is the episode's best, the
            climb's incumbent and what the re-timing ranks by: ``"per-gib"`` (the most samples/s
            per GiB of peak) or ``"throughput"`` (the most samples/s). The policy acts as it was
            trained either way (on a per-GiB reward, as is its fine-tuning): under ``throughput``
            it proposes where to look, and the pick follows the objective.
        compile_check: Time the best step's configuration eager and ``torch.compile``-d side by
            side (:func:`autotune.measurement.compiled.compare_compiled`) and say it in one
            ``note`` line; None (default): only where the loop runs on CUDA (on the CPU a
            compile costs a minute or more of a 2-core machine).
        baselines: Measure the study's PyTorch default and HF recipes (bf16 + every block
            recomputed; bf16 alone under ``"throughput"``) at the episode's budget after the
            episode (one rank; each at the largest micro-batch that fits), for
            :meth:`Tuned.recommended_line` to compare the best with.

    Raises:
        ConfigError: ``fine_tune_seconds`` not a finite number >= 0, a budget that does not parse,
            an unknown ``objective``, or a policy whose action space is not the environment's,
            before anything trains.

    Example:
        >>> from autotune import load_workload
        >>> from autotune.policies import load_policy
        >>> from autotune.policies.tune import tune
        >>> tuned = tune(load_workload("mlp-digits"), load_policy(), steps=2, fine_tune_seconds=0, retime=False)
        >>> len(tuned.episode.steps)  # the start, then 2 steps
        3
    """
    from autotune.envs.training import TrainingEnv
    from autotune.policies.episode import run_episode

    from autotune.search.refine import refine_trials

    budget, objective = _checked(fine_tune_seconds, memory_budget, objective)
    show = status or (lambda _message: nullcontext())
    say = note or _stderr
    env = TrainingEnv(
        workloads=[workload],
        memory_budget=budget,
        steps_per_action=steps_per_action,
        horizon=steps,
        ranks=ranks,
        adapt_batch=adapt_batch,
    )
    env.note = say  # the reset's phases: block ranking, the first steps, the memory model, the probes
    try:
        policy.check_action_space(env.action_space)  # before profiling and fine-tuning (seconds)
        if fine_tune_seconds > 0:
            policy = _fine_tuned(policy, workload, env, budget, fine_tune_seconds, seed=seed, show=show, say=say)
        refined = refine_trials(steps) if refine else 0
        episode = run_episode(
            env, policy, workload=workload.name, seed=seed, steps=steps, refine=refined, objective=objective, note=say
        )
        final_knobs = env.knobs
    finally:
        env.close()
    finite = all(math.isfinite(s.loss) for s in episode.steps)
    if not finite:  # the environment ended the episode there: nothing to compare or re-time
        return Tuned(episode=episode, final_knobs=final_knobs)
    measured = _baselines(workload, episode, asked=baselines, ranks=ranks, device=env.device, show=show, say=say)
    if retime:
        episode, measured = _retime(episode, workload, measured, device=env.device, show=show, say=say)
    tuned = Tuned(episode=episode, final_knobs=final_knobs, baselines=measured)
    if episode.best is not None and _wants_compile_check(compile_check, env.device):
        # No budget given to the check: the compiled peak is the allocator's, which the episode's
        # budget (exact tracked bytes, or a fraction of them) does not measure alike.
        beaten_by = tuned.beaten_by
        config = episode.best.config if beaten_by is None else beaten_by.config
        checked = _compile_check(workload, config, device=env.device, show=show, note=say)
        tuned = dataclasses.replace(tuned, compile_check=checked)
    return tuned


def _checked(
    fine_tune_seconds: float, memory_budget: MemoryBudget | str | int | float, objective: object
) -> tuple[MemoryBudget, ObjectiveName]:
    """The arguments :func:`tune` checks before anything trains: the budget parsed, the objective."""
    finite = isinstance(fine_tune_seconds, (int, float)) and math.isfinite(fine_tune_seconds)
    if not (finite and fine_tune_seconds >= 0):
        raise ConfigError(f"fine_tune_seconds must be a finite number >= 0, but got {fine_tune_seconds!r}.")
    return MemoryBudget.parse(memory_budget, fractions=True), check_objective(objective)


def _fine_tuned(
    policy: Policy,
    workload: Workload,
    env: TrainingEnv,
    budget: MemoryBudget,
    seconds: float,
    *,
    seed: int,
    show: Status,
    say: Callable[[str], None],
) -> Policy:
    """``policy`` fine-tuned ``seconds`` on ``workload``'s calibrated simulator at ``env``'s start,
    or as it is (and a line says why) where the workload cannot be profiled at its real size."""
    from autotune.policies.transfer import fine_tune, profile_for_tuning

    start = time.perf_counter()
    try:
        with show(f"profiling {workload.name} for the simulator"):
            profile = profile_for_tuning(workload)
    except ProposalError as e:  # at real size: the policy as shipped, and one line says why
        say(phase_line(f"no fine-tuning: {e}", start))
        return policy
    say(phase_line(f"{workload.name} profiled for the simulator", start, "calibrated timings and memory"))
    start = time.perf_counter()
    with show(f"fine-tuning the policy on {workload.name}'s simulator ({seconds:g} s)"):
        policy = fine_tune(
            policy,
            profile,
            memory_budget=budget,
            seconds=seconds,
            seed=seed,
            adapt_batch=env.adapt_batch,
            min_micro_batch=workload.micro_batch_floor,
            start_within_budget=env.start_within_budget,  # the real environment's start
        )
    say(phase_line(f"policy fine-tuned on {workload.name}'s simulator", start))
    return policy


def _baselines(
    workload: Workload,
    episode: Episode,
    *,
    asked: bool,
    ranks: int,
    device: str | None,
    show: Status,
    say: Callable[[str], None],
) -> tuple[TunedBaseline, ...]:
    """The baselines measured at ``episode``'s budget (:func:`autotune.policies.tune_baselines.measure_baselines`)
    where ``asked``; none, and a line, on ranks."""
    if not asked:
        return ()
    if ranks > 1:
        say("baselines: not measured on ranks (the PyTorch default and the HF recipes are one-rank loops here)")
        return ()
    return measure_baselines(
        workload, budget=episode.budget_bytes, device=device, show=show, say=say, objective=episode.objective
    )


def _retime(
    episode: Episode,
    workload: Workload,
    measured: tuple[TunedBaseline, ...],
    *,
    device: str | None,
    show: Status,
    say: Callable[[str], None],
) -> tuple[Episode, tuple[TunedBaseline, ...]]:
    """The best steps and the baselines within the budget re-timed side by side in one run
    (:func:`autotune.policies.episode.retime_best`), one line; the baselines with their timings."""
    import torch
    from autotune.policies.episode import retime_best

    beside = [b for b in measured if b.within_budget]
    start = time.perf_counter()
    what = "the best steps and the baselines" if beside else "the best steps"
    with show(f"re-timing {what} side by side"):
        episode, timings = retime_best(
            episode,
            workload,
            beside=[(b.config, b.scale(episode.objective)) for b in beside],
            device=device,
            threads=torch.get_num_threads(),
        )
    if episode.retimed is None:
        return episode, measured
    timed = {b.name: t for b, t in zip(beside, timings, strict=False)}  # empty: no baseline re-timed
    detail = f"steps {episode.retimed['steps']}" + (f", baselines {', '.join(timed)}" if timed else "")
    say(phase_line(f"best steps{' and baselines' if timed else ''} re-timed side by side", start, detail))
    return episode, tuple(b.with_timing(timed[b.name]) if b.name in timed else b for b in measured)


def _wants_compile_check(asked: bool | None, device: str | None) -> bool:
    """``asked``, or by default whether the loop runs on CUDA (a compile costs minutes of a CPU)."""
    from autotune.train.local import resolve_device

    return resolve_device(device).type == "cuda" if asked is None else asked


def _compile_check(
    workload: Workload, config: Any, *, device: str | None, show: Status, note: Callable[[str], None]
) -> CompileCheck | None:
    """The best configuration timed eager and compiled; None (and a line) where it cannot be."""
    from autotune.measurement.compiled import compare_compiled, compile_line

    if config.on_deepspeed:
        note("torch.compile: not checked (the best configuration runs on DeepSpeed ranks)")
        return None
    with show("timing the best configuration eager and compiled (torch.compile)"):
        check = compare_compiled(workload, config, device=device)
    note(compile_line(check))
    return check


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)
