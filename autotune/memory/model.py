"""Predict a configuration's peak tensor memory per rank, by category, before running it.

Model states follow ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", SC'20, Sec. 3 and 5): with Psi parameters on N data-parallel ranks,
mixed-precision Adam keeps 2*Psi bytes of 16-bit parameters, 2*Psi of 16-bit gradients and
K*Psi = 12*Psi of optimizer state (fp32 master weights + momentum + variance). Stage 1 partitions
the optimizer state (2 + 2 + 12/N bytes per parameter), stage 2 the gradients too (2 + 14/N),
stage 3 the parameters as well (16/N). In fp32 the parameters and gradients take 4 bytes and
DeepSpeed still keeps an fp32 master partition at stages 1-3 (so K = 4 + Adam's 8: measured, and
why stages 1-2 *add* memory at N = 1). K comes from the workload's own optimizer (profiled).

On top of the model states, each phase of a step adds its transients:

* forward/backward: activations and temporaries from the workload's profile
  (:func:`autotune.memory.profile.fake_profile`), linear in the micro-batch size. The profile
  runs every block alike (fp32, bf16, checkpointed or not); a config that mixes them is composed
  stretch by stretch: each from the run that ran *its* block as the config says, shifted by what
  the blocks before it keep in the config instead of in that run. A block keeps what its
  precision saves or, checkpointed, only its input (plus one block recomputed at a time,
  Korthikanti et al. 2022), or, recomputed selectively, its input and its matmul-like outputs;
  its input is one storage that the block before it may save too, counted once. Gradients as
  the runner keeps them (in ``.grad`` for the local runner and ZeRO 0-1, in buckets and an fp32
  partition for ZeRO 2-3) and, at ZeRO-3, the parameters gathered for the module being computed;
* optimizer step: the full gradients and the optimizer's temporaries (stage 0; the local runner
  also still holds the last micro-batch), or the fp32 gradient partition and the optimizer's
  temporaries on it (stages 1-3).

The peak is the larger of the two. What DeepSpeed does beyond the paper (bucket sizes, ZeRO 1-2's
padding, stage 2's gradient partition buffer, stage 0's flattened all-reduce buffer, the gathered
module at stage 3) was read from DeepSpeed 0.19.8 and checked against :func:`autotune.measure`.
On the local runner the forward/backward composition equals a fake-tensor run of the config
itself byte for byte. Its measured error against real steps, on the CPU and on a GPU, is on the
docs' benchmarks page (``benchmarks/memory_model.py``, ``benchmarks/gpu_check.py``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from autotune.config import RecomputeLevel, TrainConfig
from autotune.errors import ConfigError
from autotune.measurement.cuda_memory import reserved_of
from autotune.measurement.record import MEMORY_CATEGORIES, MemoryBreakdown
from autotune.memory.profile_record import outer_mode
from autotune.train.deepspeed_config import DEFAULT_BUCKET, bucket_elements, engine_precision

if TYPE_CHECKING:
    from autotune.memory.check import Verification
    from autotune.memory.profile_record import BlockSaves, MemoryProfile, Moment, Windows
    from autotune.workload import Workload

__all__ = ["MemoryEstimate", "Plan", "compose_memory", "plan_of"]

Phase = Literal["forward/backward", "optimizer step"]
_WEIGHT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True, kw_only=True)
class MemoryEstimate(MemoryBreakdown):
    """Predicted tensor bytes of one rank at its peak, in :class:`MemoryBreakdown`'s categories.

    A prediction, not a measurement: compare with :attr:`Measurement.memory`. What it predicts
    (:attr:`predicts`) is *allocated* memory: live tensor bytes, what
    ``torch.cuda.max_memory_allocated`` counts. On CUDA what runs out is the caching allocator's
    reserved memory, larger by fragmentation and cache (74.2 vs 80.8 GiB, allenai/OLMo-core#297);
    no fake-tensor pass can know it, so once one real step has run on the device its measured
    reserved/allocated ratio is carried here and :attr:`reserved` is the prediction scaled by it.
    Act on an unverified prediction (prune, skip) only knowing that it may be wrong: measure instead.

    Attributes:
        parameters: Bytes of parameters (per rank: ZeRO-3 partitions them).
        gradients: Bytes of gradients as the runner keeps them at the peak.
        optimizer_state: Bytes of optimizer state (and DeepSpeed's fp32 master copy).
        activations: Bytes saved for backward, and the batch.
        temporaries: Bytes alive only inside an operation or a phase.
        buffers: Bytes of module buffers (BatchNorm's running statistics).
        other: Bytes of anything else (DeepSpeed's flat buffers).
        phase: Where the peak is predicted: ``"forward/backward"`` or ``"optimizer step"``.
        ranks: The data-parallel ranks it assumes.
        verified: The profile behind it was checked against a real step of each kind of
            configuration this one uses, and each agreed within 5%.
        verification: The deciding check (:func:`autotune.memory.check.covering`); None if the
            profile was not checked.
        reserved_ratio: The measured reserved/allocated ratio on the device (CUDA), see
            :meth:`with_reserved_ratio`; None before a real step.
        worst_case: The batch the profile behind it ran at, e.g. ``"worst case: scanned 8
            batches (the whole epoch), longest at batch 6"`` (:mod:`autotune.worst_case`).

    Example:
        >>> from autotune import TrainConfig, load_workload, predict_memory
        >>> estimate = predict_memory(load_workload("mlp-digits"), TrainConfig(micro_batch_size=32))
        >>> estimate.total == estimate.breakdown().total, estimate.fits(estimate.total)
        (True, True)
        >>> estimate.to_dict()["parameters"]
        2192424
    """

    phase: Phase
    ranks: int
    verified: bool = False
    verification: Verification | None = None
    reserved_ratio: float | None = None
    worst_case: str = ""

    def __post_init__(self) -> None:
        for f in _CATEGORIES:
            value = getattr(self, f)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"MemoryEstimate.{f} must be an int >= 0, but got {value!r}.")
        if not isinstance(self.ranks, int) or self.ranks < 1:
            raise ConfigError(f"MemoryEstimate.ranks must be an int >= 1, but got {self.ranks!r}.")
        ratio = self.reserved_ratio
        if ratio is not None and (
            not isinstance(ratio, (int, float)) or isinstance(ratio, bool) or not math.isfinite(ratio) or ratio < 1.0
        ):
            # Every allocated block lives in a reserved segment: reserved >= allocated.
            raise ConfigError(f"MemoryEstimate.reserved_ratio must be a finite number >= 1 or None, but got {ratio!r}.")

    @property
    def predicts(self) -> Literal["allocated"]:
        """Which of the CUDA allocator's two figures :attr:`total` stands for: allocated bytes."""
        return "allocated"

    @property
    def reserved(self) -> int | None:
        """Predicted reserved bytes: :attr:`total` x ``reserved_ratio`` rounded up; None without a ratio."""
        return None if self.reserved_ratio is None else reserved_of(self.total, self.reserved_ratio)

    def with_reserved_ratio(self, ratio: float | None) -> MemoryEstimate:
        """This prediction carrying a reserved/allocated ratio measured on the device (None: none known)."""
        return dataclasses.replace(self, reserved_ratio=ratio)

    def fits(self, budget: int) -> bool:
        """Whether the predicted peak (:attr:`total`) is within ``budget`` bytes."""
        return self.total <= budget

    def breakdown(self) -> MemoryBreakdown:
        """The prediction in :class:`~autotune.MemoryBreakdown`'s categories, as a measurement reports them."""
        return MemoryBreakdown(**{f: getattr(self, f) for f in _CATEGORIES})

    def to_dict(self) -> dict[str, Any]:
        """Every figure as plain JSON values, with the verification that covers it."""
        values = {f: getattr(self, f) for f in (*_CATEGORIES, "phase", "ranks")}
        verification = None if self.verification is None else self.verification.to_dict()
        return values | {
            "total": self.total,
            "predicts": self.predicts,
            "reserved_ratio": self.reserved_ratio,
            "reserved": self.reserved,
            "verified": self.verified,
            "verification": verification,
            "worst_case": self.worst_case,
        }

    def to_json(self) -> str:
        """:meth:`to_dict` as indented JSON text."""
        return json.dumps(self.to_dict(), indent=2)


_CATEGORIES = MEMORY_CATEGORIES


class Plan(NamedTuple):
    """How a config runs: which runner, at which weight precision, each block in which profile mode."""

    runner: Literal["local", "deepspeed"]
    stage: int
    ranks: int
    weights: Literal["fp32", "bf16", "fp16"]
    # The profile mode whose runs give the batch and the gradients: an fp32 block's (under the
    # outer precision), or the blocks' own where none is fp32 (fp32 weights either way), or a
    # 16-bit engine's.
    base_mode: str
    block_modes: tuple[str, ...]
    recompute: tuple[RecomputeLevel, ...]

    @property
    def modes(self) -> tuple[str, ...]:
        """Profile modes the prediction needs."""
        return tuple(dict.fromkeys((self.base_mode, *self.block_modes)))


def plan_of(config: TrainConfig, *, num_blocks: int, device_type: str = "cpu") -> Plan:
    """The runner ``autotune.measure`` would use for ``config``, and each block's profile mode."""
    checkpoints = config.checkpoint_levels(num_blocks)
    # fp32 weights (the local runner, a DeepSpeed fp32 engine): each block in its autocast mode, an
    # island under an fp32 outer precision, an exception under a reduced one.
    outer, precisions = config.outer_precision, config.block_precisions(num_blocks)
    modes = tuple(outer_mode(p, outer) for p in precisions)
    base = outer_mode("fp32" if "fp32" in precisions or outer == "fp32" else outer, outer)
    if not config.on_deepspeed:  # the local runner: fp32 weights, autocast islands
        return Plan("local", 0, 1, "fp32", base, modes, checkpoints)
    weights = engine_precision(config, num_blocks=num_blocks, device_type=device_type)
    if weights == "fp32":
        return Plan("deepspeed", config.zero_stage, config.ranks, "fp32", base, modes, checkpoints)
    mode = f"{weights}-weights"
    return Plan("deepspeed", config.zero_stage, config.ranks, weights, mode, (mode,) * num_blocks, checkpoints)


def compose_memory(
    workload: Workload,
    config: TrainConfig,
    profile: MemoryProfile,
    *,
    device_type: str = "cpu",
    plan: Plan | None = None,
) -> MemoryEstimate:
    """``config``'s predicted peak per rank, composed from ``profile`` (with at least
    ``plan_of(...).modes``), unverified: :func:`autotune.memory.predict.predict_memory` attaches
    the check that covers it (:func:`autotune.memory.check.covering`) and profiles when no profile
    is given. ``plan``: ``config``'s :func:`plan_of` where the caller has it (the workload's blocks
    are found by walking its module tree: a memory table's 2,400 predictions walked GPT-2 small's
    twice each).
    """
    if plan is None:
        plan = plan_of(config, num_blocks=len(workload.block_names()), device_type=device_type)
    missing = [m for m in plan.modes if m not in profile.modes]
    if missing:
        raise ConfigError(f"predict_memory: the profile lacks mode {missing[0]!r}; profile with modes={plan.modes}.")
    for mode, level in dict.fromkeys(zip(plan.block_modes, plan.recompute, strict=True)):
        if profile.modes[mode].recomputed(level) is None:
            name, flag = ("checkpointed", "checkpointed") if level == "full" else ("selective", "selective")
            raise ConfigError(f"predict_memory: the profile has no {name} runs; profile with {flag}=True.")
    return dataclasses.replace(_Predictor(workload, config, plan, profile).peak(), worst_case=profile.worst_case)


class _Stretch(NamedTuple):
    """One window at the config's micro-batch: its highest moment by each of :class:`Window`'s measures."""

    peak: Moment
    kept: Moment
    reducing: Moment


class _Predictor:
    def __init__(self, workload: Workload, config: TrainConfig, plan: Plan, profile: MemoryProfile) -> None:
        self.config, self.plan, self.profile = config, plan, profile
        self.psi = profile.num_parameters
        # Frozen parameters (requires_grad=False) get no gradient and no optimizer state, and
        # DeepSpeed leaves them out of its flat groups (it flattens the trainable ones only).
        self.trainable = profile.trainable_parameters
        self.frozen = self.psi - self.trainable
        self.q = math.ceil(self.trainable / plan.ranks)  # elements of one rank's ZeRO partition
        self.s = _WEIGHT_BYTES[plan.weights]  # bytes per parameter (and gradient) in the model
        self.bucket = bucket_elements(profile.largest_parameter)
        self.base = profile.modes[plan.base_mode]
        self.buffers = _buffer_bytes(workload, plan.weights)
        # Every candidate moment of a prediction (~100) adds the same model states: summed once.
        self._states = self.states()
        self._held = self.buffers + sum(max(0, int(v)) for v in self._states.values())

    # ---- model states (between steps) ------------------------------------------------------------

    def states(self) -> dict[str, int]:
        """Parameters, gradients, optimizer state and DeepSpeed buffers held between steps."""
        p, psi, q, s = self.profile, self.psi, self.q, self.s
        master = 4 * q + round(p.flat_state_ratio * q)  # fp32 master partition + optimizer state on it
        if self.plan.runner == "local" or (self.plan.stage == 0 and s == 4):
            # A local run holds the parameters as the model does (fp32, or loaded in bf16).
            parameters = p.parameter_bytes if self.plan.runner == "local" else 4 * psi
            return {"parameters": parameters, "gradients": 0, "optimizer_state": p.optimizer_state_bytes, "other": 0}
        if self.plan.stage == 0:  # 16-bit engine, no ZeRO: fp32 master copy of every trainable parameter
            return {
                "parameters": s * psi,
                "gradients": 0,
                "optimizer_state": 4 * self.trainable + p.optimizer_state_bytes,
                "other": 0,
            }
        if self.plan.stage < 3:
            # ZeRO 1-2 pad their flat parameter group to a multiple of 2 x ranks elements
            # (DeepSpeed's nccl_start_alignment_factor); each rank's partition is 1/N of that.
            q12 = self._padded_partition()
            master = 4 * q12 + round(p.flat_state_ratio * q12)
            parameters = s * (q12 * self.plan.ranks + self.frozen)  # frozen ones stay whole in the module
            return {"parameters": parameters, "gradients": 0, "optimizer_state": master, "other": 0}
        # ZeRO-3 partitions every parameter, frozen ones too, and also keeps its gradient
        # partition and one reduce bucket between steps.
        parameters = s * math.ceil(psi / self.plan.ranks)
        return {"parameters": parameters, "gradients": s * q, "optimizer_state": master, "other": s * self.bucket}

    def _padded_partition(self) -> int:
        """ZeRO 1-2's partition: the flat group of trainable parameters padded to a multiple of
        2 x ranks elements (DeepSpeed's nccl_start_alignment_factor), split in N."""
        align = 2 * self.plan.ranks
        return math.ceil(self.trainable / align) * align // self.plan.ranks

    # ---- the two phases ----------------------------------------------------------------------------

    def peak(self) -> MemoryEstimate:
        fb, opt = self.forward_backward(), self.optimizer_step()
        return fb if fb.total >= opt.total else opt

    def _estimate(self, phase: Phase, **extra: int) -> MemoryEstimate:
        values = dict.fromkeys(_CATEGORIES, 0) | {"buffers": self.buffers}
        for key, value in [*self._states.items(), *extra.items()]:
            values[key] += max(0, int(value))
        counted: dict[str, Any] = values  # byte counts only: verified/verification are set by predict_memory
        return MemoryEstimate(**counted, phase=phase, ranks=self.plan.ranks)

    def _highest(self, phase: Phase, candidates: list[dict[str, int]]) -> MemoryEstimate:
        """The estimate of the first candidate with the highest total (what ``max`` over their
        estimates gives), built for that one only: its total is the held states plus its own bytes."""
        totals = [self._held + sum(max(0, int(v)) for v in extra.values()) for extra in candidates]
        highest = max(totals)
        estimate = self._estimate(phase, **candidates[totals.index(highest)])
        assert estimate.total == highest, "a candidate's total is MemoryEstimate.total of its estimate"
        return estimate

    def optimizer_step(self) -> MemoryEstimate:
        p, plan = self.profile, self.plan
        if plan.runner == "local":
            # Full gradients (of the trainable parameters), plus what the optimizer allocates
            # (torch's for-loop AdamW: per tensor); the training loop still holds the last micro-batch.
            batch = _lin(self.base.batch, p.micro_batch_sizes, self.config.micro_batch_size)
            return self._estimate(
                "optimizer step", gradients=p.trainable_bytes, temporaries=p.optimizer_step_bytes, activations=batch
            )
        if plan.stage == 0 and self.s == 4:
            return self._estimate("optimizer step", gradients=4 * self.trainable, temporaries=p.optimizer_step_bytes)
        if plan.stage == 0:
            # DeepSpeed's 16-bit optimizer wrapper makes an fp32 copy of every gradient for the master.
            gradients = (self.s + 4) * self.trainable
            return self._estimate("optimizer step", gradients=gradients, temporaries=p.optimizer_step_bytes)
        # Stages 1-3: the fp32 gradient partition of the master weights, and the optimizer's
        # temporaries on the flat partition (for-loop AdamW: ~2 partition-sized tensors).
        q = self.q if plan.stage == 3 else self._padded_partition()
        return self._estimate("optimizer step", gradients=4 * q, temporaries=round(p.flat_step_ratio * 4 * q))

    def forward_backward(self) -> MemoryEstimate:
        plan, s, g = self.plan, self.s, self.base.gradients
        k = self.config.grad_accum_steps
        windows = self._windows(self.config.micro_batch_size)
        candidates: list[dict[str, int]] = []
        if plan.runner == "local" or plan.stage <= 1:
            # Gradients stay in .grad; from the second micro-batch on they are all there already.
            for x in (x for window in windows for x in window):
                grads = g if k > 1 else x.gradients
                candidates.append({"activations": x.activations, "temporaries": x.temporaries, "gradients": grads})
            temporaries, gradients = self._end_of_backward()
            end = windows[-1].kept
            candidates.append({"activations": end.activations, "temporaries": temporaries, "gradients": g + gradients})
        else:
            # ZeRO 2-3: each gradient is reduced into a bucket as it is produced and leaves .grad.
            gathered = s * self.bucket if plan.stage == 3 else 0  # the module being computed, gathered
            # Stage 2 reduces into a partition of the gradients (in the model's precision: its
            # gradient accumulation dtype); with accumulation, the one of the earlier micro-batches
            # stays while the next is being reduced (measured).
            partition = s * self._padded_partition() if plan.stage == 2 else 0
            moments = [(w.peak, w.peak.gradients >= s * self.bucket) for w in windows]
            moments += [(w.reducing, True) for w in windows]
            for x, reducing in moments:  # reducing: the first bucket has filled
                held = partition * ((reducing or k > 1) + (reducing and k > 1))
                # Gradients waiting for their bucket, and (stage 2, contiguous_gradients) the
                # bucket they are copied into for the reduction.
                flight = s * self.bucket * (1 + (plan.stage == 2)) if reducing else 0
                candidates.append(
                    {
                        "activations": x.activations,
                        "temporaries": x.temporaries,
                        "gradients": held + flight,
                        "parameters": gathered,
                    }
                )
        return self._highest("forward/backward", candidates)

    def _end_of_backward(self) -> tuple[int, int]:
        """(temporaries, gradients) DeepSpeed adds once the gradients are complete."""
        plan, s = self.plan, self.s
        if plan.runner == "local":
            return 0, 0
        if plan.stage == 0:  # all gradients flattened into one all-reduce buffer (up to 5e8 elements)
            return s * min(self.trainable, DEFAULT_BUCKET), 0
        # stage 1: the reduction into the fp32 gradient partition, bucket by bucket
        return s * self.bucket, 4 * self.q

    def _windows(self, m: int) -> list[_Stretch]:
        """Forward and backward, stretch by stretch (see ``Windows``), at micro-batch ``m`` with
        this config's blocks.

        Each block's stretches (and the head's, the embedding's: their neighbours') come from the
        profile run that ran that block as the config says: in its precision, plain or
        checkpointed (all blocks are, in that run: each is recomputed in its stretch, one at a
        time, Chen et al. 2016). Only what the blocks before it keep differs between that run
        and the config, by the same bytes all through the stretch: the stretch is shifted by the
        difference (:class:`_Kept`). A stretch is its highest moments at the profiled sizes, as lines
        in the micro-batch size (see :class:`Window`); which of them is highest depends on ``m``.
        """
        sizes, plan, n = self.profile.micro_batch_sizes, self.plan, len(self.plan.recompute)
        saves = {mode: _saves_at(self.profile.modes[mode].blocks, sizes, m) for mode in plan.modes}
        config = tuple(zip(plan.block_modes, plan.recompute, strict=True))
        batch = _lin(self.base.batch, sizes, m)
        kept: dict[tuple[tuple[tuple[str, RecomputeLevel], ...], str], _Kept] = {}

        def keeps(blocks: tuple[tuple[str, RecomputeLevel], ...], mode: str) -> _Kept:
            if (blocks, mode) not in kept:
                kept[blocks, mode] = _Kept.of(saves, blocks, mode)
            return kept[blocks, mode]

        out: list[_Stretch] = []
        for w in range(3 * n + 2):
            owners, inputs, like, freed = _waiting(w, n)
            mode, ckpt = config[like]  # whose run to read
            series = self.profile.modes[mode].recomputed(ckpt)
            assert series is not None, "compose_memory checks the recomputed runs"
            uniform = ((mode, ckpt),) * n
            shift = batch + keeps(config, mode).bytes(owners, inputs, freed)
            shift -= keeps(uniform, mode).bytes(owners, inputs, freed)
            moments = [_at(series, w, part, sizes, m) for part in range(3)]
            out.append(_Stretch(*(x._replace(activations=max(0, x.activations + shift)) for x in moments)))
        return out


def _saves_at(blocks: tuple[BlockSaves, BlockSaves], sizes: tuple[int, int], m: int) -> BlockSaves:
    """Each field of each block linear in the micro-batch size through the two profiled points."""
    fields = (tuple(_lin((a, b), sizes, m) for a, b in zip(x, y, strict=True)) for x, y in zip(*blocks, strict=True))
    return type(blocks[0])(*fields)


def _waiting(w: int, n: int) -> tuple[int, int, int, bool]:
    """For window ``w`` (see ``Windows``): how many blocks hold what they saved, how many block
    inputs may be held, which block's run to read, and whether the last of those inputs is freed
    by the block that took it.

    In block i's forward, blocks before it are done and its input is alive whoever keeps it (its
    forward still uses it): i, i, i. In the head: n, n, n - 1. In block i's backward, its input
    stays only if someone keeps it, and from the moment it is freed in the profile run, only if
    someone else does: i, i + 1, i. After block 0: nothing, read from block 0's run.
    """
    if w < n:
        return w, w, w, False
    if w == n:
        return n, n, n - 1, False
    if w <= 3 * n:
        i = n - 1 - (w - n - 1) // 2
        return i, i + 1, i, (w - n - 1) % 2 == 1
    return 0, 0, 0, False


class _Kept(NamedTuple):
    """What blocks keep, as running sums over the blocks (each window asks for a prefix: summing
    them window by window was quadratic in the blocks, most of a memory table's time at 24 blocks):
    ``own[k]`` the bytes blocks ``0 .. k - 1`` keep of what they saved, ``shared[k]`` the inputs
    of blocks ``0 .. k - 1`` that are kept, ``freed[j]`` what block j's input counts for less once
    the block that took it has freed its own hold (see :func:`_kept_terms`)."""

    own: tuple[int, ...]
    shared: tuple[int, ...]
    freed: tuple[int, ...]

    @classmethod
    def of(cls, saves: dict[str, BlockSaves], blocks: tuple[tuple[str, RecomputeLevel], ...], mode: str) -> _Kept:
        own, held, let_go = _kept_terms(saves, blocks, mode)
        return cls(
            own=tuple(itertools.accumulate(own, initial=0)),
            shared=tuple(itertools.accumulate(held, initial=0)),
            freed=tuple(a - b for a, b in zip(held, let_go, strict=True)),
        )

    def bytes(self, owners: int, inputs: int, freed: bool) -> int:
        """Bytes blocks ``0 .. owners - 1`` keep of what they saved, and the inputs of blocks
        ``0 .. inputs - 1`` that are kept; ``freed``: block ``inputs - 1`` no longer keeps its own."""
        return self.own[owners] + self.shared[inputs] - (self.freed[inputs - 1] if freed and inputs else 0)


def _kept_terms(
    saves: dict[str, BlockSaves], blocks: tuple[tuple[str, RecomputeLevel], ...], mode: str
) -> tuple[list[int], list[int], list[int]]:
    """Per block j, each in its (mode, recompute level): the bytes it keeps of what it saved; its
    input's bytes that are kept; and the same once the block that took the input has freed its
    own hold on it (summed by :class:`_Kept`).

    A block's input is one fp32 storage (a bf16 island casts its output back), kept if the block
    before it saves it (its last ReLU; recomputed selectively, its last matmul), if the block
    saves it (an fp32 LayerNorm or convolution; a bf16 one saves its own cast instead), if it is
    recomputed (checkpoint keeps the input), or if code outside the blocks saves it (the stem,
    ``external``: read from ``mode``'s run, alike in every island mode). Counted once: adding each
    block's saved bytes would count it twice when both neighbours save it. The rest of what a
    block saves is its own: nothing checkpointed, its matmul-like outputs selective.
    """
    n = len(blocks)
    external = saves[mode].external

    def own(j: int) -> int:
        block_mode, level = blocks[j]
        s = saves[block_mode]
        last = j + 1 == n  # the last block's output is the head's input
        if level == "full":
            return 0
        if level == "selective":
            return max(0, s.selective[j] - (0 if last else s.selective_outputs[j]))
        return max(0, s.saved[j] - s.saved_inputs[j] - (0 if last else s.outputs[j]))

    def handed(j: int) -> int:  # what block j keeps of block j + 1's input
        block_mode, level = blocks[j]
        s = saves[block_mode]
        return {"none": s.outputs, "selective": s.selective_outputs}[level][j] if level != "full" else 0

    def shared(j: int, freed: bool) -> int:  # block j's input
        block_mode, level = blocks[j]
        by_previous = handed(j - 1) if j > 0 else 0
        by_itself = saves[block_mode].inputs[j] if level != "none" else saves[block_mode].saved_inputs[j]
        return max(external[j], by_previous, 0 if freed else by_itself)

    return [own(j) for j in range(n)], [shared(j, False) for j in range(n)], [shared(j, True) for j in range(n)]


def _lin(values: tuple[int, int], sizes: tuple[int, int], m: int) -> int:
    """Linear in the micro-batch size through the two profiled points."""
    (v0, v1), (m0, m1) = values, sizes
    return max(0, round(v0 + (v1 - v0) * (m - m0) / (m1 - m0)))


def _at(windows: Windows, w: int, part: int, sizes: tuple[int, int], m: int) -> Moment:
    """Moment ``part`` (see :class:`Window`) of window ``w`` at micro-batch ``m``: of the window's
    candidates, each category linear in ``m``, the highest by that part's measure."""
    from autotune.memory.profile_record import Moment

    xs, ys = windows[0][w][part], windows[1][w][part]
    if len(xs) != len(ys):
        # Unpaired windows (the sizes cut the run in other places: each keeps its own maximum, one
        # moment or none): a size without a moment in this window takes the other's (PEFT's DoRA
        # under selective recompute left a window empty at one size and the prediction raised).
        assert not xs or not ys, (len(xs), len(ys))
        xs, ys = xs or ys, ys or xs
    candidates = [
        Moment(*(_lin((a, b), sizes, m) for a, b in zip(x, y, strict=True))) for x, y in zip(xs, ys, strict=True)
    ]
    if not candidates:
        return Moment(0, 0, 0)
    if part == 1:  # kept: gradients count
        return max(candidates, key=lambda x: x.activations + x.temporaries + x.gradients)
    return max(candidates, key=lambda x: (x.activations + x.temporaries, -x.gradients))


def _buffer_bytes(workload: Workload, weights: str) -> int:
    """Module buffers; a 16-bit DeepSpeed engine casts the float ones (deepspeed_config's buffer_dtype)."""
    total = 0
    for b in workload.model.buffers():
        size = _WEIGHT_BYTES[weights] if b.is_floating_point() else b.element_size()
        total += b.numel() * size
    return total
