"""``autotune tune`` as one function: a policy's episode on a workload's real training loop.

:func:`tune` is the whole flow the command runs, and the one the picks benchmark measures: the
training environment at the budget, the policy fine-tuned on the workload's calibrated simulator,
one episode (its last steps a climb from the best, :mod:`autotune.policies.climb`), and the best
steps re-timed side by side before the best is named.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.errors import ConfigError, ProposalError
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName, check_objective
from autotune.units import MemoryBudget

if TYPE_CHECKING:
    from autotune.policies.episode import Episode
    from autotune.policies.ppo import Policy

    from autotune.knobs import Knobs
    from autotune.measurement.compiled import CompileCheck
    from autotune.workload import Workload

__all__ = ["Tuned", "tune"]

#: ``status(message)``: a context shown while a long part runs (a console spinner in the CLI).
Status = Callable[[str], AbstractContextManager[Any]]


@dataclass(frozen=True, kw_only=True)
class Tuned:
    """What :func:`tune` did: the episode and the knobs the environment ended on.

    The knobs are in the study's terms (:class:`~autotune.Knobs`).

    Attributes:
        episode: Every step of the episode (the start first), its best steps re-timed side by side.
        final_knobs: The knobs the environment ended on.
        compile_check: The best step's configuration timed eager and compiled side by side
            (``tune(compile_check=True)``), or None where it was not.

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
    env = TrainingEnv(
        workloads=[workload],
        memory_budget=budget,
        steps_per_action=steps_per_action,
        horizon=steps,
        ranks=ranks,
        adapt_batch=adapt_batch,
    )
    try:
        policy.check_action_space(env.action_space)  # before profiling and fine-tuning (seconds)
        if fine_tune_seconds > 0:
            from autotune.policies.transfer import fine_tune, profile_for_tuning

            try:
                with show(f"profiling {workload.name} for the simulator"):
                    profile = profile_for_tuning(workload)
            except ProposalError as e:  # at real size: the policy as shipped, and one line says why
                (note or _stderr)(f"no fine-tuning: {e}")
            else:
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
        episode = run_episode(
            env,
            policy,
            workload=workload.name,
            seed=seed,
            steps=steps,
            refine=refine_trials(steps) if refine else 0,
            objective=objective,
        )
        final_knobs = env.knobs
    finally:
        env.close()
    finite = all(math.isfinite(s.loss) for s in episode.steps)
    if retime and finite:
        with show("re-timing the best steps side by side"):
            episode = retime_best(episode, workload, threads=torch.get_num_threads())
    checked = None
    best = episode.best
    on_cuda = resolve_device(env.device).type == "cuda"
    if (on_cuda if compile_check is None else compile_check) and finite and best is not None:
        # No budget given to the check: the compiled peak is the allocator's, which the episode's
        # budget (exact tracked bytes, or a fraction of them) does not measure alike.
        checked = _compile_check(workload, best.config, device=env.device, show=show, note=note or _stderr)
    return Tuned(episode=episode, final_knobs=final_knobs, compile_check=checked)


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
