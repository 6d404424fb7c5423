"""Time the README's main command and print the ratio it reports.

    python benchmarks/study_readme.py [studies/gpt-tiny.toml]

Runs ``autotune study SPEC`` in a fresh temporary directory (empty storage and cache, so nothing
is resumed or cached), then prints the wall time and the recommended configuration's throughput
per GiB relative to the PyTorch-default baseline, as the command printed it. Not run in CI.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    spec = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "studies" / "gpt-tiny.toml"
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
