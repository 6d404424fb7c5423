"""Real values for the tensors of a fake pass that the batch alone determines.

Under ``FakeTensorMode`` a tensor has a shape but no values, so an operation whose output shape
depends on values cannot run: ``labels[labels != -100]`` (``aten.nonzero``: how many tokens are
trained on), ``int(lengths.max())`` (``aten._local_scalar_dense``). Loss functions and models
compute such things from the batch: a prompt masked out of the loss, a classification head that
keeps the labelled rows (DeBERTa's ``(labels >= 0).nonzero()``), sequence lengths. The fake pass
then raised, and the whole memory model was lost for the workload.

But the batch is real before the pass fakes it. :class:`RealValues` is a dispatch mode to enter
*inside* ``FakeTensorMode`` that keeps, beside each fake tensor the batch alone determines, its
real value (its *twin*): the batch's own tensors, and the output of every operation whose tensor
inputs all have twins (a comparison with the labels, an ``arange``, a cast), computed for real on
the twins. An operation that needs values is answered from its inputs' twins: its real result, as
a fake tensor of that shape (or the real scalar), so the pass goes on as the real step does. A
tensor that depends on a parameter has no twin (its values are not known without the compute the
fake pass avoids), and an operation on it that needs values still raises, as before; so does a
random draw (LayerDrop's ``torch.rand([]) < p``): its twin would be one step's draw. A real tensor
inside the pass (a constant the model builds from NumPy values) is its own twin. (LayerDrop itself
never reaches the pass: every copy autotune runs has it off, :mod:`autotune.layer_drop`.) CTC's loss
allocates a table as long as the longest target: answered from the target lengths' twin.

Cost: the real compute of the batch-derived operations (integer and boolean work on the batch's
shapes: comparisons, index arithmetic), bounded by :data:`MAX_TWIN_ELEMENTS` per output; a larger
output, or one of an operation with no tensor input (``arange``, ``full``) larger than
:data:`MAX_FACTORY_ELEMENTS`, gets no twin.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
from torch.utils.weak import WeakTensorKeyDictionary

__all__ = ["MAX_FACTORY_ELEMENTS", "MAX_TWIN_ELEMENTS", "RealValues", "batch_pairs", "is_fake"]

#: The most elements an operation's output may have to get a real twin: batch-derived work is
#: index-sized (a sequence's tokens), never activation-sized.
MAX_TWIN_ELEMENTS = 2**24

#: The most elements an operation with no tensor input (``arange``, ``full``, ``zeros``) may
#: create with a twin: position ids and small index tensors, not the buffers a model allocates.
MAX_FACTORY_ELEMENTS = 2**16


def _aten(name: str, overload: str = "default") -> Any:
    """``torch.ops.aten.<name>.<overload>``, or None where this torch has no such operation."""
    return getattr(getattr(torch.ops.aten, name, None), overload, None)


#: Indexing by a tensor (``x[mask]``): with a boolean index that has a twin, answered by the
#: index's real positions (``mask.nonzero()``) whatever the indexed tensor is. Its backward
#: (``index_put`` on a tensor of the input's shape) has a shape without values: the fake runs it.
_INDEX = _aten("index", "Tensor")

#: Operations a fake tensor cannot answer, whose output shape or value depends on the values.
_DATA_DEPENDENT = frozenset(
    op
    for op in (
        _aten("nonzero"),
        _aten("_local_scalar_dense"),
        _aten("masked_select"),
        _aten("unique_consecutive"),
        _aten("bincount"),
        _aten("_unique2"),
        _aten("repeat_interleave", "Tensor"),
        _INDEX,
    )
    if op is not None
)


#: CTC's loss (``nn.functional.ctc_loss``, Hugging Face's speech heads): its alpha table is as
#: long as the longest target, a value. Answered from the target lengths' twin
#: (:meth:`RealValues._ctc_loss`); its backward has a shape without values.
_CTC_LOSS = frozenset(op for op in (_aten("_ctc_loss", "Tensor"), _aten("_ctc_loss")) if op is not None)


class RealValues(TorchDispatchMode):
    """Under ``FakeTensorMode``: keep the real values of the batch-derived tensors, and answer
    from them the operations that need values.

    Args:
        pairs: (fake tensor, real tensor) of the batch: the fake batch and the real batch it was
            made from, leaf by leaf (:func:`batch_pairs`).
    """

    def __init__(self, pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().__init__()
        # Keyed by identity (a tensor's == is elementwise), dropped with the fake tensor.
        self.twins: Any = WeakTensorKeyDictionary()
        with unset_fake_temporarily():  # made inside the fake mode: the twins are real
            for f, r in pairs:
                # The pass may cast the batch (a 16-bit engine's floats): the twin in the fake's dtype.
                self.twins[f] = r if r.dtype == f.dtype else r.to(f.dtype)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        first = args[0] if args else None
        if func in _CTC_LOSS:
            return self._ctc_loss(func, args, kwargs)
        if func is not _INDEX and is_fake(first) and first not in self.twins:
            # Most operations of a pass: an activation or a parameter first, which has no twin.
            return func(*args, **kwargs)
        flat, spec = tree_flatten((args, kwargs))
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        known = all(self._has_twin(t) for t in tensors) and not _random(func)
        if func is _INDEX and not known:
            args = self._positional_indices(args)
        if func in _DATA_DEPENDENT and tensors and known:
            real = self._real(func, flat, spec)
            return tree_map(lambda r: self._fake_of(r) if isinstance(r, torch.Tensor) else r, real)
        out = func(*args, **kwargs)
        if known and self._small(out, factory=not tensors):
            try:
                real = self._real(func, flat, spec)
            except Exception:  # a real kernel refusing what its fake one took: no twin, as before
                real = None
            if real is not None:
                self._pair(out, real)
                return out
        self._forget_mutated(func, flat)
        return out

    def _ctc_loss(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """CTC's negative log-likelihood per sample and its alpha table, ``(batch,)`` and
        ``(batch, frames, 2 * longest target + 1)`` in the log-probabilities' dtype, as PyTorch's
        native kernels allocate them (CPU and CUDA alike; Hugging Face turns cuDNN's off for it),
        the longest target read from the target lengths (a list, or a tensor with a twin). Without
        them the fake kernel raises as before (a dynamic output shape)."""
        log_probs, lengths = args[0], args[3] if len(args) > 3 else kwargs["target_lengths"]
        if isinstance(lengths, torch.Tensor):
            if not self._has_twin(lengths):
                return func(*args, **kwargs)
            with unset_fake_temporarily():
                lengths = self._twin(lengths).tolist()
        longest = max((int(n) for n in lengths), default=0)
        frames, batch = log_probs.shape[0], log_probs.shape[1]
        like = {"dtype": log_probs.dtype, "device": log_probs.device}
        return torch.empty((batch,), **like), torch.empty((batch, frames, 2 * longest + 1), **like)

    def _positional_indices(self, args: tuple[Any, ...]) -> tuple[Any, ...]:
        """``args`` of an indexing operation (tensor, indices, ...) with each boolean index that
        has a twin replaced by the long indices of its true positions, one per dimension it
        spans (what indexing by a mask means), as fake tensors with their twins."""
        indices = args[1]
        if not isinstance(indices, (list, tuple)):
            return args
        spread: list[Any] = []
        for index in indices:
            if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8) and self._has_twin(index):
                with unset_fake_temporarily():
                    positions = self._twin(index).bool().nonzero().unbind(1)
                spread.extend(self._fake_of(p) for p in positions)
            else:
                spread.append(index)
        return (args[0], spread, *args[2:])

    def _real(self, func: Any, flat: list[Any], spec: Any) -> Any:
        real_flat = [self._twin(a) if isinstance(a, torch.Tensor) else a for a in flat]
        real_args, real_kwargs = tree_unflatten(real_flat, spec)
        with unset_fake_temporarily(), torch.no_grad():
            return func(*real_args, **real_kwargs)

    def _has_twin(self, t: torch.Tensor) -> bool:
        return t in self.twins or not is_fake(t)

    def _twin(self, t: torch.Tensor) -> torch.Tensor:
        """The real value of ``t``: its twin, or ``t`` itself when it is real (a constant the
        model made from Python or NumPy values)."""
        twin: torch.Tensor = self.twins.get(t, t)
        return twin

    def _fake_of(self, real: torch.Tensor) -> torch.Tensor:
        """A fake tensor of ``real``'s shape and dtype, made in the pass (so every tracker above
        sees it allocated), with ``real`` as its twin."""
        out = torch.empty_strided(real.shape, real.stride(), dtype=real.dtype, device=real.device)
        self.twins[out] = real
        return out

    def _pair(self, out: Any, real: Any) -> None:
        outs, _ = tree_flatten(out)
        reals, _ = tree_flatten(real)
        if len(outs) != len(reals):
            return
        for o, r in zip(outs, reals, strict=True):
            if isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) and o.shape == r.shape:
                self.twins[o] = r

    def _forget_mutated(self, func: Any, flat: list[Any]) -> None:
        """An in-place operation whose twin was not computed leaves its input's twin stale."""
        schema = getattr(func, "_schema", None)
        if schema is None or not schema.is_mutable:
            return
        for a in flat:
            if isinstance(a, torch.Tensor):
                self.twins.pop(a, None)

    @staticmethod
    def _small(out: Any, *, factory: bool) -> bool:
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        limit = MAX_FACTORY_ELEMENTS if factory else MAX_TWIN_ELEMENTS
        return bool(outs) and all(t.numel() <= limit for t in outs)


def batch_pairs(fake_batch: Any, real_batch: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(fake, real) for each tensor leaf of a batch and the real batch it was faked from."""
    fakes, _ = tree_flatten(fake_batch)
    reals, _ = tree_flatten(real_batch)
    if len(fakes) != len(reals):
        return []
    return [
        (f, r) for f, r in zip(fakes, reals, strict=True) if isinstance(f, torch.Tensor) and isinstance(r, torch.Tensor)
    ]


def is_fake(t: object) -> bool:
    """Whether ``t`` is a fake tensor (shapes only: a fake run's), not a real one or another value."""
    return isinstance(t, FakeTensor)


def _random(func: Any) -> bool:
    """Whether ``func`` draws random numbers (``rand``, ``bernoulli``, dropout): its twin would be
    one draw, and a branch on it (LayerDrop skipping a layer) one step's, not the profile's."""
    return torch.Tag.nondeterministic_seeded in getattr(func, "tags", ())
