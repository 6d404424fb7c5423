"""THE arithmetic of a peak against a budget: each branch's verdict, figures and reason, exactly."""

from __future__ import annotations

import pytest

from autotune.measurement.admission import Verdict, admission
from autotune.memory import gate


def test_a_measured_peak_is_judged_as_is_at_the_budget_and_one_byte_over() -> None:
    assert admission(budget=1000, headroom=0.05, measured=1000) == Verdict(
        admitted=True, reason="measured 1000 B <= budget 1000 B", predicted=None, measured=1000, needed=1000
    )
    assert admission(budget=1000, headroom=0.05, measured=1001) == Verdict(
        admitted=False, reason="measured 1001 B > budget 1000 B", predicted=None, measured=1001, needed=1001
    )


def test_a_measured_reserved_peak_is_judged_with_the_allocator_s_headroom() -> None:
    # 6291456 x 1.05 = 6606028.8, rounded up: the bytes compared with the budget.
    verdict = admission(budget=6_606_029, headroom=0.0, measured=6_000_000, reserved=6_291_456)
    assert verdict == Verdict(
        admitted=True,
        reason="measured 6291456 B reserved (+5% headroom: 6606029 B) <= budget 6606029 B",
        predicted=None,
        measured=6_000_000,
        needed=6_606_029,
    )
    assert not admission(budget=6_606_028, headroom=0.0, measured=6_000_000, reserved=6_291_456).admitted


def test_a_verified_prediction_is_judged_with_the_headroom() -> None:
    # 1000 x 1.02 = 1020: fits a budget of 1020, not of 1019.
    assert admission(budget=1020, headroom=0.02, predicted=1000, verified=True) == Verdict(
        admitted=True,
        reason="predicted 1000 B (+2% headroom) <= budget 1020 B",
        predicted=1000,
        measured=None,
        needed=1020,
    )
    assert admission(budget=1019, headroom=0.02, predicted=1000, verified=True).reason == (
        "predicted 1000 B (+2% headroom) > budget 1019 B"
    )


def test_on_cuda_a_prediction_is_scaled_by_the_reserved_ratio_with_the_larger_headroom() -> None:
    # 1000 x 1.25 = 1250 reserved, + max(2%, 5%) = 1312.5, rounded up.
    verdict = admission(budget=1313, headroom=0.02, predicted=1000, verified=True, reserved_ratio=1.25)
    assert (verdict.admitted, verdict.needed, verdict.reason) == (
        True,
        1313,
        "predicted 1000 B allocated x 1.2500 reserved/allocated = 1250 B reserved (+5% headroom: 1313 B) "
        "<= budget 1313 B",
    )


def test_unverified_or_no_prediction_is_over_the_budget_unless_the_caller_measures_to_know() -> None:
    assert admission(budget=10**9, headroom=0.02, predicted=1000) == Verdict(
        admitted=False,
        reason="predicted 1000 B, but the prediction is unverified and the config was never measured",
        predicted=1000,
        measured=None,
    )
    assert admission(budget=10**9, headroom=0.02, unpredicted="no bf16 runs") == Verdict(
        admitted=False, reason="no memory prediction (no bf16 runs) and not measured", predicted=None, measured=None
    )
    # A study's trial measures it (in an isolated child, where out of memory is a result).
    assert admission(budget=1, headroom=0.02, predicted=1000, unverified="measure") == Verdict(
        admitted=True,
        reason="predicted 1000 B, but the prediction is unverified: measured to know",
        predicted=1000,
        measured=None,
    )
    assert admission(budget=1, headroom=0.02, unverified="measure") == Verdict(
        admitted=True, reason="no memory prediction: measured to know", predicted=None, measured=None
    )
    # A verified prediction over the budget is refused either way.
    assert not admission(budget=1, headroom=0.02, predicted=1000, verified=True, unverified="measure").admitted


@pytest.mark.parametrize("name", ["admission", "Verdict"])
def test_the_gate_re_exports_the_one_arithmetic(name: str) -> None:
    from autotune.measurement import admission as home

    assert getattr(gate, name) is getattr(home, name)
