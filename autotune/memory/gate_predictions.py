"""What a budget gate knows of each configuration's peak: the memory model's predictions where the
run trains, corrected by the real steps measured there (:class:`GatePredictions`, which
:class:`autotune.memory.gate.BudgetGate` extends with the budget and its verdict).

Off the CPU (a model on a GPU) no check step runs on the host: the host's kernels are not the
device's (a GPT-2 decoder's default held 1.6x its host-checked prediction on an H200), and a real
step there costs minutes and tens of GB of host memory at 100M parameters. The first measured step
of each kind on the device is that kind's check instead (:meth:`GatePredictions.record`, as a study's
first trial of a kind is); until then a prediction of the kind is admitted on its figures with the
headroom, and its first step is measured (:meth:`GatePredictions.awaits_device`, :meth:`GatePredictions.trusts`).
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import TYPE_CHECKING

from autotune.config import TrainConfig
from autotune.errors import PredictionWarning
from autotune.measurement.cuda_memory import AllocatorStats
from autotune.tuning import TUNING

if TYPE_CHECKING:
    from autotune.memory.check import Verification
    from autotune.memory.model import MemoryEstimate, Plan
    from autotune.memory.profile_record import MemoryProfile
    from autotune.workload import Workload

__all__ = ["GatePredictions"]


class GatePredictions:
    """A workload's configurations' peaks as a budget gate knows them: measured, predicted, failed.

    A prediction is the memory model's (memoized), scaled by how far real steps on this device
    came above predictions of its kinds (:meth:`device_scale`); off the CPU the first measured
    step of each kind is its check (:meth:`record`). :class:`autotune.memory.gate.BudgetGate`
    judges these against its budget.

    Args:
        workload: The workload whose configurations it predicts.
        profile: The memory model's profile of ``workload`` (None: no predictions).
        headroom: Safety margin on predictions (not on measurements), a fraction in [0, 1): a
            measured step further above its prediction scales the predictions of its kinds.
        device_type: Where the run trains, ``"cpu"`` or ``"cuda"``.
    """

    def __init__(
        self,
        workload: Workload,
        *,
        profile: MemoryProfile | None,
        headroom: float = TUNING.local_headroom,
        device_type: str = "cpu",
    ) -> None:
        self.workload = workload
        self.headroom = headroom
        self.profile = profile
        self.device_type = device_type
        self.measured: dict[TrainConfig, int] = {}
        self.reserved: dict[TrainConfig, int] = {}  # measured reserved peaks (CUDA)
        # The highest reserved/allocated ratio of the real steps seen (CUDA): the allocator's
        # overhead grows with the variety of block sizes it has cached, so the worst one stands.
        self.reserved_ratio: float | None = None
        # Per kind of configuration (:func:`kinds_of`), the highest measured/predicted ratio of the
        # real steps on this device, where above 1 by more than the headroom. The profile and its
        # check run on the host, and a GPU kernel can save more than its CPU counterpart (up to
        # ~20% more on the H100 run: docs/benchmark-log.md). Predictions of that kind are scaled by
        # it from then on, and no longer trusted without a measured first step.
        self.device_error: dict[str, float] = {}
        self.failed: dict[TrainConfig, str] = {}  # real steps that failed -> why (never admitted)
        self._predicted: dict[TrainConfig, MemoryEstimate] = {}
        # A batch outgrew the workload's worst case (the profile was taken again at it): the run's
        # batches are not of one shape, so a measured step need not be at the profile's shapes.
        self.outgrown = False
        # Why ``profile`` is None, where the memory model failed (said in each verdict without a
        # prediction, never as a missing number).
        self.unprofiled: str | None = None

    def replace_profile(self, profile: MemoryProfile | None, *, unprofiled: str | None = None) -> None:
        """Predict from ``profile`` from now on, forgetting every measurement and prediction so far.

        Measurements and predictions so far were of smaller batches, so they no longer stand for
        a configuration's peak.

        Args:
            profile: One taken at a larger batch than the last (:mod:`autotune.adapt.shape_guard`).
            unprofiled: Why ``profile`` is None (:func:`autotune.memory.gate.profile_or_reason`).
        """
        self.profile, self.unprofiled = profile, unprofiled
        self.outgrown = True
        self._predicted.clear()
        self.measured.clear()
        self.reserved.clear()

    def record(
        self, config: TrainConfig, peak_bytes: int, *, allocator: AllocatorStats | None = None
    ) -> tuple[Verification, ...]:
        """Record that a real step of ``config`` on this device peaked at ``peak_bytes``.

        A peak more than the headroom above the prediction scales every prediction of the same
        kind from then on (:meth:`device_scale`). The first measured step of a kind no check on
        this device covered is that kind's check (:func:`~autotune.memory.check.trial_checks`,
        as a study's first trial of it is): from then on predictions of the kind are verified on
        this device, or, off by more than the tolerance, unverified with its figures (a
        :class:`PredictionWarning`) and admitted only where measured.

        Args:
            config: The configuration.
            peak_bytes: Its exact peak tensor bytes (the same every time).
            allocator: On CUDA, the caching allocator's peaks over that step.

        Returns:
            The checks it made (``()``: none).
        """
        self.measured[config] = peak_bytes
        estimate = self.estimate(config)
        if estimate is not None and peak_bytes > estimate.total * (1.0 + self.headroom):
            ratio = peak_bytes / estimate.total
            for kind in self.kinds_of(config):
                self.device_error[kind] = max(ratio, self.device_error.get(kind, 1.0))
        if allocator is not None:
            self.reserved[config] = allocator.reserved_peak
            self.observe(allocator)
        return self._device_checks(config, estimate, peak_bytes)

    def _device_checks(
        self, config: TrainConfig, estimate: MemoryEstimate | None, peak_bytes: int
    ) -> tuple[Verification, ...]:
        """The kinds a measured step of ``config`` checks on this device, added to the profile's
        checks. Only a step a check step would have run counts: one process, no ZeRO, on data of
        one shape (elsewhere a step's batch need not be the worst case the profile predicts); with
        LayerDrop (:mod:`autotune.layer_drop`) only a step that did not come in under the prediction
        by more than the tolerance (one that skipped a layer is not the step predicted)."""
        from autotune.memory.check import TOLERANCE, trial_checks
        from autotune.memory.check_text import unverified_message
        from autotune.memory.model import plan_of

        if self.profile is None or estimate is None or peak_bytes <= 0:
            return ()
        if config.ranks != 1 or config.zero_stage != 0 or self.outgrown or not self.workload.worst_case.uniform:
            return ()
        if self.workload.drops_layers is not None and peak_bytes < estimate.total * (1.0 - TOLERANCE):
            # LayerDrop: a step that skipped a layer peaks below the step predicted (every layer
            # running), and says nothing of it; one that ran them all (or came above) checks it.
            return ()
        plan = plan_of(config, num_blocks=len(self.profile.names), device_type=self.device_type)
        new = trial_checks(self.profile, config, plan, estimate.total, peak_bytes, trial=None, device=self.device_type)
        if new:
            self.profile = dataclasses.replace(self.profile, checks=(*self.profile.checks, *new))
            self._predicted.clear()  # their verifications change
            if not new[0].verified:
                warnings.warn(PredictionWarning(unverified_message(self.workload.name, new[0])), stacklevel=4)
        return new

    def record_failure(self, config: TrainConfig, why: str) -> None:
        """Record that a real step of ``config`` failed (out of memory, a kernel this machine
        lacks): it is refused from now on.

        No peak was measured, so nothing is learnt about the predictions of its kinds: recorded
        as a peak (2^62 bytes), a failed bf16 step with one block recomputed scaled every
        recompute prediction of an LSTM by about 6.6 x 10^10, and the environment then refused
        every recompute setting.

        Args:
            config: The configuration.
            why: The failure, in one line.
        """
        self.failed[config] = why

    def observe(self, allocator: AllocatorStats) -> None:
        """Record the caching allocator's peaks over real steps (of no config in particular).

        Args:
            allocator: A framework loop's run so far: its reserved/allocated ratio, if higher
                than any seen, scales predictions from now on.
        """
        ratio = allocator.reserved_ratio
        if ratio is not None and (self.reserved_ratio is None or ratio > self.reserved_ratio):
            self.reserved_ratio = ratio

    @property
    def on_cuda(self) -> bool:
        """Whether the run trains on CUDA (reserved memory then decides)."""
        return self.device_type == "cuda"

    def kinds_of(self, config: TrainConfig) -> tuple[str, ...]:
        """What in ``config`` the memory model predicts from its own part of the profile.

        Args:
            config: The configuration.

        Returns:
            Its reduced precisions, ``"recompute"``, ``"selective"`` and its reduced outer precision (``"outer-bf16"``),
            else (all plain fp32) ``("default",)``.
        """
        n = len(self.workload.block_names())
        kinds: list[str] = sorted({p for p in config.block_precisions(n) if p != "fp32"})
        levels = config.checkpoint_levels(n)
        kinds += ["recompute"] if "full" in levels else []
        kinds += ["selective"] if "selective" in levels else []
        kinds += [f"outer-{config.outer_precision}"] if config.outer_precision != "fp32" else []
        return tuple(kinds) or ("default",)

    def device_scale(self, config: TrainConfig) -> float:
        """How far real steps on this device came above the predictions of ``config``'s kinds.

        Args:
            config: The configuration.

        Returns:
            The highest measured/predicted ratio of its kinds (1.0: none came above).
        """
        return max((self.device_error.get(k, 1.0) for k in self.kinds_of(config)), default=1.0)

    def predict(self, config: TrainConfig) -> tuple[int, bool] | None:
        """The memory model's peak for ``config``, scaled by :meth:`device_scale`.

        Args:
            config: The configuration.

        Returns:
            ``(predicted peak bytes, admissible)``, or None without a profile. ``admissible``: the
            prediction is verified, or (off the CPU) unverified only because no step of its kinds
            was measured on the device yet (:meth:`awaits_device`).
        """
        estimate = self.estimate(config)
        if estimate is None:
            return None
        admissible = estimate.verified or self.awaits_device(config)
        return math.ceil(estimate.total * self.device_scale(config)), admissible

    def awaits_device(self, config: TrainConfig) -> bool:
        """Whether ``config``'s prediction is unverified only for what the device's own steps check.

        Off the CPU no check step runs on the host (its kernels are not the device's): the first
        measured step of each kind is its check (:meth:`record`). Until then a prediction of the
        kind is admitted on its figures with the headroom, and its first step is measured
        (:meth:`trusts` is False). A kind whose check was off (by more than
        :data:`~autotune.memory.check.TOLERANCE`), and a configuration whose composition does not
        hold (:func:`~autotune.memory.check.covering`'s ``"composition"``), are unverified as on
        the CPU: only a measurement admits them.

        Args:
            config: The configuration.

        Returns:
            Whether to admit its unverified prediction (False on the CPU, and where verified).
        """
        estimate = self.estimate(config)
        if self.device_type == "cpu" or estimate is None or estimate.verified:
            return False
        check = estimate.verification
        return check is None or check.kind == "unchecked"

    def unpredicted(self, config: TrainConfig) -> str:
        """Why :meth:`estimate` has no prediction of ``config``, in words.

        Args:
            config: A configuration :meth:`estimate` returns None for.

        Returns:
            The memory model's failure, or the profile mode ``config`` needs that the gate's
            profile lacks.
        """
        if self.profile is None:
            return self.unprofiled or "no memory profile"
        from autotune.memory.model import plan_of

        plan = plan_of(config, num_blocks=len(self.profile.names), device_type=self.device_type)
        missing = [m for m in plan.modes if m not in self.profile.modes]
        if missing:
            return f"the memory profile has no {missing[0]!r} runs"
        return "no memory prediction" if self._recomputed(plan) else "the memory profile has no selective runs"

    def _recomputed(self, plan: Plan) -> bool:
        """Whether the gate's profile holds the runs of every recompute level of ``plan``'s blocks."""
        assert self.profile is not None
        pairs = zip(plan.block_modes, plan.recompute, strict=True)
        return all(self.profile.modes[m].recomputed(level) is not None for m, level in pairs)

    def estimate(self, config: TrainConfig) -> MemoryEstimate | None:
        """The memory model's prediction of ``config`` (memoized), unscaled.

        Args:
            config: The configuration.

        Returns:
            The estimate, or None without a profile or where it lacks a mode ``config`` needs.
        """
        if self.profile is None:
            return None
        if config not in self._predicted:
            from autotune.memory.model import plan_of
            from autotune.memory.predict import predict_memory

            plan = plan_of(config, num_blocks=len(self.profile.names), device_type=self.device_type)
            if not set(plan.modes) <= set(self.profile.modes) or not self._recomputed(plan):
                # A mode the gate's profile does not hold (a reduced outer precision, which no
                # policy moves), or its selective runs (a level no policy moves yet): no
                # prediction, so the configuration is measured before it counts.
                return None
            self._predicted[config] = predict_memory(
                self.workload, config, profile=self.profile, device_type=self.device_type
            )
        return self._predicted[config]

    def trusts(self, config: TrainConfig) -> bool:
        """Whether ``config``'s prediction may stand in for a measurement.

        It may when it is verified (by checks on this device: off the CPU, measured steps of its
        kinds, :meth:`record`) and the check came within the headroom, and no real step on this
        device came above a prediction of its kind.
        "Verified" alone allows 5% (:data:`autotune.memory.check.TOLERANCE`), more than the
        headroom covers, and the error can grow with the micro-batch (docs/benchmark-log.md, "The
        budget gate's headroom"). The check is the one covering ``config``'s kind
        (:func:`autotune.memory.check.covering`): a recomputed configuration's is the recompute
        check's.

        Args:
            config: The configuration.

        Returns:
            Whether to trust the prediction without a measured first step.
        """
        estimate = self.estimate(config)
        check = estimate.verification if estimate is not None else None
        if estimate is None or not estimate.verified or check is None or check.relative_error is None:
            return False
        return abs(check.relative_error) <= self.headroom and self.device_scale(config) == 1.0

    def known_peak(self, config: TrainConfig) -> int | None:
        """``config``'s peak bytes if known: measured, else a verified prediction.

        Args:
            config: The configuration.

        Returns:
            The bytes, or None when neither is known.
        """
        measured = self.measured.get(config)
        if measured is not None:
            return measured
        predicted = self.predict(config)
        return predicted[0] if predicted is not None and predicted[1] else None
