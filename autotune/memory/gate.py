"""The admission rule: no configuration runs unless its memory is known to fit the budget.

One rule for every searcher, one arithmetic: :func:`~autotune.measurement.admission.admission`
(re-exported here with its :class:`Verdict`; it lives in ``measurement/`` so that the measurement
schedule asks it too). This module is the memory model's side of it: :meth:`BudgetGate.admits`,
THE ``admits(config) -> Verdict`` of adaptive runs, the callbacks, the policy source's plan and
the training environment (a gate per episode). The simulator's peaks are its memory table's,
exact, judged by :func:`admission` without headroom (:meth:`autotune.envs.core.TuningEnv.verdict`);
the study judges its memory model's predictions with :func:`admission` and
``unverified="measure"`` (:func:`autotune.search.budget.admits`). It lives below ``search/``,
``envs/`` and ``adapt/`` so that all of them can import it; ``autotune.adapt.BudgetGate``
re-exports it.

The rule: a measured peak is judged as is; a prediction with the headroom of
:func:`headroom_for` (:data:`~autotune.tuning.TUNING`'s ``local_headroom`` in one process,
``ranks_headroom`` on DeepSpeed ranks); an unverified prediction, or none, counts as over the
budget unless the configuration was measured. (A study's trial *is* that measurement, in an
isolated child process where an out-of-memory error is a result: there an unverified
configuration is measured, never pruned on the prediction.)

Every candidate is predicted by the memory model first (:func:`autotune.memory.predict.predict_memory`,
a fake-tensor profile taken once per run; on DeepSpeed ranks, per rank, with ZeRO's partitioning of
the model states). A prediction is trusted only if its profile was
verified against a real step; an unverified one counts as over the budget unless that config was
measured (exact tracked bytes of one of its real steps). Measured bytes, once known, override
the prediction. So adaptation never runs a configuration whose peak is not known to fit: on a GPU,
no out-of-memory error the default run would not have had. What the gate knows of each
configuration's peak (its predictions, the real steps measured, what they taught it on the
device) is :class:`~autotune.memory.gate_predictions.GatePredictions`, which it extends with the
budget.

On CUDA the budget holds the caching allocator's *reserved* memory, which is what runs out
(allenai/OLMo-core#297: allocated 74.2 GiB, reserved 80.8 GiB at the OOM). The memory model
predicts allocated bytes; the gate scales a prediction by the reserved/allocated ratio of the
real steps it has seen on the device (:meth:`BudgetGate.record` with the allocator's figures),
and a measured config by its reserved peak, each with at least
:data:`~autotune.measurement.cuda_memory.RESERVED_HEADROOM`.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING

from autotune.config import TrainConfig
from autotune.errors import ConfigError, PredictionError, PredictionWarning
from autotune.measurement.admission import Verdict, admission
from autotune.memory.gate_predictions import GatePredictions
from autotune.tuning import TUNING
from autotune.units import MemoryBudget

if TYPE_CHECKING:
    from collections.abc import Sequence

    from autotune.config import Precision
    from autotune.measurement.progress import Note
    from autotune.memory.profile_record import MemoryProfile
    from autotune.workload import Workload

__all__ = [
    "BudgetGate",
    "Verdict",
    "admission",
    "headroom_for",
    "memory_profile",
    "profile_modes",
    "profile_or_reason",
]


def headroom_for(config: TrainConfig) -> float:
    """The margin on a prediction of ``config``: the memory model's error where it runs."""
    return TUNING.ranks_headroom if config.on_deepspeed else TUNING.local_headroom


def profile_modes(
    *, reduced_precision: bool, ranks: int = 1, outers: Sequence[Precision] = ("fp32",)
) -> tuple[str, ...]:
    """The profile modes a run's gate needs (:data:`~autotune.memory.profile_record.MODES`), in
    the order profiled: for the outer precision fp32, fp32 blocks and, if ``reduced_precision``,
    bf16 blocks (on ranks also bf16 weights, a DeepSpeed bf16 engine's); for a reduced outer
    precision, its fp32 exceptions and blocks in it (what :func:`autotune.memory.model.plan_of`
    reads for a configuration under it).

    Args:
        reduced_precision: Whether the blocks may run in bf16 under an fp32 outer precision.
        ranks: Data-parallel ranks.
        outers: The outer precisions the run may train (:func:`autotune.adapt.sources.outer_in_play`).

    Returns:
        The modes, each once.

    Example:
        >>> profile_modes(reduced_precision=True, outers=("fp32", "bf16"))
        ('fp32', 'bf16', 'fp32@bf16', 'bf16@bf16')
    """
    modes: list[str] = []
    for outer in outers:
        if outer != "fp32":
            modes += [f"fp32@{outer}", f"{outer}@{outer}"]
        elif reduced_precision:
            # All blocks bf16 is an autocast island on one process, a bf16 engine on ranks.
            modes += ["fp32", "bf16", "bf16-weights"] if ranks > 1 else ["fp32", "bf16"]
        else:
            modes.append("fp32")
    return tuple(dict.fromkeys(modes))


