import pytest

from autotune.errors import ConfigError
from autotune.tuning import TUNING, Tuning


def test_the_defaults_are_valid_and_frozen() -> None:
    assert Tuning() == TUNING
    assert (TUNING.paired_steps, TUNING.max_paired_steps, TUNING.margin) == (4, 8, 0.03)
    with pytest.raises(AttributeError):
        TUNING.margin = 0.1  # type: ignore[misc]


def test_invalid_values_say_the_rule_and_the_value() -> None:
    with pytest.raises(ConfigError, match=r"^Tuning.margin must be in \[0, 1\), but got 1.5.$"):
        Tuning(margin=1.5)
    with pytest.raises(ConfigError, match=r"^Tuning.horizon must be an int >= 1, but got 0.$"):
        Tuning(horizon=0)
    with pytest.raises(ConfigError, match=r"^Tuning.max_paired_steps must be >= paired_steps \(4\), but got 2.$"):
        Tuning(max_paired_steps=2)
