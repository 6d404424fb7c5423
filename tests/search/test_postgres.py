"""Two workers on one study in a private PostgreSQL 15 server: trial numbers unique, counts add up.

The fixture starts its own server (initdb + pg_ctl, as the ``postgres`` user when run as root) on
127.0.0.1 and a free port, and stops it after. ``.ci/run`` installs Debian's postgresql; if the
binaries are missing here, the fixture installs them with apt-get, and skips only without apt.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from autotune.procs.launch import free_port
from tests.paths import TINY_WORKLOAD

TINY = TINY_WORKLOAD
MEASURE = ("--steps", "2", "--warmup", "1", "--threads", "1", "--no-progress", "--no-memory-model")


def _pg_bin() -> Path | None:
    for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (candidate / "initdb").exists():
            return candidate
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _ensure_postgres() -> Path:
    bin_dir = _pg_bin()
    if bin_dir is None and shutil.which("apt-get") and os.geteuid() == 0:
        subprocess.run(["apt-get", "install", "-y", "-q", "postgresql"], check=True, capture_output=True, timeout=600)
        bin_dir = _pg_bin()
    if bin_dir is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) are absent and apt-get is unavailable to install them")
    return bin_dir


@pytest.fixture
def postgres_url() -> Iterator[str]:
    bin_dir = _ensure_postgres()
    # initdb refuses to run as root: run the server as the postgres user, which must own the
    # directory and reach it (pytest's tmp_path lies under a root-only 0700 directory).
    data = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    if as_user:
        shutil.chown(data, "postgres")
    port = free_port()
    run = {"check": True, "capture_output": True, "timeout": 120}
    subprocess.run([*as_user, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"], **run)  # type: ignore[call-overload]
    opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {data}"
    subprocess.run(
        [*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-o", opts, "-w", "-l", str(data / "log"), "start"], **run
    )  # type: ignore[call-overload]
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], **run)  # type: ignore[call-overload]
        shutil.rmtree(data, ignore_errors=True)


def test_two_workers_share_one_study(postgres_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "autotune.cli"]
    create = subprocess.run(
        [*base, "study", f"{TINY}:build", "--trials", "6", "--storage", postgres_url, "--create-only", *MEASURE],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert create.returncode == 0, create.stderr
    # The two baselines and the policy's proposal (its line says what it proposes and what it cost).
    *setup, proposal, ready = create.stderr.splitlines()  # one line per setup phase first
    assert [re.sub(r" \(.*\)$", "", line) for line in setup[:4]] == [
        "workload tiny loaded: 34,340 parameters, 4 blocks",
        "blocks: blocks.0..blocks.3",  # its "(4 repeated Block(...))" is cut like the seconds
        "blocks ranked by the activation bytes they save",
        "baselines enqueued: pytorch-default, seed-recipe, hf-recipe",  # no budget: no memory model consulted
    ]
    # Then the proposal's profile, phase by phase (tests/policies/test_transfer.py has each).
    assert [line.startswith("policy proposal: ") for line in setup[4:]] == [True] * 7
    assert re.fullmatch(r"policy proposal enqueued: .+ \(profile of the model and simulation, \d+\.\d s\)", proposal), (
        proposal
    )
    assert ready == "study 'tiny' ready: 4 trials enqueued; start the workers now"
    workers = [
        subprocess.Popen(
            [
                *base,
                "worker",
                "tiny",
                "--storage",
                postgres_url,
                "--cache",
                str(tmp_path / f"c{i}.db"),
                "--no-progress",
                "--no-memory-model",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        for i in range(2)
    ]
    results = [w.communicate(timeout=600) for w in workers]
    assert [w.returncode for w in workers] == [0, 0], [err for _, err in results]
    storage = optuna.storages.RDBStorage(postgres_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        trials = optuna.load_study(study_name="tiny", storage=storage).trials
    finally:
        storage.engine.dispose()  # close pooled connections before the server stops
    numbers = [t.number for t in trials]
    assert len(set(numbers)) == len(numbers) == len(trials)
    finished = [t for t in trials if t.state.name in ("COMPLETE", "PRUNED", "FAIL")]
    # Each worker stops once 6 trials are done; one may have started a 7th just before.
    assert 6 <= len(finished) <= 7 and len(finished) == len(trials)
    by_worker = Counter(t.user_attrs["autotune:pid"] for t in finished)
    assert sorted(by_worker) == sorted(w.pid for w in workers)  # both took part
    assert sum(by_worker.values()) == len(finished)
    assert {t.user_attrs.get("baseline") for t in finished} >= {"pytorch-default", "seed-recipe"}