def memory_profile(
    workload: Workload,
    *,
    reduced_precision: bool,
    ranks: int = 1,
    outer: Precision = "fp32",
    device_type: str = "cpu",
    outers: Sequence[Precision] = (),
) -> MemoryProfile | None:
    """The memory model's profile (fp32 and, if asked, bf16 blocks; plain and recomputed; on
    ranks also bf16 weights, a DeepSpeed bf16 engine's); None if the model cannot be profiled
    (then only measured configurations pass the gate; :func:`profile_or_reason` also says why).
    Under a reduced ``outer`` precision (a framework's loop that autocasts the whole forward
    itself), its blocks' modes instead: fp32 exceptions and blocks in it; ``outers``: the other
    outer precisions the run may train, whose modes it holds too (:func:`profile_modes`).

    On the CPU (``device_type``) it is verified on one real step per kind of a copy of the model;
    on another device no real step runs on the host (its kernels are not the device's): the first
    measured step of each kind on the device is that kind's check (:meth:`BudgetGate.record`)."""
    return profile_or_reason(
        workload,
        reduced_precision=reduced_precision,
        ranks=ranks,
        outer=outer,
        device_type=device_type,
        stacklevel=4,
        outers=outers,
    )[0]


def profile_or_reason(
    workload: Workload,
    *,
    reduced_precision: bool,
    ranks: int = 1,
    outer: Precision = "fp32",
    device_type: str = "cpu",
    stacklevel: int = 3,
    selective: bool = False,
    outers: Sequence[Precision] = (),
    note: Note | None = None,
    micro_batch_sizes: tuple[int, int] | None = None,
) -> tuple[MemoryProfile | None, str | None]:
    """:func:`memory_profile`, and why there is none: ``(profile, None)`` or ``(None, reason)``
    (the :class:`PredictionError`'s message, also warned as a :class:`PredictionWarning`).
    ``selective``: with the runs of every block recomputed selectively (two more fake runs per
    mode), where the run may move to a selective configuration; without them such a
    configuration has no prediction and is measured before it counts. ``outers``: the other
    outer precisions the run may move to (:func:`autotune.adapt.sources.outer_in_play`): their
    modes too (:func:`profile_modes`; a reduced one is two more modes and, on the CPU, one more
    kind of check step, ``outer-bf16``), else such a configuration has no prediction either.
    ``note``: each phase's line (:func:`~autotune.memory.predict.profile_memory`'s).
    ``micro_batch_sizes``: the two the profile runs at (None: its default)."""
    from autotune.memory.predict import profile_memory
    from autotune.memory.profile import DEFAULT_SIZES

    modes = profile_modes(reduced_precision=reduced_precision, ranks=ranks, outers=(outer, *outers))
    # A check step on the host verifies the host's kernels only, and for a model bound for a GPU
    # it costs minutes and tens of GB of host memory: there the device's own steps check it.
    verify = device_type == "cpu"
    try:
        profile = profile_memory(
            workload,
            modes=modes,
            micro_batch_sizes=micro_batch_sizes or DEFAULT_SIZES,
            checkpointed=True,
            selective=selective,
            verify=verify,
            device=device_type,
            note=note,
        )
        return profile, None
    except PredictionError as e:
        warnings.warn(PredictionWarning(f"{e}: only measured configurations will be admitted"), stacklevel=stacklevel)
        return None, str(e)


