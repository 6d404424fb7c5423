"""What a CUDA step saves, where the host's kernels save something else (:class:`CudaKernels`).

The memory model's profile runs on the host, under fake tensors, so the operations a model calls
dispatch as on the CPU and cast as the CPU's autocast casts. Three things save different tensors
for backward there than on a GPU:

* ``F.scaled_dot_product_attention`` with ``dropout_p > 0``: the CPU has no fused kernel with
  dropout, so the call decomposes into its math (the attention matrix, its softmax, a dropout mask
  and the masked matrix, each batch x heads x sequence^2, all saved). On CUDA the fused kernels
  (flash, memory-efficient, cuDNN) take dropout and save the output and the log-sum-exp alone:
  they regenerate the mask from the RNG state in backward (Dao et al. 2022, FlashAttention, section
  3.1). On a GPT-2 the host's attention holds about as much as the rest of the step together.
* ``F.dropout``: on the CPU it multiplies by a mask in the input's dtype and saves it (4 bytes an
  element in fp32); on CUDA it runs the fused ``native_dropout``, whose mask is a bool (1 byte).
* Autocast: CUDA's runs more operations in fp32 than the CPU's (PyTorch's autocast op reference,
  "CUDA Ops that can autocast to float32"): ``pow``, ``exp``, ``log``, ``rsqrt``, ``softmax``,
  ``layer_norm``, ``sum`` and others, which the CPU's leaves in bf16. Such an operation saves an
  fp32 copy of its input or its fp32 output, and what follows it runs in fp32 by type promotion:
  GPT-2's ``gelu_new`` (``torch.pow(x, 3.0)``) turns the rest of its MLP to fp32 on CUDA. And
  CUDA's casts ``einsum``, ``mv``, ``addmv`` and ``addr`` to the reduced precision, the CPU's not.

While entered (around a fake run's forward and backward), :class:`CudaKernels` calls the
attention without dropout (the host's fused kernel then saves what CUDA's saves: output and
log-sum-exp), dropout as ``native_dropout`` (its bool mask), and, inside an autocast region, the
operations above with CUDA's casts. The forward's values are fake either way: only what is saved,
its dtypes and its bytes, change.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from autotune.memory.fake_values import is_fake

__all__ = ["DEVICE_TYPES", "CudaKernels", "kernels_for"]

#: The device types a profile can model: the host's own kernels, or CUDA's.
DEVICE_TYPES = ("cpu", "cuda")

_SDPA_DROPOUT = 4  # dropout_p's position in scaled_dot_product_attention(query, key, value, attn_mask, dropout_p)

# CUDA's autocast, where the CPU's differs (torch 2.13 on the CPU leaves each of these in bf16; the
# ones CPU autocast already runs in fp32, the losses, prod and cdist, are not listed). Three rules:
# FP32 casts every reduced-precision floating argument to fp32; FP32_DTYPE passes dtype=float32
# unless the call names a dtype (the op reads its input as it is and computes and returns fp32);
# REDUCED casts fp32 arguments to the autocast dtype.
_FP32 = {
    torch: (
        "pow", "exp", "expm1", "log", "log10", "log1p", "log2", "rsqrt", "reciprocal", "sinh", "cosh", "tan",
        "acos", "asin", "erfinv", "layer_norm", "group_norm", "norm", "logsumexp", "dist", "renorm",
        "cosine_similarity",
    ),
    F: ("layer_norm", "group_norm", "softplus", "normalize", "cosine_similarity"),
    torch.Tensor: (
        "pow", "__pow__", "__rpow__", "exp", "expm1", "log", "log10", "log1p", "log2", "rsqrt", "reciprocal",
        "sinh", "cosh", "tan", "acos", "asin", "erfinv", "norm", "logsumexp", "renorm",
    ),
}  # fmt: skip
_FP32_DTYPE = {
    torch: ("softmax", "log_softmax", "sum", "cumsum", "cumprod"),
    F: ("softmax", "log_softmax", "softmin"),
    torch.Tensor: ("softmax", "log_softmax", "sum", "cumsum", "cumprod"),
}
_REDUCED = {torch: ("einsum", "mv", "addmv", "addr")}
_REDUCED_DTYPES = (torch.bfloat16, torch.float16)


class CudaKernels(contextlib.AbstractContextManager["CudaKernels"]):
    """While entered, attention with dropout, dropout and the operations CUDA's autocast casts
    otherwise than the CPU's save on the host what CUDA's kernels save (on fake tensors only).

    They are replaced on ``torch``, ``torch.nn.functional`` and ``torch.Tensor`` for the while, not
    intercepted by a ``TorchFunctionMode``: no such mode is active in backward, where a recomputed
    block runs its forward again (and must save what its first forward saved). Code that bound the
    functions under another name at import keeps the host's kernels; real tensors keep them too.
    """

    def __init__(self) -> None:
        self._undo: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> CudaKernels:
        self._patch(F, "scaled_dot_product_attention", _fused_attention)
        self._patch(F, "dropout", _fused_dropout)
        for rules, wrap in ((_FP32, _in_fp32), (_FP32_DTYPE, _fp32_dtype), (_REDUCED, _in_reduced)):
            for owner, names in rules.items():
                for name in names:
                    self._patch(owner, name, wrap)
        return self

    def __exit__(self, *exc: object) -> None:
        while self._undo:
            owner, name, original = self._undo.pop()
            setattr(owner, name, original)

    def _patch(self, owner: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(owner, name, None)
        if original is None:  # an older torch without it
            return
        self._undo.append((owner, name, original))
        setattr(owner, name, functools.wraps(original)(wrap(original)))


def _tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    found = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    # einsum's operands come as a list after the equation
    found += [t for a in args if isinstance(a, (list, tuple)) for t in a if isinstance(t, torch.Tensor)]
    return found


def _autocast_dtype(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.dtype | None:
    """The reduced dtype of the host's autocast region this call is in, where a fake tensor takes
    part (None: no region, or real tensors)."""
    if not torch.is_autocast_enabled("cpu") or not any(is_fake(t) for t in _tensors(args, kwargs)):
        return None
    return torch.get_autocast_dtype("cpu")


def _cast(value: Any, dtype: torch.dtype, sources: tuple[torch.dtype, ...]) -> Any:
    """``value`` with each tensor of a dtype in ``sources`` cast to ``dtype``, in lists too."""
    if isinstance(value, torch.Tensor) and value.dtype in sources:
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype, sources) for v in value)
    return value


def _in_fp32(original: Callable[..., Any]) -> Callable[..., Any]:
    def cast(*args: Any, **kwargs: Any) -> Any:
        if _autocast_dtype(args, kwargs) is None:
            return original(*args, **kwargs)
        args = _cast(args, torch.float32, _REDUCED_DTYPES)
        kwargs = {k: _cast(v, torch.float32, _REDUCED_DTYPES) for k, v in kwargs.items()}
        with torch.autocast("cpu", enabled=False):  # as CUDA's runs the op: its inputs cast, itself outside autocast
            return original(*args, **kwargs)

    return cast


def _fp32_dtype(original: Callable[..., Any]) -> Callable[..., Any]:
    def cast(*args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else kwargs.get("input")
        if (
            "dtype" in kwargs
            or len(args) > 2  # past (input, dim): a dtype may be among them (softmax's third)
            or _autocast_dtype(args, kwargs) is None
            or not isinstance(first, torch.Tensor)
            or first.dtype not in _REDUCED_DTYPES
        ):
            return original(*args, **kwargs)
        return original(*args, **kwargs, dtype=torch.float32)

    return cast


def _in_reduced(original: Callable[..., Any]) -> Callable[..., Any]:
    def cast(*args: Any, **kwargs: Any) -> Any:
        dtype = _autocast_dtype(args, kwargs)
        if dtype is None:
            return original(*args, **kwargs)
        fp32 = (torch.float32,)
        return original(*_cast(args, dtype, fp32), **{k: _cast(v, dtype, fp32) for k, v in kwargs.items()})

    return cast


def _fused_attention(attention: Callable[..., Any]) -> Callable[..., Any]:
    def fused(*args: Any, **kwargs: Any) -> Any:
        if not is_fake(args[0] if args else kwargs.get("query")):
            return attention(*args, **kwargs)
        if len(args) > _SDPA_DROPOUT:
            args = (*args[:_SDPA_DROPOUT], 0.0, *args[_SDPA_DROPOUT + 1 :])
        elif "dropout_p" in kwargs:
            kwargs = kwargs | {"dropout_p": 0.0}
        return attention(*args, **kwargs)

    return fused


def _fused_dropout(dropout: Callable[..., Any]) -> Callable[..., Any]:
    def fused(input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
        # In place (a model's own choice, rare) keeps the host's path: native_dropout has none.
        if training and 0.0 < p < 1.0 and not inplace and is_fake(input):
            return torch.native_dropout(input, p, True)[0]
        return dropout(input, p, training, inplace)

    return fused


def kernels_for(device_type: str) -> CudaKernels | None:
    """What makes a fake run on the host save what ``device_type``'s kernels save (None: the
    host's own)."""
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"device_type must be one of {DEVICE_TYPES}, but got {device_type!r}.")
    return CudaKernels() if device_type == "cuda" else None
