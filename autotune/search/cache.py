"""Measurements cached per (workload fingerprint, config, machine), so a resumed or repeated study
does not re-measure what it already knows.

The cache is an SQLite file (default ``studies/measurements.db``, next to the default study
storage, git-ignored), separate from the Optuna storage: it is local to a machine by nature (the
machine is part of the key), while the study storage may be a shared PostgreSQL server. Every
``put`` commits at once, so a SIGKILL loses at most the measurement in flight.

The key also holds the measurement settings (steps, warmup), since a 3-step and a 20-step
throughput are different numbers, and a hash of autotune's own code (every module but the
searchers, the CLI and the envs/policies), since a changed training loop or memory tracker
makes old numbers stale.
The memory budget is *not* in the key: a cached ``ok`` measurement is re-judged against the
current budget, and a cached ``over_budget`` one (no throughput) is reused only if it is still
over the current budget.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.config import TrainConfig
from autotune.measurement.record import Measurement

if TYPE_CHECKING:
    import torch

    from autotune.workload import Workload

__all__ = [
    "MeasurementCache",
    "cache_key",
    "code_fingerprint",
    "machine_fingerprint",
    "verdict_key",
    "workload_fingerprint",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS measurements (
    key TEXT PRIMARY KEY,
    workload TEXT NOT NULL,
    machine TEXT NOT NULL,
    config TEXT NOT NULL,
    measurement TEXT NOT NULL,
    created REAL NOT NULL
)
"""
# What a machine decided about a workload once, beyond one configuration's numbers (which reduced
# precisions a study searches there: :mod:`autotune.search.precisions`), keyed like a measurement.
_VERDICTS = """
CREATE TABLE IF NOT EXISTS verdicts (
    key TEXT PRIMARY KEY,
    verdict TEXT NOT NULL,
    created REAL NOT NULL
)
"""


