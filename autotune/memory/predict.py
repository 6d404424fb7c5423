"""The memory model's entry points: profile a workload and check the profile on real steps
(:func:`profile_memory`), predict a configuration, profiling when no profile is given
(:func:`predict_memory`), and a budget in bytes (:func:`budget_bytes`).

They combine the pieces below them, which never import this module: the fake-tensor profile
(:mod:`autotune.memory.profile`), the composition from a profile (:mod:`autotune.memory.model`)
and its check against real steps (:mod:`autotune.memory.check`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from autotune.config import TrainConfig
from autotune.memory.check import CheckStep, covering, unverified_check, verify_profile

# plan_of is also part of the contract a study loads from this module (search/predictor.py).
from autotune.memory.model import MemoryEstimate, compose_memory, plan_of
from autotune.memory.profile import DEFAULT_SIZES, fake_profile
from autotune.memory.profile_record import MODES, MemoryProfile

if TYPE_CHECKING:
    from autotune.units import MemoryBudget
    from autotune.workload import Workload

__all__ = ["budget_bytes", "fixed_split_sizes", "predict_memory", "profile_memory"]


def fixed_split_sizes(micro_batch_size: int) -> tuple[int, int]:
    """The two micro-batch sizes to profile a run at whose split never changes: its own and half
    of it (1 and 2 for a micro-batch of 1). The memory model draws a line through its two sizes;
    at a profiled size the prediction is that fake run's peak, whatever the memory does between.

    Example:
        >>> fixed_split_sizes(8), fixed_split_sizes(3), fixed_split_sizes(1)
        ((4, 8), (1, 3), (1, 2))
    """
    if micro_batch_size < 2:
        return 1, 2
    return micro_batch_size // 2, micro_batch_size


def profile_memory(
    workload: Workload,
    *,
    modes: Sequence[str] = ("fp32",),
    micro_batch_sizes: tuple[int, int] = DEFAULT_SIZES,
    checkpointed: bool = True,
    selective: bool = False,
    verify: bool = True,
    reuse: MemoryProfile | None = None,
    device: str = "cpu",
    step: CheckStep | None = None,
    note: Callable[[str], None] | None = None,
) -> MemoryProfile:
    """Profile ``workload`` for the memory model, under ``FakeTensorMode`` (shapes only, no compute).

    ``checkpointed=False`` skips the runs with every block checkpointed (half the time); the
    profile then serves configs without checkpointing only. ``selective=True`` adds the runs with
    every block recomputed selectively (configs with a ``"selective"`` block need them; their
    kind is then checked too). ``reuse``: an earlier profile of the
    same workload; the modes it holds are not profiled again, and its checks stand (only the
    kinds it lacks run real steps).

    Fake tensors go through the same kernels' shape logic, and MemTracker counts them as real
    ones (the same bytes on the built-in workloads, to a few hundred bytes with bf16 blocks), so
    this is cheap for any model size: under a second of Python per run (four per mode: two sizes,
    plain and checkpointed), mostly MemTracker's bookkeeping.

    ``verify=True`` (the default) then checks the profile against real steps, one per kind of
    configuration it can predict (:func:`autotune.memory.check.verify_profile`: two real steps
    each, the fp32 mode profiled too if not asked for) and records them in ``checks``, warning
    (:class:`PredictionWarning`) where they disagree. The steps run on ``device`` (a device type
    the checks then stand for), in this process, or through ``step`` (a study's measuring child);
    ``note`` gets one line per phase with its seconds. A model
    the fake run cannot go through (a data-dependent operation, an operator without a meta
    kernel) raises :class:`PredictionError` with the reason.
    """
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        raise ValueError(f"profile_memory: modes must be among {MODES}, but got {unknown[0]!r}.")
    if verify and "fp32" not in modes:
        modes = ("fp32", *modes)

    def said(mode: str, seconds: float) -> None:  # one line per mode as it ends: seconds each at real size
        assert note is not None
        note(f"memory model: fake-tensor profile of {mode} (no real compute, {seconds:.1f} s)")

    profile = fake_profile(
        workload,
        modes=modes,
        micro_batch_sizes=micro_batch_sizes,
        checkpointed=checkpointed,
        selective=selective,
        reuse=reuse,
        device_type=device.partition(":")[0],  # the kernels the profile saves for: the checks' device's
        on_mode=None if note is None else said,
    )
    if not verify:
        return profile
    done = () if reuse is None else reuse.checks
    checks = verify_profile(workload, profile, done=done, step=step, device=device, note=note)
    return dataclasses.replace(profile, checks=checks)


def predict_memory(
    workload: Workload,
    config: TrainConfig,
    *,
    ranks: int | None = None,
    profile: MemoryProfile | None = None,
    device_type: str = "cpu",
    verify: bool = True,
    note: Callable[[str], None] | None = None,
) -> MemoryEstimate:
    """Predict the peak tensor bytes per rank of ``config``, by category, before running it.

    The profile is a few seconds of fake-tensor forward/backward passes (no real compute), so
    this answers for models and rank counts this machine cannot run. The estimate is
    ``verified`` only if its profile was checked against real steps and agreed
    (:mod:`autotune.memory.check`).

    Args:
        workload: The model, data and loss (a GPU-resident model is profiled from a host copy).
        config: The configuration to predict.
        ranks: Data-parallel ranks to predict at (default: ``config.ranks``); the prediction is
            per rank.
        profile: A profile from :func:`profile_memory` holding at least
            ``plan_of(...).modes``; taken when not given.
        device_type: ``"cpu"`` or ``"cuda"``: where the run would be (a DeepSpeed engine's
            precision depends on it). On CUDA the prediction is of allocated bytes (see
            :class:`~autotune.memory.model.MemoryEstimate`). The estimate is verified only by
            checks on this device type: on a machine without it none run, and the estimate says
            it is unverified there.
        verify: With a profile taken here, check it against real steps of a copy of the model
            on ``device_type`` (two steps at a small micro-batch per kind of configuration);
            ``False`` skips them and leaves the estimate unverified.
        note: Gets one line per phase of a profile taken here (the fake-tensor profile, each
            check), with its seconds.

    Returns:
        The predicted peak by category (:class:`~autotune.memory.model.MemoryEstimate`;
        ``total`` is the peak).

    Raises:
        PredictionError: The model cannot be profiled under fake tensors.
        ConfigError: ``profile`` lacks a mode ``config`` needs.

    Example:
        >>> from autotune import TrainConfig, load_workload, predict_memory
        >>> wl = load_workload("mlp-digits")
        >>> estimate = predict_memory(wl, TrainConfig(micro_batch_size=32))
        >>> estimate.parameters, estimate.optimizer_state  # fp32 weights; AdamW's two moments
        (2192424, 4384968)
        >>> estimate.verified  # checked against a real step of a copy of the model
        True
    """
    if ranks is not None:
        config = dataclasses.replace(config, ranks=ranks)
    plan = plan_of(config, num_blocks=len(workload.block_names()), device_type=device_type)
    if profile is None:
        # A check on the host says nothing about a GPU's kernels: without the device, none runs.
        verify = verify and _device_available(device_type)
        profile = profile_memory(
            workload,
            modes=plan.modes,
            checkpointed="full" in plan.recompute,
            selective="selective" in plan.recompute,
            verify=verify,
            device=device_type,
            note=note,
        )
    estimate = compose_memory(workload, config, profile, device_type=device_type, plan=plan)
    check = covering(profile, config, plan, estimate.total, device_type=device_type)
    if check is None and not profile.checks and not _device_available(device_type):
        reason = f"no real step on {device_type} checked it: this machine has no {device_type} device"
        check = unverified_check("unchecked", config, estimate.total, reason, device_type)
    return dataclasses.replace(estimate, verified=check is not None and check.verified, verification=check)


def budget_bytes(
    budget: MemoryBudget | None,
    workload: Workload,
    *,
    ranks: int = 1,
    device_type: str = "cpu",
    note: Callable[[str], None] | None = None,
) -> int | None:
    """``budget`` in bytes per rank, for ``measure``, ``predict`` and ``study``.

    A percentage (``MemoryBudget.fraction``) is of the *predicted* peak per rank of the PyTorch
    default configuration at ``ranks``: fp32, the workload's batch split over the ranks in one
    micro-batch each, nothing recomputed, ZeRO stage 0 (what ``autotune tune`` starts from, and
    measures instead). A prediction runs no real compute, so the budget is known before anything
    runs or is written; on the local runner it equals the measured peak within a few hundred bytes.
    ``note`` gets the profile's line, as :func:`predict_memory`'s.
    """
    if budget is None:
        return None
    per_rank = max(1, min(workload.batch_size // ranks, workload.dataset_size or workload.batch_size))
    default = TrainConfig(micro_batch_size=per_rank, ranks=ranks)
    # The total does not depend on the check: no real step for a figure the check cannot change.
    return budget.resolve(
        lambda: predict_memory(workload, default, device_type=device_type, verify=False, note=note).total
    )


def _device_available(device_type: str) -> bool:
    """Whether this process can run a step on ``device_type`` (``"cpu"``, ``"cuda"``)."""
    if device_type == "cpu":
        return True
    import torch

    return device_type == "cuda" and torch.cuda.is_available()
