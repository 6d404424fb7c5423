"""Telling a real out-of-memory error from every other failure (accelerate's rule)."""

from __future__ import annotations

import torch

__all__ = ["is_out_of_memory"]

# The allocator messages accelerate's ``should_reduce_batch_size`` matches (utils/memory.py),
# for the devices PyTorch reports OOM on with a plain RuntimeError.
_OOM_MESSAGES = (
    "CUDA out of memory.",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
    "CUDA error: out of memory",
    "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed",
)


def is_out_of_memory(error: BaseException) -> bool:
    """True only when ``error`` is the allocator running out of memory."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    if isinstance(error, RuntimeError) and len(error.args) == 1 and isinstance(error.args[0], str):
        return any(message in error.args[0] for message in _OOM_MESSAGES)
    return False
