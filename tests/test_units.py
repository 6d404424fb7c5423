from __future__ import annotations

import re

import pytest

from autotune import ConfigError
from autotune.units import format_bytes, parse_bytes


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
