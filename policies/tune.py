"""``autotune tune`` as one function: a policy's episode on a workload's real training loop.

:func:`tune` is the whole flow the command runs, and the one the picks benchmark measures: the
training environment at the budget, the policy fine-tuned on the workload's calibrated simulator,
one episode (its last steps a climb from the best, :mod:`autotune.policies.climb`), and the best
steps re-timed side by side before the best is named; then the study's two baselines measured
(the PyTorch default and the HF recipe, :mod:`autotune.search.baselines`) to compare it with. Every
phase says one line with its seconds through ``note``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError, ProposalError
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName, check_objective, per_gib
from autotune.measurement.progress import phase_line
from autotune.units import MemoryBudget, format_bytes

if TYPE_CHECKING:
    from autotune.policies.episode import Episode
    from autotune.policies.ppo import Policy

    from autotune.config import TrainConfig
    from autotune.knobs import Knobs
    from autotune.measurement.compiled import CompileCheck
    from autotune.workload import Workload

__all__ = ["TunedBaseline", "Tuned", "tune"]

#: ``status(message)``: a context shown while a long part runs (a console spinner in the CLI).
Status = Callable[[str], AbstractContextManager[Any]]


@dataclass(frozen=True, kw_only=True)
class TunedBaseline:
    """One of the study's baselines measured on the workload after the episode, to compare with.

    Attributes:
        name: ``"pytorch-default"`` or ``"hf-recipe"`` (:mod:`autotune.search.baselines`).
        config: The configuration measured: the baseline at the largest micro-batch that fit the
            episode's budget (the whole batch first, as the study's objective retries).
        throughput: Its samples/s, or None where no micro-batch of it fit or it failed.
        peak_bytes: Its measured peak, or None where nothing was measured.
        reason: Why it is infeasible (None when it ran within the budget).

    Example:
        >>> from autotune import TrainConfig
        >>> from autotune.policies.tune import TunedBaseline
        >>> config = TrainConfig(micro_batch_size=32)
        >>> TunedBaseline(name="pytorch-default", config=config, throughput=64.0, peak_bytes=2**30).per_gib
        64.0
    """

    name: str
    config: TrainConfig
    throughput: float | None
    peak_bytes: int | None
    reason: str | None = None

    @property
    def per_gib(self) -> float | None:
        """Samples/s per GiB of its peak, None where it is infeasible."""
        if self.throughput is None or not self.peak_bytes:
            return None
        return per_gib(self.throughput, self.peak_bytes)


@dataclass(frozen=True, kw_only=True)
class Tuned:
    """What :func:`tune` did: the episode and the knobs the environment ended on.

    The knobs are in the study's terms (:class:`~autotune.Knobs`).

    Attributes:
        episode: Every step of the episode (the start first), its best steps re-timed side by side.
        final_knobs: The knobs the environment ended on.
        compile_check: The best step's configuration timed eager and compiled side by side
            (``tune(compile_check=True)``), or None where it was not.
        baselines: The PyTorch default and, where bf16 runs, the HF recipe (bf16 + every block
            recomputed, the whole batch in one micro-batch), measured at the episode's budget
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

    def ratios(self) -> dict[str, float | None]:
        """The best step's value over each baseline's under the episode's objective (per GiB, or
        samples/s), None where the baseline is infeasible; empty without a best step."""
        best = self.episode.best
        if best is None:
            return {}
        per = self.episode.objective == "per-gib"
        mine = self.episode.per_gib(best) if per else best.throughput
        out: dict[str, float | None] = {}
        for b in self.baselines:
            theirs = b.per_gib if per else b.throughput
            out[b.name] = None if not theirs else mine / theirs
        return out

    def recommended_line(self) -> str:
        """The study's recommendation line for the best step (:func:`autotune.search.baselines.recommended_line`),
        or why there is none."""
        from autotune.search.baselines import recommended_line

        best = self.episode.best
        if best is None:
            return self.episode.nothing_fits or "nothing measured within the budget: nothing to recommend"
        return recommended_line(
            f"step {best.step}",
            best.config.describe(),
            throughput=best.throughput,
            peak_bytes=best.peak_bytes,
            per_gib=self.episode.per_gib(best),
            objective=self.episode.objective,
            ratios=self.ratios(),
        )


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
        baselines: Measure the study's PyTorch default and HF recipe (bf16 + every block
            recomputed) at the episode's budget after the episode (one rank; each at the largest
            micro-batch that fits), for :meth:`Tuned.recommended_line` to compare the best with.

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
    import torch
    from autotune.envs.training import TrainingEnv
    from autotune.policies.episode import retime_best, run_episode

    from autotune.search.refine import refine_trials
    from autotune.train.local import resolve_device

    finite = isinstance(fine_tune_seconds, (int, float)) and math.isfinite(fine_tune_seconds)
    if not (finite and fine_tune_seconds >= 0):
        raise ConfigError(f"fine_tune_seconds must be a finite number >= 0, but got {fine_tune_seconds!r}.")
    budget = MemoryBudget.parse(memory_budget, fractions=True)
    objective = check_objective(objective)
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
            from autotune.policies.transfer import fine_tune, profile_for_tuning

            start = time.perf_counter()
            try:
                with show(f"profiling {workload.name} for the simulator"):
                    profile = profile_for_tuning(workload)
            except ProposalError as e:  # at real size: the policy as shipped, and one line says why
                say(phase_line(f"no fine-tuning: {e}", start))
            else:
                say(phase_line(f"{workload.name} profiled for the simulator", start, "calibrated timings and memory"))
                start = time.perf_counter()
                with show(f"fine-tuning the policy on {workload.name}'s simulator ({fine_tune_seconds:g} s)"):
                    policy = fine_tune(
                        policy,
                        profile,
                        memory_budget=budget,
                        seconds=fine_tune_seconds,
                        seed=seed,
                        adapt_batch=adapt_batch,
                        min_micro_batch=workload.micro_batch_floor,
                        start_within_budget=env.start_within_budget,  # the real environment's start
                    )
                say(phase_line(f"policy fine-tuned on {workload.name}'s simulator", start))
        episode = run_episode(
            env,
            policy,
            workload=workload.name,
            seed=seed,
            steps=steps,
            refine=refine_trials(steps) if refine else 0,
            objective=objective,
            note=say,
        )
        final_knobs = env.knobs
    finally:
        env.close()
    finite = all(math.isfinite(s.loss) for s in episode.steps)
    if retime and finite:
        start = time.perf_counter()
        with show("re-timing the best steps side by side"):
            episode = retime_best(episode, workload, threads=torch.get_num_threads())
        if episode.retimed is not None:
            say(phase_line("best steps re-timed side by side", start, f"steps {episode.retimed['steps']}"))
    measured: tuple[TunedBaseline, ...] = ()
    if baselines and finite:
        if ranks > 1:
            say("baselines: not measured on ranks (the PyTorch default and the HF recipe are one-rank loops here)")
        else:
            measured = _measure_baselines(workload, budget=episode.budget_bytes, device=env.device, show=show, say=say)
    checked = None
    best = episode.best
    on_cuda = resolve_device(env.device).type == "cuda"
    if (on_cuda if compile_check is None else compile_check) and finite and best is not None:
        # No budget given to the check: the compiled peak is the allocator's, which the episode's
        # budget (exact tracked bytes, or a fraction of them) does not measure alike.
        checked = _compile_check(workload, best.config, device=env.device, show=show, note=note or _stderr)
    return Tuned(episode=episode, final_knobs=final_knobs, compile_check=checked, baselines=measured)


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


