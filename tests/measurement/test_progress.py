"""Progress (autotune/measurement/progress.py): the setup's phase lines and where they go."""

from __future__ import annotations

import pytest

from autotune.measurement.progress import PhaseClock, notes, quiet


def test_a_run_s_notes_go_to_stderr_after_autotune_or_nowhere_or_to_the_callable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    notes(True)("machine probe: bf16 0.42x fp32's step time (real steps on a copy, 1.2 s)")
    notes(False)("not said")
    assert capsys.readouterr() == (
        "",
        "autotune: machine probe: bf16 0.42x fp32's step time (real steps on a copy, 1.2 s)\n",
    )
    lines: list[str] = []
    assert notes(lines.append) == lines.append and notes(False) is quiet
    notes(lines.append)("as it is")
    assert lines == ["as it is"]


def test_the_phase_clock_says_each_phase_when_the_next_begins_and_the_last_at_its_end() -> None:
    lines: list[str] = []
    clock = PhaseClock(lines.append, "start plan: ")
    clock("memory of the default configuration")
    assert lines == []  # under way: its seconds are not known yet
    clock("step times under six configurations")
    assert [line.rpartition(" (")[0] for line in lines] == ["start plan: memory of the default configuration"]
    clock.end()
    clock.end()  # nothing under way: nothing said
    assert [line.rpartition(" (")[0] for line in lines] == [
        "start plan: memory of the default configuration",
        "start plan: step times under six configurations",
    ]
    assert all(line.endswith(" s)") for line in lines)