def workload_fingerprint(workload: Workload) -> str:
    """SHA-256 of what determines a measurement: architecture, weights, blocks, data, batch.

    The data part hashes the dataset length and its first sample (hashing a whole dataset
    would cost more than measuring); the weights are hashed byte for byte.
    """
    import torch
    from torch.utils._pytree import tree_flatten

    h = hashlib.sha256()
    for part in (workload.name, str(workload.batch_size), repr(workload.model), ",".join(workload.block_names())):
        h.update(part.encode())
        h.update(b"\0")
    for name, tensor in workload.model.state_dict().items():
        h.update(name.encode())
        h.update(_tensor_bytes(tensor))
    h.update(str(workload.dataset_size).encode())
    # A sample is any pytree: a tuple, a dict of tensors (Hugging Face batches), a scalar label.
    first = next(iter(workload.dataset)) if workload.iterable else workload.dataset[0]
    leaves, spec = tree_flatten(first)
    h.update(str(spec).encode())
    for leaf in leaves:
        h.update(_tensor_bytes(leaf) if isinstance(leaf, torch.Tensor) else repr(leaf).encode())
    return h.hexdigest()


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of a tensor of any shape and dtype.

    0-dim tensors (BatchNorm's ``num_batches_tracked``, scalar class labels) cannot be viewed as
    another dtype, so every tensor is flattened first; dtype and shape are hashed with the bytes.
    """
    import torch

    flat = t.detach().cpu().contiguous().reshape(-1)
    return f"{t.dtype}{tuple(t.shape)}".encode() + flat.view(torch.uint8).numpy().tobytes()


def machine_fingerprint(*, threads: int | None, device: str, alloc_conf: str | None = None) -> str:
    """A readable description of what throughput depends on: CPU model, cores, torch, threads, device
    (and the CUDA allocator's settings when a study sets them: they change the reserved peak)."""
    import torch

    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    accel = torch.cuda.get_device_name(0) if device.startswith("cuda") and torch.cuda.is_available() else "none"
    return (
        f"{platform.machine()} | {cpu} | {os.cpu_count()} cpus | torch {torch.__version__} | "
        f"threads {threads or 'default'} | device {device} | accelerator {accel}"
        + ("" if alloc_conf is None else f" | {alloc_conf}")
    )


#: Parts of the package that cannot change a measurement: the searchers and the CLI around the
#: measuring core, and the environments and policies (``autotune.envs`` / ``autotune.policies``
#: when installed). Everything else is hashed, so a new module on the measuring path (a tracker,
#: a config rule) makes old numbers stale without anyone remembering to list it.
_NOT_MEASURING = ("search/", "procs/isolation.py", "envs/", "policies/", "cli.py", "report.py")


@functools.cache
def code_fingerprint() -> str:
    """SHA-256 of the source of every module of the package that can change a measurement.

    Cost: reads the package's sources once per process (a few hundred KB).
    """
    package = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative.startswith(_NOT_MEASURING):
            continue
        h.update(relative.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def cache_key(*, workload: str, machine: str, config: TrainConfig, steps: int, warmup: int) -> str:
    return _key(workload=workload, machine=machine, config=config.to_dict(), steps=steps, warmup=warmup)


def verdict_key(*, workload: str, machine: str, subject: str) -> str:
    """The key of a verdict about ``subject`` (e.g. ``"precision bf16 at micro-batch 1"``)."""
    return _key(workload=workload, machine=machine, subject=subject)


def _key(**parts: Any) -> str:
    """SHA-256 of ``parts`` and autotune's code, as sorted JSON (one key shape for every table)."""
    payload = json.dumps({**parts, "code": code_fingerprint()}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


class MeasurementCache:
    """An SQLite table of measurements by key. ``path=None`` keeps nothing (a no-op cache)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = None if path is None else Path(path)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as db:
                db.execute(_SCHEMA)
                db.execute(_VERDICTS)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection that commits on success and is always closed."""
        assert self.path is not None
        # timeout: several study workers on one machine may write at once.
        db = sqlite3.connect(self.path, timeout=30)
        try:
            with db:
                yield db
        finally:
            db.close()

    def get(self, key: str, *, memory_budget: int | None) -> Measurement | None:
        """The cached measurement, re-judged against ``memory_budget``; None if absent or unusable."""
        if self.path is None:
            return None
        with self._connect() as db:
            row = db.execute("SELECT measurement FROM measurements WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        m = Measurement.from_dict(json.loads(row[0]))
        peak = m.peak_bytes
        over = memory_budget is not None and peak is not None and peak > memory_budget
        if m.status == "over_budget":
            if not over:
                return None  # the budget grew: throughput was never measured, so measure now
            return replace(m, memory_budget=memory_budget, reason=_over(peak, memory_budget))
        if m.status == "ok" and over:
            return replace(m, status="over_budget", memory_budget=memory_budget, reason=_over(peak, memory_budget))
        return replace(m, memory_budget=memory_budget)

    def put(self, key: str, *, workload: str, machine: str, measurement: Measurement) -> None:
        if self.path is None:
            return
        with self._connect() as db:
            db.execute(
                "INSERT OR REPLACE INTO measurements VALUES (?, ?, ?, ?, ?, ?)",
                (key, workload, machine, measurement.config.to_json(), measurement.to_json(), time.time()),
            )

    def get_verdict(self, key: str) -> dict[str, Any] | None:
        """A verdict :meth:`put_verdict` stored under ``key``, or None."""
        if self.path is None:
            return None
        with self._connect() as db:
            row = db.execute("SELECT verdict FROM verdicts WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        verdict: dict[str, Any] = json.loads(row[0])
        return verdict

    def put_verdict(self, key: str, verdict: dict[str, Any]) -> None:
        if self.path is None:
            return
        with self._connect() as db:
            row = (key, json.dumps(verdict, sort_keys=True), time.time())
            db.execute("INSERT OR REPLACE INTO verdicts VALUES (?, ?, ?)", row)

    def __len__(self) -> int:
        if self.path is None:
            return 0
        with self._connect() as db:
            count: int = db.execute("SELECT COUNT(*) FROM measurements").fetchone()[0]
        return count


def _over(peak: int | None, budget: int | None) -> str:
    return f"peak {peak} bytes exceeds the memory budget of {budget} bytes"
