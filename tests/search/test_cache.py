"""The measurement cache: keyed by (workload fingerprint, config, machine, settings), re-judged
against the current memory budget."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from autotune.config import TrainConfig
from autotune.measurement.record import Measurement, MemoryBreakdown
from autotune.search.cache import MeasurementCache, cache_key, machine_fingerprint, workload_fingerprint
from autotune.train.gns import NoiseEstimate
from tests.conftest import make_resmlp

PEAK = 1000


def _measurement(status: str = "ok", throughput: float | None = 50.0) -> Measurement:
    memory = MemoryBreakdown(
        parameters=400, gradients=200, optimizer_state=100, activations=300, temporaries=0, buffers=0, other=0
    )
    return Measurement(
        workload="w",
        config=TrainConfig(micro_batch_size=4),
        device="cpu",
        status=status,  # type: ignore[arg-type]
        reason=None if status == "ok" else f"peak {PEAK} bytes exceeds the memory budget of 900 bytes",
        warmup=1,
        steps=3,
        throughput=throughput,
        throughput_p25=throughput,
        throughput_p75=throughput,
        step_seconds=0.1,
        memory=memory,
        category_peaks=memory,
        device_peak_bytes=None,
        memory_budget=None,
        noise=NoiseEstimate(b_simple=3.0, trace_sigma=1.0, grad_sq_norm=1.0, sigma2=1.0, steps=2),
        losses=(1.0, 0.9),
        loss_slope=-0.1,
        overflow_steps=0,
        lr=1e-3,
    )


def test_put_then_get_returns_the_measurement(tmp_path: Path) -> None:
    cache = MeasurementCache(tmp_path / "c.db")
    m = _measurement()
    cache.put("k", workload="w", machine="m", measurement=m)
    assert cache.get("k", memory_budget=None) == m
    assert cache.get("other", memory_budget=None) is None
    assert len(cache) == 1
    # a new cache object on the same file (a resumed study) sees it
    assert MeasurementCache(tmp_path / "c.db").get("k", memory_budget=None) == m


def test_an_ok_measurement_over_a_smaller_budget_becomes_over_budget(tmp_path: Path) -> None:
    cache = MeasurementCache(tmp_path / "c.db")
    cache.put("k", workload="w", machine="m", measurement=_measurement())
    got = cache.get("k", memory_budget=900)
    assert got is not None
    assert (got.status, got.reason, got.memory_budget) == (
        "over_budget",
        "peak 1000 bytes exceeds the memory budget of 900 bytes",
        900,
    )
    assert cache.get("k", memory_budget=2000) == replace(_measurement(), memory_budget=2000)


def test_an_over_budget_measurement_is_reused_only_while_still_over(tmp_path: Path) -> None:
    cache = MeasurementCache(tmp_path / "c.db")
    cache.put("k", workload="w", machine="m", measurement=_measurement("over_budget", None))
    got = cache.get("k", memory_budget=800)
    assert got is not None and got.status == "over_budget"
    assert cache.get("k", memory_budget=1000) is None  # fits now: throughput was never measured


def test_no_path_caches_nothing() -> None:
    cache = MeasurementCache(None)
    cache.put("k", workload="w", machine="m", measurement=_measurement())
    assert cache.get("k", memory_budget=None) is None


def test_the_key_depends_on_every_part() -> None:
    base = {"workload": "w", "machine": "m", "config": TrainConfig(), "steps": 3, "warmup": 1}
    keys = {cache_key(**base)}  # type: ignore[arg-type]
    for change in (
        {"workload": "w2"},
        {"machine": "m2"},
        {"config": TrainConfig(micro_batch_size=4)},
        {"steps": 4},
        {"warmup": 2},
    ):
        keys.add(cache_key(**{**base, **change}))  # type: ignore[arg-type]
    assert len(keys) == 6


def test_workload_fingerprint_is_stable_and_sees_weights() -> None:
    a, b = make_resmlp(), make_resmlp()
    assert workload_fingerprint(a) == workload_fingerprint(b)
    with torch.no_grad():
        next(b.model.parameters())[0, 0] += 1.0
    assert workload_fingerprint(a) != workload_fingerprint(b)
    assert workload_fingerprint(a) != workload_fingerprint(make_resmlp(depth=3))


def test_machine_fingerprint_names_threads_and_device() -> None:
    text = machine_fingerprint(threads=1, device="cpu")
    assert f"torch {torch.__version__}" in text
    assert "threads 1 | device cpu" in text


def test_workload_fingerprint_takes_scalar_buffers_scalar_labels_and_dict_samples() -> None:
    """BatchNorm keeps a 0-dim ``num_batches_tracked``; classification data yields 0-dim labels;
    Hugging Face data yields dicts. Each is fingerprinted, and a change to it changes the hash."""
    from autotune.workload import Workload

    def build(label: int, tracked: int) -> Workload:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
        model[1].num_batches_tracked.fill_(tracked)
        data = [{"x": torch.zeros(4), "y": torch.tensor(label)}]
        return Workload(
            name="bn", model=model, dataset=data, loss_fn=lambda m, b: m(b["x"]).sum(), blocks=["0", "2"], batch_size=1
        )

    base = workload_fingerprint(build(label=1, tracked=0))
    assert base == workload_fingerprint(build(label=1, tracked=0))
    assert base != workload_fingerprint(build(label=2, tracked=0))
    assert base != workload_fingerprint(build(label=1, tracked=3))


def test_workload_fingerprint_of_every_builtin_workload() -> None:
    from autotune import zoo

    # gpt-small and the corpus at its built-in size take seconds to build: the corpus at tiny size.
    skip = {"gpt-small", *zoo.CORPUS}
    prints = {name: workload_fingerprint(entry.build()) for name, entry in zoo.BUILTINS.items() if name not in skip}
    prints |= {name: workload_fingerprint(entry.build(**entry.tiny)) for name, entry in zoo.CORPUS.items()}
    assert len(set(prints.values())) == len(prints)


def test_code_fingerprint_covers_the_measuring_modules_and_skips_the_searchers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any module on the measuring path (config rules included) changes the hash; a searcher does not."""
    import shutil

    import autotune.search.cache as cache

    package = Path(cache.__file__).resolve().parent.parent
    copy = tmp_path / "autotune"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache, "__file__", str(copy / "search" / "cache.py"))

    def fingerprint() -> str:
        cache.code_fingerprint.cache_clear()
        return cache.code_fingerprint()

    base = fingerprint()
    (copy / "search" / "display.py").write_text((copy / "search" / "display.py").read_text() + "\n# x\n")
    assert fingerprint() == base
    (copy / "config.py").write_text((copy / "config.py").read_text() + "\n# x\n")
    changed = fingerprint()
    assert changed != base
    (copy / "measurement" / "new_tracker.py").write_text("X = 1\n")
    assert fingerprint() != changed
    cache.code_fingerprint.cache_clear()