def _measure_baselines(
    workload: Workload, *, budget: int, device: str | None, show: Status, say: Callable[[str], None]
) -> tuple[TunedBaseline, ...]:
    """The study's PyTorch default and HF recipe (:func:`autotune.search.baselines.baselines`: one
    implementation) at the workload's batch, each measured at its whole batch first and, while over
    ``budget``, the next smaller micro-batch (the study's retry), one line each."""
    from autotune.config import TrainConfig
    from autotune.errors import TrainingError
    from autotune.measurement.schedule import measure_local
    from autotune.search.baselines import HF_RECIPE, PYTORCH_DEFAULT, baselines, smaller_micro_batch
    from autotune.search.space import SearchSpace

    n = len(workload.block_names())
    space = SearchSpace(
        batch_sizes=(workload.batch_size,),
        # Both baselines hold every block or none: the ranking does not change them.
        ranking=tuple(range(n)),
        max_micro_batch=workload.dataset_size or workload.batch_size,
        min_micro_batch=workload.micro_batch_floor,
        base=TrainConfig(),
    )
    out = []
    for b in baselines(space, batch_size=workload.batch_size):
        if b.name not in (PYTORCH_DEFAULT, HF_RECIPE):
            continue
        start = time.perf_counter()
        knobs: Knobs | None = b.knobs
        result = TunedBaseline(name=b.name, config=space.config(b.knobs), throughput=None, peak_bytes=None)
        with show(f"measuring the baseline {b.name}"):
            while knobs is not None:
                config = space.config(knobs)
                try:
                    m = measure_local(workload, config, steps=4, warmup=1, memory_budget=budget, device=device)
                except TrainingError as e:  # bf16 this machine cannot run (oneDNN's LSTM on AVX2)
                    result = TunedBaseline(
                        name=b.name, config=config, throughput=None, peak_bytes=None, reason=str(e).splitlines()[0]
                    )
                    break
                result = TunedBaseline(
                    name=b.name, config=config, throughput=m.throughput, peak_bytes=m.peak_bytes, reason=m.reason
                )
                if m.ok:
                    break
                knobs = smaller_micro_batch(space, knobs) if m.status == "over_budget" else None
        if result.throughput is not None and result.reason is None:
            what = f"{result.throughput:.1f} samples/s, peak {format_bytes(result.peak_bytes)}"
        else:
            result = dataclasses.replace(result, throughput=None)
            what = f"infeasible: {result.reason}"
        say(phase_line(f"baseline {b.name} measured: {result.config.describe()}: {what}", start))
        out.append(result)
    return tuple(out)


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)
