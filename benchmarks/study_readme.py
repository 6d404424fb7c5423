"""Time the README's main command and print the ratio it reports.

    python benchmarks/study_readme.py [studies/gpt-tiny.toml] [--result docs/results/study-readme.json]

Runs ``autotune study SPEC`` in a fresh temporary directory (empty storage and cache, so nothing
is resumed or cached), then prints the wall time and the recommended configuration's throughput
per GiB relative to the PyTorch-default baseline, as the command printed it; with ``--result``, also
the results page's record of it (``benchmarks/results.py``; then ``render_results.py``). Not run in CI.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_record(path: Path, *, spec: str, seconds: float, recommended: str, ratio: str, command: str) -> None:
    """The results page's record of one run (``benchmarks/results.py``)."""
    import platform

    import torch
    from results import write_result

    write_result(
        path,
        title="The README's study, as `make demo` runs it",
        claim=(
            f"`autotune study {spec}` in a fresh directory (no storage, no cache): its wall time, its recommendation "
            "and the recommendation's throughput per GiB over the PyTorch default's, as the command printed them "
            "(the two side by side in the study's own re-timing)."
        ),
        machine=f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{torch.get_num_threads()} torch threads",
        capability=f"CPU `{torch.backends.cpu.get_cpu_capability()}`",
        date=datetime.date.today().isoformat(),
        command=command,
        columns=("spec", "wall time, s", "recommended", "recommended / PyTorch default, per GiB"),
        rows=[(spec, f"{seconds:.0f}", recommended, f"{ratio}x")],
        note="The study's baselines include a seed recipe; the Hugging Face recipe is not among them.",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, nargs="?", default=ROOT / "studies" / "gpt-tiny.toml")
    parser.add_argument("--result", type=Path, help="also write the results page's record here (docs/results/)")
    args = parser.parse_args(argv)
    spec: Path = args.spec
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "studies").mkdir()
        shutil.copy(spec, Path(tmp) / "studies" / spec.name)
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "autotune.cli", "study", f"studies/{spec.name}", "--no-progress"],
            cwd=tmp,
            capture_output=True,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        seconds = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return proc.returncode
    text = " ".join(proc.stdout.split())
    ratio = re.search(r"\(([0-9.]+)x the PyTorch default per GiB\)", text)
    line = re.search(r"recommended: .*?per GiB", text)
    print(f"command: autotune study studies/{spec.name}")
    print(f"wall time: {seconds:.0f} s")
    print(line.group(0) if line else "no recommendation printed")
    print(f"recommended / PyTorch default, throughput per GiB: {ratio.group(1) if ratio else '-'}x")
    if args.result is not None and line and ratio:
        from results import command_line

        command = command_line(__file__, argv)
        recommended = line.group(0).removeprefix("recommended: ")
        write_record(
            args.result, spec=f"studies/{spec.name}", seconds=seconds, recommended=recommended, ratio=ratio.group(1),
            command=command,
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
