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
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["RealWorkspaces"]

#: Operations whose meta kernel under-sizes an output: overload -> index of that output.
_UNDERSIZED: dict[Any, int] = {torch.ops.aten.mkldnn_rnn_layer.default: 3}

#: (operation, argument shapes and dtypes, other arguments) -> the real output's bytes. Module
#: level: a size depends only on shapes (and this process's oneDNN), never on the model.
_REAL_BYTES: dict[tuple[Any, ...], int] = {}


class RealWorkspaces(TorchDispatchMode):
    """Under ``FakeTensorMode``: resize the outputs meta kernels under-size to their real size.

    Cost: the first time an operation is seen with given shapes, one real call of it on zeros of
    those shapes (for an LSTM layer in the profile: one layer's forward at micro-batch 2 or 4,
    milliseconds, and that layer's real activations in memory while it runs). If the real kernel
    refuses the shapes or dtype (bf16 LSTM on an AVX2 CPU), the fake output is kept: a real run
    of that configuration fails the same way, so its memory does not matter.
    """

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
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
