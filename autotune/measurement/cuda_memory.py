"""What the CUDA caching allocator held: the one place autotune asks ``torch.cuda`` about memory.

On a GPU the memory that runs out is the caching allocator's *reserved* segments, not the bytes
of live tensors: users report allocated 74.2 GiB next to reserved 80.8 GiB when the OOM came
(allenai/OLMo-core#297), 15.1 vs 17.4 GiB (ecmwf/WeatherGenerator#2628). Exact tracked tensor
bytes (:mod:`autotune.measurement.tracker`) stay the per-category record and what the memory
model predicts; the allocator's peaks say what the device had to hold. Its retry count matters
too: ``num_alloc_retries`` climbs when the allocator must free its cache and retry (a slow
``cudaFree`` + synchronize) before an OOM, and Composer shrinks the micro-batch on it
(mosaicml/composer#1998).

Everything goes through :class:`StatsSource`, so the CPU tests inject a fake one with exact bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Protocol

from autotune.errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = [
    "ALLOC_CONF_VAR",
    "RESERVED_HEADROOM",
    "AllocatorStats",
    "StatsSource",
    "TorchCudaStats",
    "alloc_conf_with",
    "allocator_source",
    "free_bytes",
    "reserved_of",
    "reserved_with_headroom",
]

#: Margin on a measured reserved peak before it is compared with a budget. Tracked tensor bytes
#: repeat exactly; the allocator's reserved segments do not: they depend on allocation order and
#: on what the cache still holds from earlier steps (its block splitting and rounding), so a
#: config measured just under the budget can reserve a little more on a later step.
RESERVED_HEADROOM = 0.05

# The keys of torch.cuda.memory_stats() read here (PyTorch docs, "Memory management").
_KEYS = {
    "allocated_peak": "allocated_bytes.all.peak",
    "reserved_peak": "reserved_bytes.all.peak",
    "alloc_retries": "num_alloc_retries",
    "ooms": "num_ooms",
}


class StatsSource(Protocol):
    """Reads and resets the allocator's counters of one device (``torch.cuda`` or a test's fake)."""

    def memory_stats(self, device: torch.device) -> Mapping[str, Any]:
        """``torch.cuda.memory_stats(device)``: a flat mapping of counter name to value."""
        ...

    def reset_peak_memory_stats(self, device: torch.device) -> None: ...

    def release(self, device: torch.device) -> None:
        """Free what earlier work in this process left behind, before a configuration is measured."""
        ...


class TorchCudaStats:
    """The real allocator: ``torch.cuda.memory_stats`` and ``reset_peak_memory_stats``."""

    def memory_stats(self, device: torch.device) -> Mapping[str, Any]:
        import torch

        return torch.cuda.memory_stats(device)

    def reset_peak_memory_stats(self, device: torch.device) -> None:
        import torch

        torch.cuda.reset_peak_memory_stats(device)

    def release(self, device: torch.device) -> None:
        """Collect cyclic garbage, then hand the allocator's cached blocks back to the driver.

        A configuration measured after others in one process (``measure`` called in a loop, the
        probe) must not count their leftovers: model copies held in reference cycles until the
        cyclic collector runs stay allocated, one per earlier configuration (cycles through C++
        that it never frees are the tracker's to break: :mod:`autotune.measurement.tracker`), and
        cached segments inflate the reserved peak. Cost: one full collection and one ``cudaFree``
        per cached segment (milliseconds), once per configuration.
        """
        import gc

        import torch

        gc.collect()
        with torch.cuda.device(device):
            torch.cuda.empty_cache()


#: The environment variable the CUDA caching allocator reads its settings from, once, when it starts.
ALLOC_CONF_VAR = "PYTORCH_CUDA_ALLOC_CONF"


def alloc_conf_with(existing: str | None, *, expandable_segments: bool) -> str:
    """``existing`` allocator settings (``key:value`` pairs, comma-separated) with
    ``expandable_segments`` set as asked; the user's other settings are kept."""
    pairs = [p.strip() for p in (existing or "").split(",") if p.strip()]
    kept = [p for p in pairs if p.split(":", 1)[0].strip() != "expandable_segments"]
    return ",".join([*kept, f"expandable_segments:{expandable_segments}"])


def allocator_source(device: torch.device) -> StatsSource | None:
    """The allocator behind ``device``: the CUDA caching allocator, or None (the CPU has no peaks to read)."""
    return TorchCudaStats() if device.type == "cuda" else None


@dataclass(frozen=True, kw_only=True)
class AllocatorStats:
    """The caching allocator's figures over one tracked step (peaks since the last reset).

    ``allocated_peak``: bytes of live tensor blocks at their highest (what
    ``torch.cuda.max_memory_allocated`` says: tracked tensors plus what MemTracker does not see,
    e.g. cuBLAS workspaces). ``reserved_peak``: bytes of the segments the allocator held from the
    driver at their highest (cached, fragmented): what runs out. ``alloc_retries``: times an
    allocation failed, the cache was freed and it was retried, since the process started;
    ``ooms``: out-of-memory errors the allocator raised, likewise cumulative.
    """

    allocated_peak: int
    reserved_peak: int
    alloc_retries: int
    ooms: int

    def __post_init__(self) -> None:
        for name in _KEYS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"AllocatorStats.{name} must be an int >= 0, but got {value!r}.")
        if self.reserved_peak < self.allocated_peak:
            # Every allocated block lives inside a reserved segment.
            raise ConfigError(
                f"AllocatorStats.reserved_peak must be >= allocated_peak, but got reserved_peak="
                f"{self.reserved_peak} with allocated_peak={self.allocated_peak}."
            )

    @classmethod
    def from_memory_stats(cls, stats: Mapping[str, Any]) -> AllocatorStats:
        """From ``torch.cuda.memory_stats()``; a counter it lacks is 0 (the mapping is empty
        until the device's first allocation)."""
        return cls(**{name: int(stats.get(key, 0)) for name, key in _KEYS.items()})

    @classmethod
    def read(cls, source: StatsSource, device: torch.device) -> AllocatorStats:
        return cls.from_memory_stats(source.memory_stats(device))

    @property
    def reserved_ratio(self) -> float | None:
        """reserved / allocated peak (>= 1), the factor a prediction of allocated bytes needs on
        this device; None before anything was allocated."""
        return None if self.allocated_peak == 0 else self.reserved_peak / self.allocated_peak


