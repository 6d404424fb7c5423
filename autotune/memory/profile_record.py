"""The memory profile's records: what :mod:`autotune.memory.model` composes a config's memory from.

:func:`autotune.memory.profile.fake_profile` fills them, once per workload, from fake-tensor runs
of every block alike per *mode* (:data:`MODES`). A config that mixes modes is never run; it is
composed from these uniform runs, so the profile records what composing needs:

* per block, what it keeps for backward, split at its boundaries (:class:`BlockSaves`): a
  block's input is one storage that the block before it, the block itself, both or neither may
  save, depending on *their* modes. A bf16 island casts its output back to fp32, so the input of
  every block is fp32 whatever the modes: only who keeps it changes. Under a reduced outer
  precision nothing is cast back, so a block's input is in whatever dtype the block before it
  hands on (fp32 after a residual sum with an fp32 stream, 16 bits after a bare matmul): the
  composition of mixed blocks there holds where the dtypes agree, which the ``outer-*`` check
  (:mod:`autotune.memory.check`) verifies on one real step;
* the (activations, temporaries, gradients) series, cut into windows of forward and backward
  (:class:`Window`) at the blocks' boundaries, as lines in the micro-batch size: an operation's
  bytes at the two sizes, matched by position in the series (the two runs execute the same
  operations).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from autotune.config import Precision, RecomputeLevel

if TYPE_CHECKING:
    from autotune.memory.check import Verification
    from autotune.memory.structure import BlockStructure

__all__ = [
    "BlockSaves",
    "MODES",
    "MemoryProfile",
    "ModeProfile",
    "Moment",
    "Window",
    "Windows",
    "mode_precisions",
    "outer_mode",
]

#: How the blocks of a model can run: fp32 weights with each block fp32 or autocast (an island,
#: as apply.py makes it), 16-bit weights throughout (a DeepSpeed bf16/fp16 engine), or fp32
#: weights under a reduced outer precision (``BLOCK@OUTER``: the forward and the loss under
#: autocast in OUTER, each block fp32 with autocast disabled or in OUTER itself: ``bf16@bf16``
#: everywhere is Hugging Face's ``bf16=True``).
MODES: tuple[str, ...] = (
    "fp32",
    "bf16",
    "fp16",
    "bf16-weights",
    "fp16-weights",
    "fp32@bf16",
    "bf16@bf16",
    "fp32@fp16",
    "fp16@fp16",
)


def outer_mode(block: Precision, outer: Precision) -> str:
    """The profile mode of a block in ``block`` precision under the ``outer`` precision."""
    return block if outer == "fp32" else f"{block}@{outer}"


def mode_precisions(mode: str) -> tuple[Precision, Precision]:
    """(block precision, outer precision) of an autocast mode (not a weights mode)."""
    block, _, outer = mode.partition("@")
    return block, outer or "fp32"  # type: ignore[return-value]


class Moment(NamedTuple):
    """Tensor bytes at one moment of a forward/backward."""

    activations: int
    temporaries: int
    gradients: int


class Window(NamedTuple):
    """One stretch of a forward/backward, as the moments that can be its maximum, by three measures.

    ``peak``: most activations + temporaries; ``kept``: most activations + temporaries +
    gradients (for runners that keep gradients); ``reducing``: most activations + temporaries
    once a DeepSpeed gradient bucket (the largest parameter's gradient) has filled (ZeRO 2-3 hold
    their reduction buffers from then on). Each is a tuple of candidates, aligned between the
    profile's two micro-batch sizes: the moments that are the maximum at *some* micro-batch size
    (the upper envelope of their lines). Which moment is highest moves with the batch: at a small
    one, gradients and weight copies weigh more than activations.
    """

    peak: tuple[Moment, ...]
    kept: tuple[Moment, ...]
    reducing: tuple[Moment, ...]


class BlockSaves(NamedTuple):
    """Bytes each block keeps for backward in one mode at one micro-batch size (forward order).

    ``saved``: storages the block saves (not parameters or buffers: model state), its input included.
    ``inputs``: its input, all a checkpointed block keeps. ``saved_inputs``: the part of
    ``saved`` that is its input (an fp32 LayerNorm or convolution saves it, a bf16 one saves a
    cast). ``outputs``: the part of ``saved`` that the next block takes as input (a final ReLU
    saves its result). ``external``: the part of its input that code outside this block and the
    one before it saved (the stem's last ReLU): kept whatever the blocks' modes.
    ``selective``: what the block keeps recomputed selectively, besides its input: the outputs of
    its matmul-like operations (:data:`autotune.train.selective.SAVED_OPS`), held by torch's
    selective-checkpoint cache from its forward to its recompute; ``selective_outputs``: the part
    of that the next block takes as input (a block ending in a bare ``nn.Linear``). Both empty
    where the selective runs were not profiled.
    """

    saved: tuple[int, ...]
    inputs: tuple[int, ...]
    saved_inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    external: tuple[int, ...]
    selective: tuple[int, ...] = ()
    selective_outputs: tuple[int, ...] = ()


#: Per micro-batch size: the windows of one run, in time order, with ``n`` blocks: ``[i]`` for
#: ``i < n`` the forward of block ``i`` (block 0's with the stem before it), ``[n]`` the head's
#: forward and backward, ``[3n - 2i - 1]`` and ``[3n - 2i]`` the backward of block ``i`` before and
#: after its input is freed, ``[3n + 1]`` what follows block 0's backward (the embedding's).
Windows = tuple[tuple[Window, ...], tuple[Window, ...]]


@dataclass(frozen=True, kw_only=True)
class ModeProfile:
    """One mode's forward/backward, at the profile's two micro-batch sizes (index 0 and 1).

    ``blocks``: what each block keeps (see :class:`BlockSaves`). ``windows``: the run, window by
    window (see ``Windows``); ``checkpointed``: the same with every block checkpointed,
    i.e. recomputed in its window (``None`` if not profiled); ``selective``: the same with every
    block recomputed selectively (``None`` if not profiled). Gradients stay in ``.grad`` (as in
    the local runner).
    """

    blocks: tuple[BlockSaves, BlockSaves]
    windows: Windows
    checkpointed: Windows | None
    gradients: int
    batch: tuple[int, int]  # bytes of the collated micro-batch (16-bit floats in a weights mode)
    selective: Windows | None = None

    def recomputed(self, level: RecomputeLevel) -> Windows | None:
        """The windows of the run with every block at recompute ``level`` (None if not profiled)."""
        return {"none": self.windows, "full": self.checkpointed, "selective": self.selective}[level]


@dataclass(frozen=True, kw_only=True)
class MemoryProfile:
    """What the memory model needs from a workload, measured once (no real compute: fake tensors).

    Args:
        names: Block names, in forward order.
        micro_batch_sizes: The two micro-batch sizes profiled; activations are linear in between
            and beyond (a constant part, e.g. autocast's weight copies, plus a per-sample part).
        num_parameters, largest_parameter, parameter_tensors: Parameter count, the largest
            parameter's element count (DeepSpeed's bucket size), number of parameter tensors.
        trainable_parameters: Elements of the parameters that require gradients: frozen ones
            (``requires_grad=False``) have no gradient and no optimizer state.
        parameter_bytes, trainable_bytes: Bytes of all the parameters and of the trainable ones,
            in the dtypes the model holds them (a model loaded in bf16 holds 2 per element, and
            trains its gradients in bf16); what a local run keeps of them and of its gradients.
        optimizer_state_bytes: The workload optimizer's state after one step, fp32 parameters.
        optimizer_step_bytes: The most a local optimizer step allocates on top of parameters,
            gradients and state (torch's for-loop AdamW: a few parameter-sized temporaries).
        flat_state_ratio: State bytes per element of one flat fp32 parameter (a ZeRO partition):
            8 for Adam's two moments (plus the step counter's share).
        flat_step_ratio: What a step on that flat parameter allocates, per byte of the parameter.
        modes: One :class:`ModeProfile` per profiled mode (see ``MODES``).
        structure: How the blocks are joined (:func:`autotune.memory.structure.detect_structure`):
            where they are not a chain, configurations that treat blocks differently are unverified.
        checks: The profile's predictions checked against real steps, one per kind of
            configuration (:func:`autotune.memory.check.verify_profile`); empty if not checked.
        worst_case: Which batch the profile ran at: declared, scanned or the first
            (:meth:`autotune.worst_case.WorstCase.describe`).
        device_type: Whose kernels the fake runs saved for (``"cpu"``, ``"cuda"``:
            :mod:`autotune.memory.fake_kernels`): a profile predicts runs on that device type.
    """

    names: tuple[str, ...]
    micro_batch_sizes: tuple[int, int]
    num_parameters: int
    largest_parameter: int
    parameter_tensors: int
    trainable_parameters: int
    parameter_bytes: int
    trainable_bytes: int
    optimizer_state_bytes: int
    optimizer_step_bytes: int
    flat_state_ratio: float
    flat_step_ratio: float
    modes: dict[str, ModeProfile]
    structure: BlockStructure | None = None
    checks: tuple[Verification, ...] = ()
    worst_case: str = ""
    device_type: str = "cpu"

    @property
    def verification(self) -> Verification | None:
        """The check of the default configuration (fp32, nothing recomputed), or None."""
        return next((v for v in self.checks if v.kind == "default"), None)
