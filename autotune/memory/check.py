"""Check a memory profile against real, exactly tracked training steps, one per kind of configuration.

A fake-tensor profile is only as faithful as the meta kernels it runs through (an LSTM's oneDNN
workspace was invisible to it until :mod:`autotune.memory.fake_workspaces`), and the composition
of per-block knobs is only as right as its picture of the model (a layer shared by two block
positions, a skip connection: :mod:`autotune.memory.structure`). So each *kind* of configuration
the profile can predict is checked on one real step before a prediction of that kind is trusted:

* ``default``: fp32, nothing recomputed, at the profile's larger micro-batch size;
* ``recompute``: every other block recomputed (every block, when the blocks are not a chain), at
  the smaller micro-batch size: a block recomputed next to one that is not is where composing
  per-block savings goes wrong;
* ``selective``: every other block recomputed selectively (likewise), where the profile holds
  the selective runs: what torch's selective-checkpoint cache keeps is counted from the fake
  run's operations, which a real step confirms;
* ``bf16`` / ``fp16``: every other block an autocast island (every block, likewise), for each
  reduced precision the profile holds;
* ``outer-bf16`` / ``outer-fp16``: a reduced outer precision (the forward and the loss under
  autocast), for each one the profile holds: every other block in it and the rest fp32
  exceptions, those recomputed where the profile has recomputed runs (every block alike when
  the blocks are not a chain, or when the profile holds only one of the two block modes).

A configuration is verified only if every kind it uses was checked and agreed within
:data:`TOLERANCE` (:func:`covering`) **on the device type it will run on**: the fake profile runs
the host's meta kernels, and a GPU's kernels keep other buffers (a GPT-2 decoder's PyTorch default
held 1.6x the host-checked prediction on an H200), so a check on the CPU says nothing about CUDA.
The check steps therefore run where the training will (:data:`CheckStep`: a study's measuring
child on its device; on a GPU they take milliseconds), never on the host for a GPU-bound run. On a
model whose blocks are not a chain, a configuration that treats blocks differently is unverified
whatever the checks said, because the composition does not hold there. An unverified prediction
is never acted on: a study measures the configuration instead of pruning it, the budget gate
refuses it until measured, ``predict`` prints UNVERIFIED.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from autotune.config import REDUCED_PRECISIONS, Checkpoint, Precision, TrainConfig
from autotune.errors import ConfigError, PredictionWarning, one_line
from autotune.memory.check_text import check_line, not_chain_message, unchecked_reason, unverified_message
from autotune.memory.model import compose_memory
from autotune.memory.profile_record import mode_precisions, outer_mode

if TYPE_CHECKING:
    from autotune.memory.model import Plan
    from autotune.memory.profile_record import MemoryProfile
    from autotune.workload import Workload

__all__ = [
    "TOLERANCE",
    "CheckStep",
    "StepPeak",
    "Verification",
    "check_configs",
    "check_step",
    "covering",
    "kinds_of",
    "trial_checks",
    "unverified_check",
    "verify_profile",
]

#: The memory model's target: predictions within 5% of the measured peak.
TOLERANCE = 0.05


@dataclass(frozen=True, kw_only=True)
class Verification:
    """A profile's prediction for ``config`` next to the peak one real step of it held.

    ``kind``: the kind of configuration it stands for (see the module docstring), or
    ``"composition"`` / ``"unchecked"`` for a configuration no check can stand for (``measured``
    None). ``predicted``/``measured``: peak tensor bytes (``measured`` is None if the real step
    failed or none ran). ``relative_error``: (predicted - measured) / measured. ``verified``: both
    known and within :data:`TOLERANCE`; otherwise ``reason`` says what went wrong. ``device``:
    the device type the real step ran on (``"cpu"``, ``"cuda"``): the check stands for that device
    type only. ``seconds``: what the check step cost (0 where none ran). ``trial``: the study trial
    whose measured step made the check (:func:`trial_checks`), or None for a check step or an
    adaptive run's measured step (:meth:`autotune.memory.gate.BudgetGate.record`).
    """

    config: TrainConfig
    predicted: int
    measured: int | None
    relative_error: float | None
    verified: bool
    reason: str | None
    kind: str = "default"
    device: str = "cpu"
    seconds: float = 0.0
    trial: int | None = None

    def __post_init__(self) -> None:
        if self.verified == (self.reason is not None):
            raise ConfigError(
                f"Verification.reason must be None exactly when verified, but got verified={self.verified} "
                f"with reason={self.reason!r}."
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "config": self.config.to_dict(),
            "predicted": self.predicted,
            "measured": self.measured,
            "relative_error": self.relative_error,
            "verified": self.verified,
            "reason": self.reason,
            "device": self.device,
            # Only where a trial made it: a check step's dictionary (``predict --json``) is as it was.
            **({} if self.trial is None else {"trial": self.trial}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verification:
        """The inverse of :meth:`to_dict` (``seconds`` is not kept: 0)."""
        return cls(
            kind=data["kind"],
            config=TrainConfig.from_dict(data["config"]),
            predicted=data["predicted"],
            measured=data["measured"],
            relative_error=data["relative_error"],
            verified=data["verified"],
            reason=data["reason"],
            device=data["device"],
            trial=data.get("trial"),
        )


class StepPeak(NamedTuple):
    """What one check step found: ``measured`` peak tensor bytes, or None with ``failure`` (why)
    and ``out_of_memory`` (whether the device ran out: its size, not a kernel it lacks)."""

    measured: int | None
    failure: str | None
    out_of_memory: bool


#: How a check step is run: ``step(config, predicted) -> StepPeak``, one warm-up and one tracked optimizer
#: step of ``config`` at the profile's worst-case batch, wherever the training will run
#: (:func:`check_step` in this process, or a study's measuring child on its device).
CheckStep = Callable[[TrainConfig, int], StepPeak]

#: A check step runs only where its prediction, times this, is free: the prediction may be low by
#: the very error the check is for, and a step the kernel's OOM killer ends takes the whole
#: process with it (a 350M-parameter GPT-2 at micro-batch 4 x 1024 tokens on a 24 GiB host).
ROOM_MARGIN = 1.25


def check_configs(profile: MemoryProfile) -> dict[str, TrainConfig]:
    """The configuration each kind is checked on, for the kinds ``profile`` can predict."""
    n = len(profile.names)
    small, large = profile.micro_batch_sizes
    chain = profile.structure is None or profile.structure.chain
    # Alternate blocks exercise the composition at every boundary; where it does not hold (not a
    # chain), only uniform configurations can be verified, so the check is uniform too.
    some = tuple(i % 2 == 0 or not chain for i in range(n))
    out = {"default": TrainConfig(micro_batch_size=large)}
    if profile.modes["fp32"].checkpointed is not None:
        out["recompute"] = TrainConfig(micro_batch_size=small, checkpoint=some)
    if profile.modes["fp32"].selective is not None:
        selective: tuple[Checkpoint, ...] = tuple("selective" if x else False for x in some)
        out["selective"] = TrainConfig(micro_batch_size=small, checkpoint=selective)
    for mode in REDUCED_PRECISIONS:
        if mode in profile.modes:
            precision = tuple(mode if x else "fp32" for x in some)
            out[mode] = TrainConfig(micro_batch_size=small, precision=precision)
    for outer in REDUCED_PRECISIONS:
        config = _outer_check(profile, outer, some)
        if config is not None:
            out[f"outer-{outer}"] = config
    return out


def _outer_check(profile: MemoryProfile, outer: Precision, some: tuple[bool, ...]) -> TrainConfig | None:
    """The ``outer-*`` kind's configuration under ``outer``, at the smaller micro-batch: blocks
    alternating between ``outer`` and fp32 where both modes are profiled and compose (see
    :func:`_handover`), else every block in one of them (``outer`` first); a recomputed block next
    to one that is not where the modes have recomputed runs. None if no mode under ``outer``."""
    have = [p for p in (outer, "fp32") if outer_mode(p, outer) in profile.modes]
    if not have:
        return None
    inputs = {profile.modes[outer_mode(p, outer)].blocks[1].inputs for p in have}
    alternate = len(have) == 2 and len(inputs) == 1 and not all(some)
    precision: Precision | tuple[Precision, ...] = tuple(outer if x else "fp32" for x in some) if alternate else have[0]
    used = have if alternate else have[:1]
    checkpoint: bool | tuple[bool, ...] = False
    if all(profile.modes[outer_mode(p, outer)].checkpointed is not None for p in used):
        # The fp32 blocks where they alternate with reduced ones, else every other block (every
        # block, when the blocks are not a chain).
        checkpoint = tuple(not x for x in some) if alternate else some
    return TrainConfig(
        micro_batch_size=profile.micro_batch_sizes[0], precision=precision, outer_precision=outer, checkpoint=checkpoint
    )


def verify_profile(
    workload: Workload,
    profile: MemoryProfile,
    *,
    tolerance: float = TOLERANCE,
    done: Sequence[Verification] = (),
    step: CheckStep | None = None,
    device: str = "cpu",
    note: Callable[[str], None] | None = None,
) -> tuple[Verification, ...]:
    """Check each kind of :func:`check_configs` not already in ``done`` on one real step; warn
    (:class:`PredictionWarning`) for each that disagrees or fails, and once if the blocks are not
    a chain. Returns ``done`` and the new checks.

    Args:
        workload: The workload the profile is of.
        profile: The fake-tensor profile to check.
        tolerance: The largest relative error a verified check may have.
        done: Checks already made (of this profile's kinds on ``device``): not run again.
        step: Runs one check step of a configuration where the training will run (default:
            :func:`check_step` in this process on ``device``).
        device: The device type the steps run on; the checks stand for it only.
        note: Gets one line per check (its kind, figures and seconds), for a progress display.

    Returns:
        ``done`` followed by the new checks.

    Cost: per kind, two real optimizer steps (the first creates the optimizer state the
    prediction counts; the second runs under MemTracker, ~2x a plain step): up to four kinds, the
    default at the profile's larger micro-batch size, the rest at the smaller one. On a CPU that is
    seconds to minutes for a 100M-parameter model; on a GPU, milliseconds.
    """
    if step is None:
        target = device

        def step(config: TrainConfig, predicted: int) -> StepPeak:
            return check_step(workload, config, device=target, predicted=predicted)

    checked = {v.kind for v in done if v.device == device}
    new: list[Verification] = []
    for kind, config in check_configs(profile).items():
        if kind in checked:
            continue
        predicted = compose_memory(workload, config, profile, device_type=device).total
        start = time.perf_counter()
        measured, failure, out_of_memory = step(config, predicted)
        seconds = time.perf_counter() - start
        error = None if measured is None else (predicted - measured) / measured
        reason = failure
        if error is not None and abs(error) > tolerance:
            reason = _off(error)
        result = Verification(
            kind=kind,
            config=config,
            predicted=predicted,
            measured=measured,
            relative_error=error,
            verified=reason is None,
            reason=reason,
            device=device,
            seconds=seconds,
        )
        if note is not None:
            note(check_line(result))
        # A reduced precision whose step raises (bf16 around nn.LSTM on an AVX2 CPU: oneDNN has
        # no primitive) is not a prediction that missed: the configurations cannot run here at
        # all. The check stays unverified (so they are measured, and refused where they fail),
        # without a warning about the memory model on every run of such a model on such a CPU.
        cannot_run = kind != "default" and kind != "recompute" and measured is None and not out_of_memory
        if not result.verified and not cannot_run:
            warnings.warn(PredictionWarning(unverified_message(workload.name, result)), stacklevel=3)
        new.append(result)
    message = not_chain_message(workload.name, profile)
    if not done and message is not None:
        warnings.warn(PredictionWarning(message), stacklevel=3)
    return (*done, *new)


def _off(error: float) -> str:
    """Why a check with relative error ``error`` (beyond the tolerance) failed."""
    return f"the prediction is {abs(error):.1%} {'above' if error > 0 else 'below'} the measured peak"


def covering(
    profile: MemoryProfile, config: TrainConfig, plan: Plan, predicted: int, *, device_type: str = "cpu"
) -> Verification | None:
    """The check that decides whether ``config``'s prediction (``predicted`` bytes) on
    ``device_type`` is verified.

    A configuration that treats blocks differently on blocks that are not a chain is unverified
    (``kind="composition"``), whether the profile was checked or not. Otherwise None if the
    profile was not checked at all; a configuration using a kind no check on ``device_type``
    covered is unverified (``kind="unchecked"``: checks on another device type stand for that
    device only); else the first of its kinds' checks that failed, or, when all agreed, the one
    furthest off (what a caller's headroom must cover). DeepSpeed's 16-bit engines are covered by
    the default check, as their model states follow ZeRO's formulas and their activations the
    same fake runs.
    """
    uncomposed = _uncomposed(profile, plan)
    if uncomposed is not None:  # checked or not: no check can stand for it
        return unverified_check("composition", config, predicted, uncomposed, device_type)
    if not profile.checks:
        return None
    kinds = kinds_of(plan)
    checks = {v.kind: v for v in profile.checks if v.device == device_type}
    missing = [k for k in kinds if k not in checks]
    if missing:
        elsewhere = sorted({v.device for v in profile.checks if v.kind == missing[0]})
        reason = unchecked_reason(missing[0], device_type, elsewhere)
        return unverified_check("unchecked", config, predicted, reason, device_type)
    relevant = [checks[k] for k in kinds]
    failed = [v for v in relevant if not v.verified]
    if failed:
        return failed[0]
    return max(relevant, key=lambda v: abs(v.relative_error or 0.0))


def kinds_of(plan: Plan) -> list[str]:
    """The kinds of configuration (see the module docstring) whose checks a prediction of ``plan``
    needs: ``default`` always, then what it recomputes and each reduced and outer precision."""
    kinds = ["default", *(["recompute"] if "full" in plan.recompute else [])]
    kinds += ["selective"] if "selective" in plan.recompute else []
    kinds += sorted({m for m in plan.block_modes if m in REDUCED_PRECISIONS})
    kinds += sorted({f"outer-{mode_precisions(m)[1]}" for m in plan.block_modes if "@" in m})
    return kinds


def _uncomposed(profile: MemoryProfile, plan: Plan) -> str | None:
    """Why no check can stand for ``plan`` on this profile (its composition does not hold), or None."""
    structure = profile.structure
    mixed = len(set(zip(plan.block_modes, plan.recompute, strict=True))) > 1
    if structure is not None and not structure.chain and mixed:
        return f"{structure.describe()}: per-block configurations are composed for chain-shaped blocks only"
    return _handover(profile, plan)


def trial_checks(
    profile: MemoryProfile,
    config: TrainConfig,
    plan: Plan,
    predicted: int,
    measured: int,
    *,
    trial: int | None,
    device: str,
    tolerance: float = TOLERANCE,
) -> tuple[Verification, ...]:
    """The checks a study's measured trial makes: ``config`` (planned as ``plan``) was predicted
    ``predicted`` bytes and its tracked step on ``device`` held ``measured``, as a check step would
    have (the caller makes sure the step ran as one: one local process, at the profile's shapes).
    ``trial``: the study's trial number, or None for an adaptive run's step.

    A trial checks the kinds of :func:`kinds_of` that no check on ``device`` covered yet. Within
    ``tolerance``, each of them is verified by it. Off by more, the kind is flagged as a failed
    check step would flag it, with the figures, if it was the trial's only new kind; with two or
    more new kinds nothing is recorded (which one is off cannot be told), and they wait for a
    trial that tells them apart. None for a configuration no check can stand for (its composition
    does not hold: :func:`covering` says ``"composition"``), nor when every kind was checked.

    Returns:
        The new checks, one per kind, or ``()``.
    """
    if _uncomposed(profile, plan) is not None:
        return ()
    checked = {v.kind for v in profile.checks if v.device == device}
    new = [k for k in kinds_of(plan) if k not in checked]
    error = (predicted - measured) / measured
    agreed = abs(error) <= tolerance
    if not new or (not agreed and len(new) > 1):
        return ()
    reason = None if agreed else _off(error)
    return tuple(
        Verification(
            kind=kind,
            config=config,
            predicted=predicted,
            measured=measured,
            relative_error=error,
            verified=agreed,
            reason=reason,
            device=device,
            trial=trial,
        )
        for kind in new
    )


def _handover(profile: MemoryProfile, plan: Plan) -> str | None:
    """Why a configuration mixing fp32 and reduced blocks under a reduced outer precision cannot
    be composed on this model, or None. Nothing is cast back there: a block's input is what the
    block before it hands on, in its own mode's dtype. Where that dtype differs between the two
    modes (a block ending in a bare convolution hands bf16 on), the profile's uniform runs do not
    hold the mixed run's block inputs; where it does not (a residual stream kept in fp32, as in a
    pre-LN transformer), they do."""
    modes = set(plan.block_modes)
    if len(modes) < 2 or not all("@" in m for m in modes):
        return None
    inputs = {m: profile.modes[m].blocks[1].inputs for m in modes if m in profile.modes}
    if len(set(inputs.values())) <= 1:
        return None
    first, second = sorted(inputs)
    return (
        f"its blocks hand each other activations in different dtypes under outer precision "
        f"{mode_precisions(first)[1]} (block inputs of {sum(inputs[first])} bytes in mode {first!r}, "
        f"{sum(inputs[second])} in {second!r}): fp32 and reduced blocks are composed there only where they agree"
    )


def unverified_check(kind: str, config: TrainConfig, predicted: int, reason: str, device: str) -> Verification:
    """A verification no real step stands for (``"composition"``, ``"unchecked"``): ``reason`` says why."""
    return Verification(
        kind=kind,
        config=config,
        predicted=predicted,
        measured=None,
        relative_error=None,
        verified=False,
        reason=reason,
        device=device,
    )


def check_step(
    workload: Workload, config: TrainConfig, *, device: str | None = "cpu", predicted: int | None = None
) -> StepPeak:
    """One check step of ``config`` in this process on ``device``: the peak tensor bytes of one
    tracked optimizer step after one warm-up step, on the workload's worst-case samples (as the
    profile ran: :mod:`autotune.worst_case`), or why it failed.

    Args:
        workload: The workload (a copy of its model trains; the user's stays untouched).
        config: The configuration (one process).
        device: Where to run it: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or None (CUDA when available).
        predicted: The profile's prediction of its peak: where that (with :data:`ROOM_MARGIN`) is
            more than the device has free, no step runs and the check says so (out of memory).

    Returns:
        The measured peak, or the failure.
    """
    from autotune.measurement.cuda_memory import free_bytes
    from autotune.train.local import resolve_device
    from autotune.units import format_bytes

    where = resolve_device(device)
    free = None if predicted is None else free_bytes(where)
    if predicted is not None and free is not None and predicted * ROOM_MARGIN > free:
        why = (
            f"the check step would not fit on {where.type}: predicted {format_bytes(predicted)}, "
            f"{format_bytes(free)} free"
        )
        return StepPeak(None, why, True)
    import torch

    from autotune.measurement.oom import is_out_of_memory
    from autotune.measurement.tracker import tracked_step
    from autotune.train.local import Trainer
    from autotune.worst_case import at_worst_case

    worst = at_worst_case(workload, config.micro_batch_size)  # the user's data at fault: raised
    try:
        # Every step updates (a NaN loss is not skipped): the peak is a real step's, optimizer state included.
        trainer = Trainer(worst, config, device=device, skip_nonfinite=False)
        try:
            # The tracked step runs compiled code eagerly (the tracker's rule), and so does its
            # warm-up: compiling it (a user's compiled optimizer update) would cost seconds to
            # minutes and say nothing of the step the check counts.
            with torch.compiler.set_stance("force_eager"):
                trainer.step()  # creates the optimizer state, as measure()'s warmup does
            at_peak = tracked_step(trainer).at_peak
        finally:
            trainer.close()
    # A check of user code: whatever it raises (a kernel this device lacks, out of memory) leaves
    # the prediction unverified, with the reason, rather than crashing the caller.
    except Exception as e:
        return StepPeak(None, f"the real check step failed: {one_line(e)}", is_out_of_memory(e))
    return StepPeak(at_peak.total, None, False)
