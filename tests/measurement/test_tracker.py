"""Exact tracking counts the device the budget is about, and only it."""

from __future__ import annotations

import gc
import weakref

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


def _tracked_step_leaves(model: torch.nn.Module) -> list[weakref.ref[torch.nn.Parameter]]:
    optimizer = torch.optim.AdamW(model.parameters())
    tracker = tracker_class()(device="cpu")
    tracker.track_external(model, optimizer)
    with tracker:
        model(torch.ones(4, 8)).sum().backward()
        optimizer.step()
    return [weakref.ref(p) for p in model.parameters()]


class _Residual(torch.nn.Module):
    """A pre-norm residual block, as in every transformer."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(8)
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.fc(torch.nn.functional.gelu(self.norm(x)))
        return out


def test_a_tracked_step_keeps_no_parameter_alive() -> None:
    """The module tracker's backward hooks used to keep cycles through C++ (autograd node ->
    hook -> closure -> node) that held parameters through the nodes' AccumulateGrad edges: on a
    GPU every configuration measured earlier in a process stayed allocated. Once a model is
    dropped, each of its parameters is freed, for the first tracked step of a process and later ones."""
    for _ in range(2):
        model = torch.nn.Sequential(torch.nn.Linear(8, 8), _Residual(), torch.nn.LayerNorm(8), torch.nn.Linear(8, 1))
        refs = _tracked_step_leaves(model)
        del model
        gc.collect()
        assert [r() is None for r in refs] == [True] * 10


@torch.compile(fullgraph=True)
def _fused(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def test_a_function_compiled_with_fullgraph_runs_eagerly_while_tracked_and_is_counted() -> None:
    """Dynamo cannot trace into the tracker (a dispatch mode): a fullgraph function raised
    "Attempted to call function marked as skipped" under it. Tracked, it runs eagerly (nothing is
    compiled here), its output counted; the compiler's stance is back to default after."""
    import torch._dynamo.eval_frame as eval_frame

    tracker = tracker_class()()
    x = torch.ones(256)
    with tracker:
        y = _fused(x)
    assert torch.equal(y, torch.full((256,), 3.0))
    assert tracker.category_peaks["Total"] >= 256 * 4  # the eager output, allocated while tracked
    assert eval_frame._stance.stance == "default"


@pytest.mark.filterwarnings(r"ignore:.*torch\.jit\.script_method:DeprecationWarning")
def test_a_compiled_module_tracked_says_nothing_of_the_trackers_global_hooks() -> None:
    """The tracker's module hooks are global ones: a compiled module called under it warned, once
    per tracked step, that they "fire an extra time for the OptimizedModule" (in the user's output
    on every compiled model's check and first step of a configuration)."""
    import warnings

    model = torch.compile(torch.nn.Linear(8, 8), backend="eager")
    tracker = tracker_class()()
    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", message="Using `torch.compile")
        with tracker:
            model(torch.ones(2, 8)).sum().backward()
    assert [str(w.message) for w in caught if "global hooks" in str(w.message)] == []
