"""The conformance matrix at the corpus's built-in sizes: every command on every real model.

The test suite runs the same matrix at tiny sizes (tests/zoo/test_conformance.py,
tests/zoo/test_corpus.py). Here each corpus model runs at the size ``autotune workloads`` lists,
through the CLI in a child process as a user types it:

- ``measure`` twice (micro-batch 8): the tracked peak must repeat to the byte;
- ``predict`` of the same configuration against that measured peak, and whether it was verified;
- ``study`` for ``--trials`` trials (the two baselines first) with the measurement cache, then
  ``best --format json|deepspeed|python`` and the Python snippet's ``apply()`` on a fresh model;
- ``tune`` for two steps with the shipped policy.

A cell is the command's wall time, or what went wrong. Prints a markdown table with the CPU's
capability (``torch.backends.cpu.get_cpu_capability()``): timings are for orientation only.

Run: python benchmarks/conformance.py [--workloads hf-gpt2,lstm-lm] [--trials 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from autotune import TrainConfig
from autotune.zoo import CORPUS

_ENV = {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
_MEASURE = ("--steps", "2", "--warmup", "1")


def _run(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args], cwd=cwd, env=_ENV, capture_output=True, text=True
    )
    return proc, time.monotonic() - start


def _fail(proc: subprocess.CompletedProcess[str]) -> str:
    lines = (proc.stderr or proc.stdout).strip().splitlines()
    return f"exit {proc.returncode}: {lines[-1][:80] if lines else ''}"


def _row(name: str, trials: int, cwd: Path) -> list[str]:
    cells = [name]
    flags = ("--workload", name, "--micro-batch", "8", "--json")
    a, t1 = _run("measure", *flags, *_MEASURE, cwd=cwd)
    b, _ = _run("measure", *flags, *_MEASURE, cwd=cwd)
    if a.returncode or b.returncode:
        return [*cells, _fail(a if a.returncode else b), "-", "-", "-", "-"]
    ma, mb = json.loads(a.stdout), json.loads(b.stdout)
    measured = sum(ma["memory"].values())
    cells.append(f"{'exact' if ma['memory'] == mb['memory'] else 'DIFFERS'} ({t1:.0f} s)")
    p, t = _run("predict", "--workload", name, "--micro-batch", "8", "--json", cwd=cwd)
    if p.returncode:
        cells.append(_fail(p))
    else:
        est = json.loads(p.stdout)
        error = (est["total"] - measured) / measured
        cells.append(f"{error:+.2%}, {'verified' if est['verified'] else 'UNVERIFIED'} ({t:.0f} s)")
    storage = f"sqlite:///{cwd / 'studies.db'}"
    s, t = _run("study", name, "--trials", str(trials), "--no-progress", "--storage", storage, *_MEASURE, cwd=cwd)
    cells.append(f"{trials} trials ({t:.0f} s)" if s.returncode == 0 else _fail(s))
    exports = []
    for fmt in ("json", "deepspeed", "python"):
        e, _ = _run("best", name, "--storage", storage, "--format", fmt, cwd=cwd)
        exports.append(fmt if e.returncode == 0 else f"{fmt}: {_fail(e)}")
        if fmt == "python" and e.returncode == 0:
            exports.append(_apply(name, e.stdout))
    cells.append(", ".join(exports))
    u, t = _run("tune", name, "--steps", "2", "--memory-budget", "75%", cwd=cwd)
    cells.append(f"ok ({t:.0f} s)" if u.returncode == 0 else _fail(u))
    return cells


def _apply(name: str, snippet: str) -> str:
    """Run the exported ``apply()`` on a fresh model: one forward/backward, then remove it."""
    namespace: dict[str, object] = {}
    exec(compile(snippet, "best.py", "exec"), namespace)
    workload = CORPUS[name].build()
    config = namespace["CONFIG"]
    assert isinstance(config, TrainConfig)
    handle = namespace["apply"](workload.model)  # type: ignore[operator]
    batch = torch.utils.data.default_collate([workload.dataset[i] for i in range(config.micro_batch_size)])
    loss = workload.loss_fn(workload.model, batch)
    loss.backward()
    handle.remove()
    return f"apply() loss {loss.item():.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(CORPUS), help="corpus names (default: all)")
    parser.add_argument("--trials", type=int, default=4, help="study trials per model (default 4)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}, 1 thread\n")
    print("| model | measure x2: memory | predict vs measured | study | best exports | tune 2 steps |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.workloads.split(","):
            print("| " + " | ".join(_row(name, args.trials, Path(tmp))) + " |", flush=True)


if __name__ == "__main__":
    main()
