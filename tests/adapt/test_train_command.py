from __future__ import annotations

import pytest

from autotune.adapt.adaptive import Adaptive
from autotune.cli import main


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (("--steps", "0"), "autotune train: error: --steps must be >= 1, but got 0.\n"),
        (("--policy", "p"), "autotune train: error: --policy needs --adapt (without it the run keeps the default "
                            "configuration).\n"),
        (("--adapt", "--decide-every", "1"), "autotune train: error: decide_every must be an int >= 2, but got 1.\n"),
        (("--memory-budget", "8"), "autotune train: error: memory_budget needs a unit: a size such as 8GiB or 8MiB, "
                                   "or a percentage such as 75%, but got '8'.\n"),
    ],
)  # fmt: skip
def test_user_mistakes_are_one_line_exit_2(
    args: tuple[str, ...], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "mlp-digits", *args]) == 2
    assert capsys.readouterr().err == line


def test_adaptive_training_reports_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "mlp-digits", "--steps", "8", "--adapt", "--decide-every", "4"]) == 0
    out = capsys.readouterr().out
    assert "8 steps, 256 samples in" in out  # mlp-digits trains batches of 32
    # The first configuration is judged at the first decision (its peak tracked, its steps timed).
    assert "best measured: micro x acc x ranks" in out and "samples/s per GiB" in out


def test_ctrl_c_exits_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted(self: Adaptive) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Adaptive, "step", interrupted)
    assert main(["train", "mlp-digits", "--steps", "3"]) == 130
    assert capsys.readouterr().err == "autotune train: interrupted\n"