class BudgetGate(GatePredictions):
    """Admit configs whose peak is known to fit ``budget`` bytes.

    A configuration is admitted on a measured peak (exact, of a real step), else on a verified
    prediction of the memory model plus ``headroom``; an unverified prediction admits nothing.
    Where a profile's check against a real step was further off than the headroom
    (:meth:`trusts`), an adaptive run measures each configuration's first step instead of
    trusting it, and a config measured over the budget is left at once. The headrooms (2% on
    one process, 5% on DeepSpeed ranks) cover the memory model's measured error where it runs
    (docs/benchmark-log.md, "The budget gate's headroom").

    Args:
        workload: The workload whose configurations it judges.
        budget: Peak tensor bytes allowed (per rank on ranks), >= 1.
        profile: The memory model's profile of ``workload`` (None: no predictions, only
            measurements admit).
        headroom: Safety margin on predictions (not on measurements), a fraction in [0, 1).
        device_type: Where the run trains, ``"cpu"`` or ``"cuda"`` (a DeepSpeed engine's
            precision, and the caching allocator's overhead, depend on it).

    Raises:
        ConfigError: ``budget`` or ``headroom`` out of range.
    """

    def __init__(
        self,
        workload: Workload,
        budget: int,
        *,
        profile: MemoryProfile | None,
        headroom: float = TUNING.local_headroom,
        device_type: str = "cpu",
    ) -> None:
        if not isinstance(budget, int) or budget < 1:
            raise ConfigError(f"the memory budget must be an int >= 1 bytes, but got {budget!r}.")
        if not 0.0 <= headroom < 1.0:
            raise ConfigError(f"headroom must be in [0, 1), but got {headroom!r}.")
        self.workload = workload
        super().__init__(workload, profile=profile, headroom=headroom, device_type=device_type)
        self.budget = budget

    @classmethod
    def build(
        cls,
        workload: Workload,
        budget: MemoryBudget,
        default: TrainConfig,
        *,
        reduced_precision: bool,
        device_type: str = "cpu",
        selective: bool = False,
        outers: Sequence[Precision] = (),
        note: Note | None = None,
        micro_batch_sizes: tuple[int, int] | None = None,
    ) -> BudgetGate:
        """Profile ``workload`` and resolve ``budget`` into a gate.

        Args:
            workload: The workload to profile.
            budget: The budget; a percentage is of ``default``'s predicted peak (per rank when
                ``default`` runs on ranks).
            default: The run's own configuration.
            reduced_precision: Whether the profile must cover bf16/fp16 blocks (only a decision
                source proposes them).
            selective: Whether the profile must cover selectively recomputed blocks (a decision
                source may propose them: :func:`autotune.adapt.sources.selective_in_play`).
            device_type: ``"cpu"`` or ``"cuda"``.
            outers: The outer precisions a decision source may move the run to besides
                ``default``'s (:func:`autotune.adapt.sources.outer_in_play`): the profile covers
                their modes too (:func:`profile_modes`).
            note: Each setup phase's line, with its seconds (the fake-tensor profile, the checks).
            micro_batch_sizes: The two micro-batch sizes the profile runs at (None: its
                default). Where the run's split never changes, they hold its micro-batch: the
                prediction there is the fake run's own, not a line drawn from smaller ones
                (a loss computed in tiles stops growing past one: TRL's fused LM head).

        Returns:
            The gate, its headroom the one for where ``default`` runs.

        Raises:
            ConfigError: a percentage budget where the memory model cannot predict ``default``
                (give the budget in bytes then).
        """
        ranks = default.ranks
        profile, why = profile_or_reason(
            workload,
            reduced_precision=reduced_precision,
            ranks=ranks,
            outer=default.outer_precision,
            device_type=device_type,
            stacklevel=4,
            selective=selective,
            outers=outers,
            note=note,
            micro_batch_sizes=micro_batch_sizes,
        )
        gate = cls(workload, 1, profile=profile, headroom=headroom_for(default), device_type=device_type)
        gate.unprofiled = why

        def default_peak() -> int:
            predicted = gate.predict(default)
            if predicted is None:
                raise ConfigError(
                    "memory_budget as a percentage needs a memory prediction of the default configuration, "
                    f"which failed ({gate.unpredicted(default)}): give the budget in bytes (e.g. '8GiB')."
                )
            return predicted[0]

        gate.budget = budget.resolve(default_peak)
        return gate

    def admits(self, config: TrainConfig) -> Verdict:
        """Whether ``config`` may run: on its measured peak if known, else its prediction.

        On CUDA a measured reserved peak (with its headroom) is what counts, and a prediction
        is scaled by the highest reserved/allocated ratio seen.

        Args:
            config: The configuration.

        Returns:
            The verdict, with the figures and rule in ``reason``.
        """
        if config in self.failed:
            why = f"a real step failed: {self.failed[config]}"
            return Verdict(admitted=False, reason=why, predicted=None, measured=None)
        measured = self.measured.get(config)
        predicted = self.predict(config) if measured is None else None
        total, verified = predicted if predicted is not None else (None, False)
        unpredicted = self.unpredicted(config) if measured is None and total is None else None
        verdict = admission(
            budget=self.budget,
            headroom=self.headroom,
            measured=measured,
            predicted=total,
            verified=verified,
            unpredicted=unpredicted,
            reserved=self.reserved.get(config) if measured is not None else None,
            reserved_ratio=self.reserved_ratio if self.on_cuda else None,
        )
        if measured is None and verified and self.on_cuda and self.reserved_ratio is None:
            reason = verdict.reason + " (allocated: no reserved/allocated ratio measured on this device yet)"
            verdict = dataclasses.replace(verdict, reason=reason)
        return self._scaled(config, self._awaiting(config, verdict))

    def _awaiting(self, config: TrainConfig, verdict: Verdict) -> Verdict:
        """``verdict`` saying, for a prediction admitted before the device checked its kinds
        (:meth:`awaits_device`), that it is unverified there and why."""
        if verdict.measured is not None or not self.awaits_device(config):
            return verdict
        kinds = ", ".join(self.kinds_of(config))
        why = f"unverified on {self.device_type} until a step of its kind ({kinds}) is measured there"
        return dataclasses.replace(verdict, reason=f"{verdict.reason}; {why}: its first step is")

    def _scaled(self, config: TrainConfig, verdict: Verdict) -> Verdict:
        scale = self.device_scale(config) if verdict.measured is None else 1.0
        if scale == 1.0:
            return verdict
        kinds = ", ".join(self.kinds_of(config))
        reason = f"{verdict.reason}; x{scale:.4f}: real steps on this device came above the memory model ({kinds})"
        return dataclasses.replace(verdict, reason=reason)
