"""Exact tracking counts the device the budget is about, and only it."""

from __future__ import annotations

import pytest
import torch

from autotune.measurement.tracker import tracker_class


def _two_devices(device: str | None) -> object:
    """4000 + 4000 host bytes and 20000 + 20000 bytes on a second device (meta stands in for a GPU)."""
    tracker = tracker_class()(device=device)
    with tracker:
        host = torch.ones(1000)
        other = torch.ones(5000, device="meta")
        _ = host * 2, other * 2
    return tracker


@pytest.mark.parametrize(("device", "total"), [("cpu", 8000), ("meta", 40000)])
def test_only_the_tracked_devices_bytes_count(device: str, total: int) -> None:
    """A CUDA step also touches host tensors (Adam's `step` counters, the batch before its copy):
    they are not the accelerator's memory (the first GPU run failed on exactly this)."""
    tracker = _two_devices(device)
    snapshot = {getattr(k, "value", k): v for k, v in tracker.device_snapshot("peak").items()}  # type: ignore[attr-defined]
    assert snapshot["Activation"] == snapshot["Total"] == total
    assert tracker.category_peaks == {"Activation": total, "Total": total}  # type: ignore[attr-defined]


def test_without_a_device_two_devices_are_an_invariant_broken() -> None:
    with pytest.raises(AssertionError, match="one device per rank expected"):
        _two_devices(None).device_snapshot("peak")  # type: ignore[attr-defined]
