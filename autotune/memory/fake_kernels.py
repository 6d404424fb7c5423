"""What a CUDA step saves, where the host's kernels save something else (:class:`CudaKernels`).

The memory model's profile runs on the host, under fake tensors, so the operations a model calls
dispatch as on the CPU. Two of them save different tensors for backward there than on a GPU:

* ``F.scaled_dot_product_attention`` with ``dropout_p > 0``: the CPU has no fused kernel with
  dropout, so the call decomposes into its math (the attention matrix, its softmax, a dropout mask
  and the masked matrix, each batch x heads x sequence^2, all saved). On CUDA the fused kernels
  (flash, memory-efficient, cuDNN) take dropout and save the output and the log-sum-exp alone:
  they regenerate the mask from the RNG state in backward (Dao et al. 2022, FlashAttention, section
  3.1). On a GPT-2 the host's attention holds about as much as the rest of the step together.
* ``F.dropout``: on the CPU it multiplies by a mask in the input's dtype and saves it (4 bytes an
  element in fp32); on CUDA it runs the fused ``native_dropout``, whose mask is a bool (1 byte).

While entered (around a fake run's forward and backward), :class:`CudaKernels` calls the
attention without dropout (the host's fused kernel then saves what CUDA's saves: output and
log-sum-exp) and dropout as ``native_dropout`` (its bool mask). The forward's values are fake
either way: only what is saved, and its bytes, change.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

__all__ = ["DEVICE_TYPES", "CudaKernels", "kernels_for"]

#: The device types a profile can model: the host's own kernels, or CUDA's.
DEVICE_TYPES = ("cpu", "cuda")

_SDPA_DROPOUT = 4  # dropout_p's position in scaled_dot_product_attention(query, key, value, attn_mask, dropout_p)


class CudaKernels(contextlib.AbstractContextManager["CudaKernels"]):
    """While entered, ``F.scaled_dot_product_attention`` and ``F.dropout`` save on the host what
    CUDA's kernels save.

    They are replaced on ``torch.nn.functional`` for the while, not intercepted by a
    ``TorchFunctionMode``: no such mode is active in backward, where a recomputed block runs its
    forward again (and must save what its first forward saved). Code that bound the functions
    under another name at import keeps the host's kernels; real tensors keep them too.
    """

    def __init__(self) -> None:
        self._saved: tuple[Callable[..., Any], Callable[..., Any]] | None = None

    def __enter__(self) -> CudaKernels:
        attention, dropout = self._saved = (F.scaled_dot_product_attention, F.dropout)

        def fused_attention(*args: Any, **kwargs: Any) -> Any:
            if not _fake(args[0] if args else kwargs.get("query")):
                return attention(*args, **kwargs)
            if len(args) > _SDPA_DROPOUT:
                args = (*args[:_SDPA_DROPOUT], 0.0, *args[_SDPA_DROPOUT + 1 :])
            elif "dropout_p" in kwargs:
                kwargs = kwargs | {"dropout_p": 0.0}
            return attention(*args, **kwargs)

        def fused_dropout(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
            # In place (a model's own choice, rare) keeps the host's path: native_dropout has none.
            if training and 0.0 < p < 1.0 and not inplace and _fake(input):
                return torch.native_dropout(input, p, True)[0]
            return dropout(input, p, training, inplace)

        F.scaled_dot_product_attention = fused_attention
        F.dropout = fused_dropout
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._saved is not None, "CudaKernels exited before it was entered"
        F.scaled_dot_product_attention, F.dropout = self._saved
        self._saved = None


def _fake(x: object) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(x, FakeTensor)


def kernels_for(device_type: str) -> CudaKernels | None:
    """What makes a fake run on the host save what ``device_type``'s kernels save (None: the
    host's own)."""
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"device_type must be one of {DEVICE_TYPES}, but got {device_type!r}.")
    return CudaKernels() if device_type == "cuda" else None