def reserved_with_headroom(reserved: int, headroom: float = RESERVED_HEADROOM) -> int:
    """``reserved`` bytes plus ``headroom`` of them, rounded up: what must fit a budget on CUDA."""
    if not isinstance(reserved, int) or reserved < 0:
        raise ConfigError(f"reserved must be an int >= 0 bytes, but got {reserved!r}.")
    if not 0.0 <= headroom < 1.0:
        raise ConfigError(f"headroom must be in [0, 1), but got {headroom!r}.")
    # Exact rational arithmetic: 1000 * 1.05 is 1050.0000000000002 in floats, whose ceiling is 1051.
    return math.ceil(reserved * (1 + Fraction(headroom).limit_denominator(10**6)))


def reserved_of(allocated: int, ratio: float) -> int:
    """Reserved bytes for ``allocated`` bytes at a reserved/allocated ``ratio``, rounded up.
    Exact: the float ratio's own rational value, so the same inputs always round alike."""
    return math.ceil(allocated * Fraction(ratio))


def free_bytes(device: torch.device) -> int | None:
    """Memory a new allocation on ``device`` can still get: the CUDA driver's free bytes
    (``torch.cuda.mem_get_info``), or the host's ``MemAvailable`` (``/proc/meminfo``); None where
    it cannot be read."""
    if device.type == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    from pathlib import Path

    try:
        lines = Path("/proc/meminfo").read_text().splitlines()
    except OSError:
        return None
    found = next((line for line in lines if line.startswith("MemAvailable:")), None)
    return None if found is None else int(found.split()[1]) * 1024  # in kB
