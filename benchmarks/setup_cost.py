"""What a study costs before its first trial: seconds per setup phase and the host's peak memory,
for GPT-2-shaped decoders of 10M, 100M and 350M parameters at sequence 1024.

Each size runs ``autotune study REF --create-only --no-progress`` in a fresh process (everything a
study does before it measures: loading, the block ranking, the budget, the memory model's fake
profile and its checks, the baselines, the policy's proposal), reading the setup lines the
command prints (one per phase, each with its seconds) and the child's peak resident memory.

Run (nothing else on the machine; minutes):

    python benchmarks/setup_cost.py --out build/setup-cost [--sizes 10m,100m,350m] [--device cpu]

Writes ``setup_cost.json`` and ``setup_cost.md`` to ``--out``, rewritten after each size, and with
``--result docs/results/setup-cost.json`` the results page's record of the sizes that ran
(``benchmarks/results.py``; then ``python benchmarks/render_results.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve()

# GPT-2 shapes (transformers GPT2LMHeadModel, the corpus' hf-gpt2 builder) at sequence 1024 and
# batch 32: "100m" is GPT-2 small (124M with the 50257-token vocabulary), "350m" GPT-2 medium.
SIZES: dict[str, dict[str, int]] = {
    "10m": {"layers": 6, "width": 320, "heads": 5, "vocab": 8192},
    "100m": {"layers": 12, "width": 768, "heads": 12, "vocab": 50256},
    "350m": {"layers": 24, "width": 1024, "heads": 16, "vocab": 50256},
}
COMMON = {"seq_len": 1024, "num_samples": 64, "batch_size": 32}


def build_10m() -> Any:
    return _build("10m")


def build_100m() -> Any:
    return _build("100m")


def build_350m() -> Any:
    return _build("350m")


def _build(size: str) -> Any:
    from autotune.zoo import CORPUS

    return CORPUS["hf-gpt2"].build(**SIZES[size], **COMMON)


def run_size(size: str, *, device: str, budget: str, timeout: float) -> dict[str, Any]:
    """One size's setup in a fresh ``autotune`` process: its phases, seconds and peak RSS."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            sys.executable,
            "-m",
            "autotune.cli",
            "study",
            f"{SCRIPT}:build_{size}",
            "--create-only",
            "--no-progress",
            "--memory-budget",
            budget,
            "--device",
            device,
            "--storage",
            f"sqlite:///{tmp}/setup.db",
            "--cache",
            f"{tmp}/cache.db",
        ]
        start = time.perf_counter()
        try:
            proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=tmp)
        except subprocess.TimeoutExpired:
            return {"size": size, "ok": False, "error": f"timed out after {timeout:g} s"}
        seconds = time.perf_counter() - start
    # ru_maxrss of the largest child waited for so far, in KiB on Linux: sizes run in increasing order.
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    phases = [_phase(line) for line in proc.stderr.splitlines() if re.search(r"\d+\.\d s\)$", line)]
    return {
        "size": size,
        "ok": proc.returncode == 0,
        "seconds": round(seconds, 1),
        "peak_rss_bytes": rss,
        "phases": phases,
        "stderr_tail": proc.stderr.splitlines()[-3:] if proc.returncode else [],
    }


def _phase(line: str) -> dict[str, Any]:
    found = re.search(r"(\d+\.\d) s\)$", line)
    assert found is not None
    return {"line": line, "seconds": float(found.group(1))}


def _params(size: str) -> int:
    return _build(size).num_parameters


def write(out: Path, machine: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    (out / "setup_cost.json").write_text(json.dumps({"machine": machine, "sizes": rows}, indent=2) + "\n")
    lines = [
        f"# Study setup cost ({machine['date']}, {machine['cpu']}, torch capability {machine['capability']}, "
        f"device {machine['device']})",
        "",
        "| size | parameters | setup s | peak RSS GiB | slowest phases |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        if not r["ok"]:
            lines.append(
                f"| {r['size']} | {r.get('parameters', '-')} | failed | - | {r.get('error') or r['stderr_tail']} |"
            )
            continue
        slow = sorted(r["phases"], key=lambda p: -p["seconds"])[:3]
        cells = "; ".join(p["line"] for p in slow)
        lines.append(
            f"| {r['size']} | {r['parameters']:,} | {r['seconds']} | {r['peak_rss_bytes'] / 2**30:.2f} | {cells} |"
        )
    (out / "setup_cost.md").write_text("\n".join(lines) + "\n")


def write_record(path: Path, machine: dict[str, Any], rows: list[dict[str, Any]], command: str) -> None:
    """The results page's record of the sizes that ran (``benchmarks/results.py``)."""
    from results import write_result

    device = "CPU" if machine["device"] == "cpu" else f"device {machine['device']}"
    write_result(
        path,
        title="What a study costs before its first trial",
        claim=(
            "The study's setup (loading, the block ranking, the budget, the measuring process, the baselines, the "
            "proposal's room check; the memory model's fake-tensor profile is taken when the first measured trial "
            "checks its kind) for GPT-2-shaped decoders (transformers `GPT2LMHeadModel`, sequence 1024, batch 32), "
            "from the setup lines the study prints, and the study process's peak resident memory."
        ),
        machine=f"{machine['cpu']}, {machine['cores']} cores; the study's device: {device}",
        capability=f"CPU `{machine['capability']}`",
        date=machine["date"],
        command=command,
        columns=("model", "parameters", "setup, s", "host peak RSS, GiB"),
        rows=[
            (
                f"{r['size']} ({SIZES[r['size']]['layers']} x {SIZES[r['size']]['width']})",
                f"{r['parameters']:,}",
                r["seconds"],
                f"{r['peak_rss_bytes'] / 2**30:.2f}",
            )
            for r in rows
            if r["ok"]
        ],
        note=(
            "A setup cost has no PyTorch default or Hugging Face recipe to stand beside. Earlier setups (memory "
            "check steps before the first trial, then the two fake profiles of the baselines' predictions) are in "
            "the [benchmark log](benchmark-log.md#a-studys-setup-at-real-size-cpu-2026-11-28)."
        ),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--result", type=Path, help="also write the results page's record here (docs/results/)")
    parser.add_argument("--sizes", default=",".join(SIZES))
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--memory-budget", default="20GiB")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds allowed per size")
    args = parser.parse_args(argv)
    import torch
    from results import cpu_name

    sizes = args.sizes.split(",")
    unknown = sorted(set(sizes) - set(SIZES))
    if unknown:
        parser.error(f"unknown size {unknown[0]!r} (sizes: {', '.join(SIZES)})")
    args.out.mkdir(parents=True, exist_ok=True)
    machine = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_name(),
        "capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "device": args.device,
    }
    rows = []
    for size in sizes:
        row = run_size(size, device=args.device, budget=args.memory_budget, timeout=args.timeout)
        row["parameters"] = _params(size)
        rows.append(row)
        print(f"{size}: {'ok' if row['ok'] else 'FAILED'} {row.get('seconds', '-')} s", flush=True)
        write(args.out, machine, rows)
    if args.result is not None:
        from results import command_line

        command = command_line(__file__, argv)
        write_record(args.result, machine, rows, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
