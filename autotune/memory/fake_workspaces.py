"""Real sizes for the outputs that fake-tensor (meta) kernels get wrong.

A meta kernel computes an operation's output shapes without running it, and for most operations
those are the real shapes. A few fused kernels return a buffer whose size only the backend library
knows: on CPU, ``nn.LSTM`` runs ``aten.mkldnn_rnn_layer`` (oneDNN), whose fourth output is the
*workspace*, every time step's gates and states, saved for backward. Its meta kernel (torch
2.13, ``torch/_meta_registrations.py``) returns an empty workspace, where oneDNN's is several times
the layer's output, rounded up to 4 KiB pages and not linear in any one dimension. A fake-tensor
profile of an LSTM therefore misses most of its activations.

:class:`RealWorkspaces` is a dispatch mode to enter *inside* ``FakeTensorMode``: for the listed
operations it asks the real kernel, once per distinct argument shapes, how large the buffer is,
and swaps the fake output for a fake tensor of that size, so every tracker above it (MemTracker,
saved-tensor hooks) sees what a real run holds.

One meta kernel refuses what the real one runs: ``aten._grouped_mm`` (the experts of Mixtral,
Qwen-MoE, OLMoE, gpt-oss and the other mixtures of experts in transformers, which call it in the
weights' dtype) checks for bf16 operands (torch 2.13's meta kernel copies the checks of the CUDA
kernel), where the CPU kernel runs fp32. :class:`RealWorkspaces` answers it with the output shape
that meta kernel gives, in the operands' dtype: the profile of a mixture of experts in fp32 runs,
instead of failing on a check the real CPU run does not make.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["RealWorkspaces"]

#: Operations whose meta kernel under-sizes an output: overload -> index of that output.
_UNDERSIZED: dict[Any, int] = {torch.ops.aten.mkldnn_rnn_layer.default: 3}

#: Operations whose meta kernel refuses operands other than bf16 that the real kernels take.
_BF16_ONLY_META: frozenset[Any] = frozenset(
    op.default for op in (getattr(torch.ops.aten, "_grouped_mm", None),) if op is not None
)

#: (operation, argument shapes and dtypes, other arguments) -> the real output's bytes. Module
#: level: a size depends only on shapes (and this process's oneDNN), never on the model.
_REAL_BYTES: dict[tuple[Any, ...], int] = {}


class RealWorkspaces(TorchDispatchMode):
    """Under ``FakeTensorMode``: resize the outputs meta kernels under-size to their real size, and
    answer the grouped matmuls whose meta kernel refuses their dtype.

    Cost: the first time an operation is seen with given shapes, one real call of it on zeros of
    those shapes (for an LSTM layer in the profile: one layer's forward at micro-batch 2 or 4,
    milliseconds, and that layer's real activations in memory while it runs). If the real kernel
    refuses the shapes or dtype (bf16 LSTM on an AVX2 CPU), the fake output is kept: a real run
    of that configuration fails the same way, so its memory does not matter.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in _BF16_ONLY_META and args[0].dtype != torch.bfloat16:
            return _grouped_mm_output(func, args, kwargs)
        out = func(*args, **kwargs)
        index = _UNDERSIZED.get(func)
        if index is None:
            return out
        nbytes = _real_bytes(func, index, args, kwargs)
        fake = out[index]
        if nbytes is None or nbytes <= fake.untyped_storage().nbytes():
            return out
        # Still under FakeTensorMode (this mode is above it): a fake buffer of the real size.
        resized = torch.empty(nbytes // fake.element_size(), dtype=fake.dtype, device=fake.device)
        return (*out[:index], resized, *out[index + 1 :])


def _real_bytes(func: Any, index: int, args: Any, kwargs: Any) -> int | None:
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    flat, _ = tree_flatten((args, kwargs))
    key = (func, *((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else _hashable(a) for a in flat))
    if key not in _REAL_BYTES:
        # Grad mode on: oneDNN returns no workspace to an inference call (as the real run, which trains).
        with unset_fake_temporarily(), torch.enable_grad():
            real_args, real_kwargs = tree_map(
                lambda a: torch.zeros(a.shape, dtype=a.dtype) if isinstance(a, torch.Tensor) else a, (args, kwargs)
            )
            try:
                result = func(*real_args, **real_kwargs)
            except RuntimeError:  # the real kernel refuses (oneDNN: no bf16 LSTM on AVX2)
                return None
            _REAL_BYTES[key] = int(result[index].untyped_storage().nbytes())
    return _REAL_BYTES[key]


def _hashable(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _grouped_mm_output(func: Any, args: Any, kwargs: Any) -> torch.Tensor:
    """A grouped matmul's output for operands its meta kernel refuses, as a tensor of the mode below
    (a fake one under ``FakeTensorMode``): the meta kernel's shapes (two 2-D operands: one
    product per group; a 3-D one: the groups share the rows or stack), in the operands' dtype or
    ``out_dtype``."""
    a, b = args[0], args[1]
    offs = args[2] if len(args) > 2 else kwargs.get("offs")
    if a.dim() == 2 and b.dim() == 2:
        shape = [offs.size(0), a.size(0), b.size(1)]
    elif a.dim() == 2:
        shape = [a.size(0), b.size(-1)]
    elif b.dim() == 2:
        shape = [a.size(1), b.size(1)]
    else:
        shape = [a.size(0), a.size(1), b.size(-1)]
    dtype = kwargs.get("out_dtype") or a.dtype
    return torch.empty(shape, dtype=dtype, device=a.device)
