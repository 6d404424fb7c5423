"""Optuna search over the knobs: ``autotune study``.

One concept per module: the spec (:mod:`.spec`), the space (:mod:`.space`), the baselines
(:mod:`.baselines`), the objective (:mod:`.objective`) measuring in a time-limited child process
(:mod:`.isolation`) through a cache (:mod:`.cache`), goodput (:mod:`autotune.measurement.goodput`), the memory-model
hook (:mod:`.predictor`), storage (:mod:`.storage`), running and resuming (:mod:`.study`), results
(:mod:`.results`), exports (:mod:`.export`), dashboard notes/plots/artifacts (:mod:`.notes`,
:mod:`.dashboard`) and the CLI (:mod:`.commands`).

Importing this package is cheap (``autotune --help`` imports :mod:`.commands` through it): the
names below load their module, and torch or optuna with it, on first use (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._lazy import lazy_module_attributes

if TYPE_CHECKING:
    from autotune.search.baselines import PYTORCH_DEFAULT, SEED_RECIPE, Baseline, baselines
    from autotune.search.cache import MeasurementCache, machine_fingerprint, workload_fingerprint
    from autotune.search.export import export_config, python_snippet
    from autotune.search.isolation import MeasurementFailed, MeasurementProcess
    from autotune.search.objective import Objective, TrialFailed
    from autotune.search.predictor import MemoryPredictor, load_memory_predictor
    from autotune.search.record import TrialRecord, trial_record
    from autotune.search.results import StudySummary, summarize
    from autotune.search.space import SearchSpace
    from autotune.search.spec import BlockOverride, MeasureSpec, SpaceSpec, StudySpec, load_spec
    from autotune.search.storage import DEFAULT_STORAGE, open_storage
    from autotune.search.study import Prepared, RunOptions, count_done, open_study, prepare, run_study

__all__ = [
    "PYTORCH_DEFAULT",
    "SEED_RECIPE",
    "DEFAULT_STORAGE",
    "Baseline",
    "BlockOverride",
    "MeasureSpec",
    "MeasurementCache",
    "MeasurementFailed",
    "MeasurementProcess",
    "MemoryPredictor",
    "Objective",
    "Prepared",
    "RunOptions",
    "SearchSpace",
    "SpaceSpec",
    "StudySpec",
    "StudySummary",
    "TrialFailed",
    "TrialRecord",
    "baselines",
    "count_done",
    "export_config",
    "load_memory_predictor",
    "load_spec",
    "machine_fingerprint",
    "open_storage",
    "open_study",
    "prepare",
    "python_snippet",
    "run_study",
    "summarize",
    "trial_record",
    "workload_fingerprint",
]

_LAZY = {
    "PYTORCH_DEFAULT": "autotune.search.baselines",
    "SEED_RECIPE": "autotune.search.baselines",
    "Baseline": "autotune.search.baselines",
    "baselines": "autotune.search.baselines",
    "MeasurementCache": "autotune.search.cache",
    "machine_fingerprint": "autotune.search.cache",
    "workload_fingerprint": "autotune.search.cache",
    "export_config": "autotune.search.export",
    "python_snippet": "autotune.search.export",
    "MeasurementFailed": "autotune.search.isolation",
    "MeasurementProcess": "autotune.search.isolation",
    "Objective": "autotune.search.objective",
    "TrialFailed": "autotune.search.objective",
    "MemoryPredictor": "autotune.search.predictor",
    "load_memory_predictor": "autotune.search.predictor",
    "TrialRecord": "autotune.search.record",
    "trial_record": "autotune.search.record",
    "StudySummary": "autotune.search.results",
    "summarize": "autotune.search.results",
    "SearchSpace": "autotune.search.space",
    "BlockOverride": "autotune.search.spec",
    "MeasureSpec": "autotune.search.spec",
    "SpaceSpec": "autotune.search.spec",
    "StudySpec": "autotune.search.spec",
    "load_spec": "autotune.search.spec",
    "DEFAULT_STORAGE": "autotune.search.storage",
    "open_storage": "autotune.search.storage",
    "Prepared": "autotune.search.study",
    "RunOptions": "autotune.search.study",
    "count_done": "autotune.search.study",
    "open_study": "autotune.search.study",
    "prepare": "autotune.search.study",
    "run_study": "autotune.search.study",
}


__getattr__, __dir__ = lazy_module_attributes(__name__, globals(), _LAZY)
