from __future__ import annotations

import re

import pytest

from autotune import ConfigError
from autotune.units import DEFAULT_PEAK, MemoryBudget, format_bytes, parse_bytes, parse_memory_budget


@pytest.mark.parametrize(
    ("text", "value"),
    [("2GiB", 2 * 2**30), ("512MB", 512 * 10**6), ("1.5 KiB", 1536), ("100", 100), ("3gb", 3 * 10**9)],
)
def test_parse(text: str, value: int) -> None:
    assert parse_bytes(text) == value


def test_parse_rejects_garbage_and_zero() -> None:
    with pytest.raises(ConfigError, match=re.escape("budget must be positive, but got '0GiB'.")):
        parse_bytes("0GiB", name="budget")
    with pytest.raises(ConfigError, match=re.escape("but got '2 parsecs'.")):
        parse_bytes("2 parsecs")


def test_format() -> None:
    assert format_bytes(175_950_000) == "167.8 MiB"
    assert format_bytes(512) == "512 B"
    assert format_bytes(None) == "-"


@pytest.mark.parametrize(
    ("text", "budget"),
    [
        ("2GiB", MemoryBudget(bytes=2 * 2**30)),
        ("512MiB", MemoryBudget(bytes=512 * 2**20)),
        ("100MB", MemoryBudget(bytes=100 * 10**6)),
        ("1.5GiB", MemoryBudget(bytes=3 * 2**29)),
        ("1B", MemoryBudget(bytes=1)),
        ("75%", MemoryBudget(fraction=0.75)),
        ("150%", MemoryBudget(fraction=1.5)),
    ],
)
def test_a_memory_budget_is_a_size_with_a_unit_or_a_percentage(text: str, budget: MemoryBudget) -> None:
    assert parse_memory_budget(text) == budget
    assert parse_memory_budget(str(budget)) == budget  # what a stored study spec reads back


FORMS = (
    "a size with a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB) such as 2GiB, or a percentage of the default "
    "configuration's peak such as 75%"
)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5", "--memory-budget needs a unit: a size such as 5GiB or 5MiB, or a percentage such as 75%, but got '5'."),
        (
            "0.75",
            "--memory-budget needs a unit: a size such as 0.75GiB or 0.75MiB, or a percentage such as 75%, "
            "but got '0.75'.",
        ),
        ("0", "--memory-budget must be positive and finite, but got '0'."),
        ("-0.5", "--memory-budget must be positive and finite, but got '-0.5'."),
        ("0GiB", "--memory-budget must be positive and finite, but got '0GiB'."),
        ("-1GiB", "--memory-budget must be positive and finite, but got '-1GiB'."),
        ("0%", "--memory-budget must be positive and finite, but got '0%'."),
        ("1e999GiB", "--memory-budget must be positive and finite, but got '1e999GiB'."),
        ("0.5B", "--memory-budget must be at least 1 byte, but got '0.5B'."),
        ("inf", f"--memory-budget must be {FORMS}, but got 'inf'."),
        ("2 parsecs", f"--memory-budget must be {FORMS}, but got '2 parsecs'."),
    ],
)
def test_a_bad_memory_budget_is_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        parse_memory_budget(text)


def test_a_fraction_is_resolved_against_the_default_peak_only_when_given() -> None:
    def fail() -> int:
        raise AssertionError("a size needs no default peak")

    assert MemoryBudget(bytes=10).resolve(fail) == 10
    assert MemoryBudget(fraction=0.75).resolve(lambda: 1000) == 750


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "MemoryBudget needs exactly one of bytes and fraction, but got bytes=None, fraction=None."),
        ({"bytes": 0}, "MemoryBudget.bytes must be an int >= 1, but got 0."),
        ({"fraction": 0.0}, "MemoryBudget.fraction must be a finite number > 0, but got 0.0."),
        ({"fraction": float("nan")}, "MemoryBudget.fraction must be a finite number > 0, but got nan."),
    ],
)
def test_a_memory_budget_is_validated(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        MemoryBudget(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("value", "budget"),
    [
        (MemoryBudget(bytes=5), MemoryBudget(bytes=5)),
        ("8GiB", MemoryBudget(bytes=8 * 2**30)),
        ("75%", MemoryBudget(fraction=0.75)),
        (1000, MemoryBudget(bytes=1000)),
        (None, DEFAULT_PEAK),
    ],
)
def test_one_parser_reads_every_form_of_a_budget(value: MemoryBudget | str | int | None, budget: MemoryBudget) -> None:
    assert MemoryBudget.parse(value, default=DEFAULT_PEAK) == budget


def test_a_float_is_a_fraction_only_where_the_environments_ask_for_it() -> None:
    assert MemoryBudget.parse(0.75, fractions=True) == MemoryBudget(fraction=0.75)
    message = "memory_budget must be bytes (int), a string such as '8GiB' or '75%', or None, but got 0.75."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        MemoryBudget.parse(0.75, default=DEFAULT_PEAK)
    # Without a default, None is no budget: the message says which forms are taken.
    message = "--memory-budget must be bytes (int), or a string such as '8GiB' or '75%', but got None."
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        MemoryBudget.parse(None, name="--memory-budget")
    with pytest.raises(ConfigError, match=r"^MemoryBudget\.bytes must be an int >= 1, but got 0\.$"):
        MemoryBudget.parse(0)
    with pytest.raises(ConfigError, match=r"^MemoryBudget\.fraction must be a finite number > 0, but got -0\.5\.$"):
        MemoryBudget.parse(-0.5, fractions=True)
