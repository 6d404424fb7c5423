"""A fake CUDA caching allocator: the counters ``torch.cuda.memory_stats`` reports, set by the test."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


class FakeAllocator:
    """Answers :class:`autotune.measurement.cuda_memory.StatsSource` with fixed bytes.

    ``memory_stats`` returns the keys torch.cuda.memory_stats() has (and one it has that autotune
    does not read); ``resets`` and ``releases`` count ``reset_peak_memory_stats`` and ``release``
    calls, ``devices`` the devices asked.
    """

    def __init__(self, *, allocated: int, reserved: int, retries: int = 0, ooms: int = 0) -> None:
        self.stats = {
            "allocated_bytes.all.peak": allocated,
            "reserved_bytes.all.peak": reserved,
            "num_alloc_retries": retries,
            "num_ooms": ooms,
            "active_bytes.all.peak": allocated,
        }
        self.resets = 0
        self.releases = 0
        self.devices: list[torch.device] = []

    def memory_stats(self, device: torch.device) -> Mapping[str, Any]:
        self.devices.append(device)
        return dict(self.stats)

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        self.resets += 1

    def release(self, device: torch.device) -> None:
        self.releases += 1
