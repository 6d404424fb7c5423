"""Byte sizes: parsing ``2GiB`` / ``512MB`` and printing them."""

from __future__ import annotations

import re

from autotune.errors import ConfigError

__all__ = ["parse_bytes", "format_bytes"]

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str, *, name: str = "memory size") -> int:
    """``"2GiB"`` -> 2147483648. Units: B, KB/MB/GB/TB (powers of 10), KiB/MiB/GiB/TiB (powers of 2)."""
    match = _PATTERN.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigError(
            f"{name} must be a number with an optional unit (B, KB, MB, GB, KiB, MiB, GiB, ...), but got {text!r}."
        )
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ConfigError(f"{name} must be positive, but got {text!r}.")
    return value


def format_bytes(n: float | None) -> str:
    """Binary units with 4 significant digits: 167.8 MiB."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.4g} {unit}"
    return f"{int(n)} B"
