"""Optuna search over the knobs: ``autotune study``.

One concept per module: the spec (:mod:`.spec`), the space (:mod:`.space`), the baselines
(:mod:`.baselines`), the reduced precisions searched here (:mod:`.precisions`), the objective
(:mod:`.objective`) measuring in a time-limited child process (:mod:`.isolation`) through a cache
(:mod:`.cache`), goodput (:mod:`autotune.measurement.goodput`), the memory-model hook
(:mod:`.predictor`), storage (:mod:`.storage`), running and resuming (:mod:`.study`), results
(:mod:`.results`), exports (:mod:`.export`), dashboard notes/plots/artifacts (:mod:`.notes`,
:mod:`.dashboard`) and the CLI (:mod:`.commands`).

Importing this package is cheap (``autotune --help`` imports :mod:`.commands` through it): the
names below load their module, and torch or optuna with it, on first use (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune._lazy import lazy_module_attributes

if TYPE_CHECKING:
    from autotune.search.export import export_config
    from autotune.search.opening import open_study
    from autotune.search.results import StudySummary, summarize
    from autotune.search.space import SearchSpace
    from autotune.search.spec import BlockOverride, MeasureSpec, SpaceSpec, StudySpec, load_spec
    from autotune.search.storage import DEFAULT_STORAGE, open_storage
    from autotune.search.study import (
        Prepared,
        RunOptions,
        count_done,
        measuring_ahead,
        measuring_process,
        prepare,
        run_study,
    )
    from autotune.search.trial import Objective

# The public API: spec, space, objective and study entry points, and what the CLI uses of the
# rest. Everything else (baselines, cache, isolation, predictor, records, dashboard) stays
# importable from its own module.
__all__ = [
    "DEFAULT_STORAGE",
    "BlockOverride",
    "MeasureSpec",
    "Objective",
    "Prepared",
    "RunOptions",
    "SearchSpace",
    "SpaceSpec",
    "StudySpec",
    "StudySummary",
    "count_done",
    "export_config",
    "load_spec",
    "measuring_ahead",
    "measuring_process",
    "open_storage",
    "open_study",
    "prepare",
    "run_study",
    "summarize",
]

_LAZY = {
    "export_config": "autotune.search.export",
    "Objective": "autotune.search.trial",
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
    "measuring_ahead": "autotune.search.study",
    "measuring_process": "autotune.search.study",
    "open_study": "autotune.search.opening",
    "prepare": "autotune.search.study",
    "run_study": "autotune.search.study",
}


__getattr__, __dir__ = lazy_module_attributes(__name__, globals(), _LAZY)
