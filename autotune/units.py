"""Byte sizes and memory budgets: parsing ``2GiB`` / ``512MB`` / ``75%`` and printing sizes.

One budget type, :class:`MemoryBudget`, parsed in one place, :meth:`MemoryBudget.parse`: every
``memory_budget`` argument (``Adaptive``, the callbacks, the study, the environments, the policy's
fine-tuning and proposal) and every ``--memory-budget`` goes through it. Text is a size with a unit
or a percentage of the default configuration's peak (:func:`parse_memory_budget`, the text half);
a bare number in text is refused: ``5`` could mean bytes, GiB or a fraction.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from autotune.errors import ConfigError

__all__ = ["DEFAULT_PEAK", "MemoryBudget", "parse_memory_budget", "parse_bytes", "format_bytes"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")
_BUDGET = re.compile(r"^\s*([-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*([a-zA-Z%]*)\s*$")
_BUDGET_FORMS = "a size with a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB) such as 2GiB, or a percentage of the "
_BUDGET_FORMS += "default configuration's peak such as 75%"


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


@dataclass(frozen=True, kw_only=True)
class MemoryBudget:
    """Peak memory allowed: ``bytes``, or a ``fraction`` of the default configuration's peak (one of them).

    What "the default configuration's peak" is depends on who resolves it (:meth:`resolve` takes
    it as a callable, called only for a fraction): ``autotune tune`` measures it on the running
    loop; ``measure``, ``predict`` and ``study`` predict it with the memory model
    (:func:`autotune.memory.predict.budget_bytes`).

    Attributes:
        bytes: Peak tensor bytes allowed (per rank on ranks), or None.
        fraction: The fraction of the default configuration's peak allowed (``0.75`` is ``"75%"``), or None.

    Example:
        >>> from autotune import MemoryBudget
        >>> budget = MemoryBudget.parse("75%")
        >>> budget, str(budget)
        (MemoryBudget(bytes=None, fraction=0.75), '75%')
        >>> budget.resolve(lambda: 4 * 2**30)  # 75% of a 4 GiB default peak, in bytes
        3221225472
    """

    bytes: int | None = None
    fraction: float | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.fraction is None):
            raise ConfigError(
                f"MemoryBudget needs exactly one of bytes and fraction, but got bytes={self.bytes!r}, "
                f"fraction={self.fraction!r}."
            )
        if self.bytes is not None and (
            not isinstance(self.bytes, int) or isinstance(self.bytes, bool) or self.bytes < 1
        ):
            raise ConfigError(f"MemoryBudget.bytes must be an int >= 1, but got {self.bytes!r}.")
        if self.fraction is not None and (
            not isinstance(self.fraction, (int, float)) or not math.isfinite(self.fraction) or self.fraction <= 0
        ):
            raise ConfigError(f"MemoryBudget.fraction must be a finite number > 0, but got {self.fraction!r}.")

    @classmethod
    def parse(
        cls,
        value: MemoryBudget | str | int | float | None,
        *,
        name: str = "memory_budget",
        default: MemoryBudget | None = None,
        fractions: bool = False,
    ) -> MemoryBudget:
        """The one parser of a budget: a ``MemoryBudget`` as is; text as :func:`parse_memory_budget`
        (``"8GiB"``, ``"75%"``); an int as bytes; None as ``default`` where the caller has one.

        Example:
            >>> from autotune.units import MemoryBudget
            >>> MemoryBudget.parse("8GiB"), MemoryBudget.parse("75%")
            (MemoryBudget(bytes=8589934592, fraction=None), MemoryBudget(bytes=None, fraction=0.75))
            >>> MemoryBudget.parse(2**30).bytes
            1073741824

        ``fractions``: also read a float as a fraction of the default's peak (``0.75`` is 75%).
        Only the environments take it: their ``gymnasium.make`` kwargs and the policy's training
        scripts have always given fractions, and a float cannot be bytes. Everywhere else a float
        is refused, since ``1.5`` could be a fraction or GiB.
        """
        if isinstance(value, MemoryBudget):
            return value
        if value is None and default is not None:
            return default
        if isinstance(value, str):
            return parse_memory_budget(value, name=name)
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(bytes=value)
        if fractions and isinstance(value, float):
            return cls(fraction=value)
        forms = ["bytes (int)", "a string such as '8GiB' or '75%'"]
        forms += ["a fraction of the default's peak (float)"] if fractions else []
        forms += ["None"] if default is not None else []
        raise ConfigError(f"{name} must be {', '.join(forms[:-1])}, or {forms[-1]}, but got {value!r}.")

    def resolve(self, default_peak: Callable[[], int]) -> int:
        """Bytes: ``bytes`` as is, or ``fraction`` of ``default_peak()`` (at least 1)."""
        if self.bytes is not None:
            return self.bytes
        assert self.fraction is not None
        return max(1, int(default_peak() * self.fraction))

    def __str__(self) -> str:
        """The text :func:`parse_memory_budget` reads back: ``123456B`` or ``75%``."""
        return f"{self.bytes}B" if self.bytes is not None else f"{self.fraction * 100:.15g}%"  # type: ignore[operator]


#: The default configuration's own peak: the budget where none is given (adaptation only saves).
DEFAULT_PEAK = MemoryBudget(fraction=1.0)


def parse_memory_budget(text: str, *, name: str = "--memory-budget") -> MemoryBudget:
    """``"2GiB"`` -> ``MemoryBudget(bytes=2147483648)``; ``"75%"`` -> ``MemoryBudget(fraction=0.75)``.

    Units as :func:`parse_bytes`; a bare number, zero, a negative or a non-finite size is refused.
    """
    match = _BUDGET.match(text) if isinstance(text, str) else None
    suffix = match.group(2).lower() if match else None
    if match is None or (suffix not in _UNITS and suffix != "%"):
        raise ConfigError(f"{name} must be {_BUDGET_FORMS}, but got {text!r}.")
    number = float(match.group(1))
    value = number / 100 if suffix == "%" else number * _UNITS.get(suffix, 1)
    if not (math.isfinite(number) and math.isfinite(value)) or number <= 0:
        raise ConfigError(f"{name} must be positive and finite, but got {text!r}.")
    if suffix == "":
        raise ConfigError(
            f"{name} needs a unit: a size such as {match.group(1)}GiB or {match.group(1)}MiB, or a percentage "
            f"such as 75%, but got {text!r}."
        )
    if suffix != "%" and value < 1:
        raise ConfigError(f"{name} must be at least 1 byte, but got {text!r}.")
    return MemoryBudget(fraction=value) if suffix == "%" else MemoryBudget(bytes=int(value))


def format_bytes(n: float | None) -> str:
    """Binary units with 4 significant digits: 167.8 MiB."""
    if n is None:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.4g} {unit}"
    return f"{int(n)} B"
