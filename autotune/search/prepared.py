"""A study's input checked before anything is written: the spec against its workload and budget
(:func:`prepare`, a :class:`Prepared`). Everything that can be wrong with the input (workload, spec,
budget) is checked here, before the storage is opened, so bad input writes nothing."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from autotune.config import Precision, TrainConfig
from autotune.dependencies import install_command
from autotune.errors import (
    MissingDependencyError,
    SpecError,
)
from autotune.measurement.objective import DEFAULT_OBJECTIVE
from autotune.measurement.progress import loaded_line, ranked_line, since
from autotune.search.cache import workload_fingerprint
from autotune.search.space import SearchSpace
from autotune.search.spec import StudySpec, spec_to_dict
from autotune.search.trial_record import GOODPUT_METRIC_NAMES, METRIC_NAMES
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.workload import Workload

__all__ = ["Prepared", "prepare", "since"]


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A validated spec with what it needs from the workload."""

    spec: StudySpec
    workload: Workload
    space: SearchSpace
    fingerprint: str
    study_name: str
    reference_batch: int
    memory_budget: int | None  # spec.memory_budget in bytes per rank (a percentage resolved)
    notes: tuple[str, ...] = ()  # one line per setup phase, with its seconds (said by run_study)

    @property
    def identity(self) -> dict[str, Any]:
        """What must match for a run to resume or join this study."""
        identity = {
            "objectives": list(self.metric_names),
            "workload": self.spec.workload,
            "workload_fingerprint": self.fingerprint,
            "memory_budget": self.memory_budget,
            "space": json.loads(json.dumps(spec_to_dict(self.spec)["space"])),
            "reference_batch": self.reference_batch,
        }
        if self.spec.objective != DEFAULT_OBJECTIVE:  # the default is not stored (_check_same reads it so)
            identity["objective"] = self.spec.objective
        return identity

    @property
    def metric_names(self) -> tuple[str, str]:
        return GOODPUT_METRIC_NAMES if self.space.multi_batch else METRIC_NAMES


def prepare(spec: StudySpec) -> Prepared:
    """Load the workload and check the spec against it; writes nothing anywhere. What each phase
    cost is in ``Prepared.notes``, which :func:`run_study` says first."""
    from autotune.memory.blocks import profile_blocks
    from autotune.resolve import load_workload

    # Said when the study runs, once the spec and the storage are known to be good: a user mistake
    # stays one line.
    lines: list[str] = []
    say = lines.append
    if max(spec.space.ranks) > 1 and importlib.util.find_spec("deepspeed") is None:
        # Refused before anything runs: every trial on ranks would fail on the import.
        raise MissingDependencyError(
            f"ranks {max(spec.space.ranks)}: several ranks run on DeepSpeed, which is not installed: "
            f"{install_command('zero')}"
        )
    start = time.perf_counter()
    workload = load_workload(spec.workload)
    say(loaded_line(workload, start))
    say(workload.block_choice().describe())
    drops = workload.drops_layers
    if drops is not None:
        # On DeepSpeed ranks the engines train copies as the user's own training on ranks does.
        say(f"LayerDrop ({drops}): a trial in one process runs every layer, the step a memory budget must hold")
    if spec.space.min_micro_batch is not None:
        workload = dataclasses.replace(workload, min_micro_batch=spec.space.min_micro_batch)
    # Resolved on the workload the study goes on with (a replaced copy would measure it again).
    if workload.loss_weighting.said:  # how every trial splits the batch: the batch's gradient
        say(workload.loss_weighting.line)
    batches = spec.space.effective_batch_sizes or (workload.batch_size,)
    reference = spec.space.batch_size or workload.batch_size
    start = time.perf_counter()
    budget = _budget(spec, workload)
    if budget is not None:
        say(f"memory budget {format_bytes(budget)} per rank ({since(start)})")
    n_data = workload.dataset_size or max(batches)  # an iterable dataset's size is unknown
    start = time.perf_counter()
    ranking = profile_blocks(workload).ranked()
    say(ranked_line(start))
    space = SearchSpace(
        batch_sizes=batches,
        ranks=spec.space.ranks,
        zero_stages=spec.space.zero_stages,
        low_precisions=tuple(cast("Precision", p) for p in spec.space.precisions if p != "fp32"),  # validated
        ranking=ranking,
        overrides=spec.space.blocks,
        max_micro_batch=n_data,
        min_micro_batch=workload.micro_batch_floor,
        base=TrainConfig(seed=spec.seed),
        selective=spec.space.selective is not False,
        selective_sampled=spec.space.selective is True,
    )
    return Prepared(
        spec=spec,
        workload=workload,
        space=space,
        fingerprint=workload_fingerprint(workload),
        study_name=spec.study_name(workload.name),
        reference_batch=reference,
        memory_budget=budget,
        notes=tuple(lines),
    )


def _budget(spec: StudySpec, workload: Workload) -> int | None:
    """The budget in bytes, checked against the least memory any rank can hold.

    A percentage is of the memory model's predicted peak of the PyTorch default configuration
    (:func:`autotune.memory.predict.budget_bytes`) at the space's smallest rank count: a
    prediction, because the budget must be known before the first (baseline) trial runs.
    """
    from autotune.memory.predict import budget_bytes

    budget = budget_bytes(spec.memory_budget, workload, ranks=min(spec.space.ranks))
    if budget is None:
        return None
    params = sum(p.numel() * p.element_size() for p in workload.model.parameters())
    # ZeRO-3 splits the parameters across ranks: the least any rank can hold.
    floor = params // max(spec.space.ranks) if max(spec.space.ranks) > 1 and 3 in spec.space.zero_stages else params
    if budget < floor:
        raise SpecError(
            f"memory_budget must be at least the parameter memory of workload {workload.name!r} "
            f"({format_bytes(floor)}), but got {format_bytes(budget)}."
        )
    return budget
