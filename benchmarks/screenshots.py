"""The dashboard screenshot that README.md and the docs show, taken by a real headless browser.

Runs a small study with the CLI (in a temporary directory: the repository's studies/ is left
alone), starts ``autotune dashboard`` on it, opens the study in Debian's Chromium driven by
Playwright (``/usr/bin/chromium``; no browser is downloaded) and saves the Pareto-front card as a
PNG::

    python benchmarks/screenshots.py --out docs/images/dashboard-pareto.png

A few minutes on 2 cores (the study's trials dominate). Not run in CI: the PNG is committed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from autotune.procs.launch import free_port

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")


def run_study(root: Path, target: str, trials: int, budget: str | None) -> Path:
    """A study made by the CLI as a user makes one; returns its SQLite file."""
    db = root / "study.db"
    command = [
        sys.executable,
        "-m",
        "autotune.cli",
        "study",
        target,
        "--trials",
        str(trials),
        "--storage",
        str(db),
        "--artifact-dir",
        str(root / "artifacts"),
        "--cache",
        str(root / "cache.db"),
        "--no-progress",
    ]
    if budget is not None:
        command += ["--memory-budget", budget]
    subprocess.run(command, check=True, cwd=ROOT)
    return db


def wait_for(url: str, proc: subprocess.Popen[bytes], seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the dashboard exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise SystemExit(f"the dashboard did not answer within {seconds:.0f} s") from None
            time.sleep(0.3)


def screenshot(db: Path, artifacts: Path, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autotune.cli",
            "dashboard",
            "--storage",
            str(db),
            "--port",
            str(port),
            "--artifact-dir",
            str(artifacts),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{url}/api/studies", proc)
        with sync_playwright() as p:
            browser = p.chromium.launch(
                executable_path=str(CHROMIUM),
                args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--disable-background-networking"],
            )
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1000}, device_scale_factor=1)
                page.goto(f"{url}/dashboard/studies/1")
                card = page.locator(".MuiCard-root", has_text="Pareto Front").first
                card.locator(".js-plotly-plot .scatterlayer .point").first.wait_for(timeout=60_000)
                time.sleep(1)  # plotly's legend and axes settle after the first point is drawn
                out.parent.mkdir(parents=True, exist_ok=True)
                card.screenshot(path=str(out))
            finally:
                browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", default="studies/gpt-tiny.toml", help="workload or spec (default: make demo's)")
    parser.add_argument("--trials", type=int, default=12, help="trials of the study (default 12)")
    parser.add_argument("--memory-budget", default=None, help="the study's budget (default: the spec's)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "dashboard-pareto.png")
    args = parser.parse_args()
    if not CHROMIUM.exists():
        raise SystemExit(f"no {CHROMIUM}: install Debian's chromium (apt-get install -y chromium)")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        db = run_study(root, args.study, args.trials, args.memory_budget)
        screenshot(db, root / "artifacts", args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
