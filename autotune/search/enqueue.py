"""What a study runs first: the baselines not yet tried and the policy's proposal
(:func:`enqueue_baselines`; :func:`enqueue_proposal`, from a :class:`Proposer` its caller hands in)."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Protocol

from autotune.dependencies import install_command
from autotune.errors import ConfigError, NonFiniteLossError, ProposalError, SpecError
from autotune.knobs import Knobs
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName
from autotune.measurement.progress import PhaseClock, since
from autotune.search.baselines import POLICY_PROPOSAL, baselines
from autotune.search.budget import admits, far_over
from autotune.search.observer import StudyObserver
from autotune.search.predictor import MemoryPredictor
from autotune.search.trial_record import ATTR

if TYPE_CHECKING:
    from collections.abc import Callable

    import optuna

    from autotune.memory.profile_record import MemoryProfile
    from autotune.search.prepared import Prepared
    from autotune.search.space import SearchSpace
    from autotune.workload import Workload

__all__ = ["Proposer", "enqueue_baselines", "enqueue_proposal"]


class Proposer(Protocol):
    """The pretrained policy's proposal for a workload within a budget
    (:func:`autotune.policies.transfer.propose`): the policies sit above the study, so the caller
    hands it in (``RunOptions.propose``). ``reuse``: the study's memory profile of ``workload`` so
    far (None: none yet), whose fake runs the proposal need not make again. ``progress``: called
    as each phase of its profile begins (the calibration's real steps: minutes on a CPU at real
    size), so the study says each with its seconds. ``objective``: the study's, which of the
    configurations the policy reaches is its proposal. Raises ``ProposalError``, ``ConfigError`` or
    ``NonFiniteLossError`` where there is none, ``ImportError`` where the policy cannot load."""

    def __call__(
        self,
        workload: Workload,
        *,
        memory_budget: int | None,
        reuse: MemoryProfile | None = None,
        progress: Callable[[str], None] | None = None,
        objective: ObjectiveName = DEFAULT_OBJECTIVE,
    ) -> Knobs: ...


def enqueue_baselines(
    study: optuna.Study,
    prepared: Prepared,
    predictor: MemoryPredictor | None,
    *,
    note: Callable[[str], None] | None = None,
) -> list[str]:
    """Enqueue each baseline not yet tried, waiting or running (first run, or after a crash): the
    names enqueued. ``note`` gets one line saying which, with its seconds."""
    present = _present(study)
    start = time.perf_counter()
    verdict, hopeless = admits(prepared, predictor), far_over(prepared, predictor)
    reference = min(prepared.space.batch_sizes, key=lambda b: (abs(b - prepared.reference_batch), b))
    added = []
    held = prepared.workload.held_in_16_bits is not None
    objective = prepared.spec.objective
    for b in baselines(
        prepared.space, batch_size=reference, admits=verdict, held=held, objective=objective, hopeless=hopeless
    ):
        if b.name not in present:
            study.enqueue_trial(prepared.space.params(b.knobs), user_attrs={ATTR.BASELINE: b.name})
            added.append(b.name)
    if added:
        (note or StudyObserver().note)(f"baselines enqueued: {', '.join(added)} ({since(start)})")
    return added


def enqueue_proposal(
    study: optuna.Study,
    prepared: Prepared,
    propose: Proposer | None,
    *,
    after_queue: bool = False,
    reuse: MemoryProfile | None = None,
    note: Callable[[str], None] | None = None,
) -> bool:
    """Enqueue the proposal of ``propose`` (baseline name ``policy``) unless the study has it:
    whether it is settled, enqueued or said why there is none (``note`` gets the one line).

    ``after_queue=True`` (a study's own run, asking again after each trial): not while a trial
    waits in the queue (the baselines), so the simulator's calibration (seconds to a minute at real
    size) does not hold up the first trial, and a study that ends on its baselines never pays
    it; False is returned then. The proposal still runs right after the trials queued before it.
    ``reuse``: the study's memory profile so far, handed to ``propose``."""
    from optuna.trial import TrialState

    if POLICY_PROPOSAL in _present(study):
        return True
    if after_queue and any(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False)):
        return False
    say = note or StudyObserver().note
    say(_enqueue_proposal(study, prepared, propose, reuse, say)[1])
    return True


def _present(study: optuna.Study) -> set[str]:
    """The baselines tried, waiting or running (an interrupted trial is retried: not present)."""
    from optuna.trial import TrialState

    return {
        t.user_attrs[ATTR.BASELINE]
        for t in study.get_trials(deepcopy=False)
        if ATTR.BASELINE in t.user_attrs and not (t.state == TrialState.FAIL and t.user_attrs.get(ATTR.INTERRUPTED))
    }


def _enqueue_proposal(
    study: optuna.Study,
    prepared: Prepared,
    propose: Proposer | None,
    reuse: MemoryProfile | None,
    note: Callable[[str], None],
) -> tuple[bool, str]:
    """Enqueue the policy's proposal: whether it was, and the one line to show (what, or why not).
    Each phase of its profile is a line on ``note`` as it ends."""
    if propose is None:
        return False, "no policy proposal: none was given (RunOptions.propose)"
    start = time.perf_counter()
    clock = PhaseClock(note, "policy proposal: ")
    try:
        try:
            proposed = propose(
                prepared.workload,
                memory_budget=prepared.memory_budget,
                reuse=reuse,
                progress=clock,
                objective=prepared.spec.objective,
            )
        finally:
            clock.end()
        knobs = in_space(proposed, prepared.space)
        params = prepared.space.params(knobs)
    except ImportError as e:  # stable-baselines3 / gymnasium: in the base install, unless it is broken
        return False, f"no policy proposal: the policy cannot be imported ({e}): {install_command()} installs it"
    # ConfigError, SpecError: the proposal lies outside this study's space; NonFiniteLossError:
    # the model's loss is NaN (its trials prune on it).
    except (ProposalError, ConfigError, SpecError, NonFiniteLossError) as e:
        return False, f"no policy proposal: {e} ({since(start)})"
    study.enqueue_trial(params, user_attrs={ATTR.BASELINE: POLICY_PROPOSAL})
    return True, f"policy proposal enqueued: {knobs.describe()} (profile of the model and simulation, {since(start)})"


def in_space(knobs: Knobs, space: SearchSpace) -> Knobs:
    """``knobs`` with its selectively recomputed blocks recomputed whole where ``space`` has no
    selective level (``--no-selective``, or screened out on the model): the policy proposes the
    level wherever it likes, and the nearest point of such a space recomputes those blocks whole
    (no more memory than selectively: a whole block keeps only its input).

    Example:
        >>> from autotune.search.space import SearchSpace
        >>> space = SearchSpace(batch_sizes=(8,), ranking=(0, 1, 2), max_micro_batch=8)
        >>> in_space(Knobs(batch_size=8, micro_batch_size=4, checkpoint_blocks=1, selective_blocks=1), space).describe()
        '4x2 ckpt:2'
    """
    if space.selective or not knobs.selective_blocks:
        return knobs
    return dataclasses.replace(
        knobs, checkpoint_blocks=knobs.checkpoint_blocks + knobs.selective_blocks, selective_blocks=0
    )
