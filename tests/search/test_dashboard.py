"""Dashboard: the Pareto figure marks baselines, artifacts attach once, and, in headless Chromium
driven by Playwright, optuna-dashboard shows the Pareto front of the trials and renders the notes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from autotune.procs.launch import free_port
from autotune.search.dashboard import PARETO_PLOT_ID, pareto_figure, save_study_artifacts
from autotune.search.results import summarize
from tests.paths import TINY_WORKLOAD

TINY = TINY_WORKLOAD
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="module")
def study_db(tmp_path_factory: pytest.TempPathFactory, tiny_budget: int) -> Path:
    """A 5-trial study of the tiny workload made by the CLI, with artifacts under ``artifacts/``: the
    three baselines, the PyTorch default again at a smaller micro-batch (its first try is over the
    budget), and the policy's proposal."""
    root = tmp_path_factory.mktemp("dash")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "study",
            f"{TINY}:build",
            "--trials",
            "5",
            "--memory-budget",
            f"{tiny_budget}B",
            "--storage",
            str(root / "s.db"),
            "--artifact-dir",
            str(root / "artifacts"),
            "--cache",
            str(root / "c.db"),
            "--steps",
            "2",
            "--warmup",
            "1",
            "--threads",
            "1",
            "--no-progress",
            "--no-memory-model",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=root,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return root / "s.db"


def _load(db: Path) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name="tiny", storage=f"sqlite:///{db}")


def test_the_pareto_figure_marks_baselines_and_the_recommendation(study_db: Path) -> None:
    summary = summarize(_load(study_db))
    names = [trace.name for trace in pareto_figure(summary).data]
    assert names[:2] == ["trials", "Pareto front"]
    assert "baseline: seed-recipe" in names and names[-1] == "recommended (max per GiB)"
    # the first run saved the plot, and the config files of the recommended trial once
    study = _load(study_db)
    assert any(PARETO_PLOT_ID in key for key in study._storage.get_study_system_attrs(study._study_id))
    assert study.user_attrs["artifacts_of_trial"] == summary.recommended.number  # type: ignore[union-attr]
    assert len(list((study_db.parent / "artifacts").iterdir())) == 3
    assert (
        save_study_artifacts(
            study,
            summary,
            artifact_dir=study_db.parent / "artifacts",
            block_names=("blocks.0",),
            workload="tiny",
            largest_parameter=1,
        )
        == []
    )


@pytest.fixture
def dashboard(study_db: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "dashboard",
            "--storage",
            str(study_db),
            "--port",
            str(port),
            "--artifact-dir",
            str(study_db.parent / "artifacts"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                with urllib.request.urlopen(f"{url}/api/studies", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the dashboard did not answer within 60 s"
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stderr:
            proc.stderr.close()


def test_the_dashboard_shows_the_pareto_front_and_the_notes(dashboard: str, study_db: Path) -> None:
    if not CHROMIUM.exists():
        pytest.skip("Debian chromium is not installed (.ci/run installs it: apt-get install -y chromium)")
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    complete = [t for t in _load(study_db).trials if t.state.name == "COMPLETE"]
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM),
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking"],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{dashboard}/dashboard/studies/1")
            card = page.locator(".MuiCard-root", has_text="Pareto Front").first
            points = card.locator(".js-plotly-plot .scatterlayer .point")
            points.first.wait_for(timeout=60_000)
            assert points.count() == len(complete)
            assert page.get_by_text("baseline: pytorch-default").count() >= 1  # our plot, with its legend
            page.goto(f"{dashboard}/dashboard/studies/1/trials")
            heading = page.locator("h2", has_text="Trial 0: over_budget (baseline: pytorch-default)")
            heading.first.wait_for(timeout=60_000)
            assert page.get_by_text("Memory by category (at peak)").count() >= 1
        finally:
            browser.close()
