"""The benchmarks' result records: one JSON file per claim under ``docs/results/``.

A record is what the results page (docs/benchmarks.md) shows of one claim: its table, the machine
and CPU capability (or GPU) it ran on, the date, the commit and the command. The benchmark scripts
write one with ``--result PATH`` (:func:`write_result`); ``benchmarks/render_results.py`` renders
the page and its charts from the records, and a test fails when the page differs from that
rendering, so the figures and the text cannot drift apart.

Cells are kept as the text the table shows ("0.97", "16x1, ckpt all"): a record transcribed from a
run's own table keeps its figures exactly as that run printed them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = ROOT / "docs" / "results"
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_COMMIT = re.compile(r"^[0-9a-f]{7,40}(\+dirty)?$")
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


class ResultError(ValueError):
    """A record that breaks a rule of the format (the message names the rule and the value)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Chart:
    """A bar chart of one record: each group's series relative to its baseline series.

    Attributes:
        group: the column whose values are the chart's groups (a model).
        series: the column whose values are the bars within a group (a variant).
        value: the column of the bars' values (a number, e.g. samples/s per GiB).
        baseline: the series every bar of a group is divided by (the PyTorch default).
        shown: the series drawn, in this order (the baseline among them).
    """

    group: str
    series: str
    value: str
    baseline: str
    shown: tuple[str, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Result:
    """One claim of the results page.

    Attributes:
        name: the file's stem (``docs/results/NAME.json``), lower-case words joined by ``-``.
        title: the section's heading.
        claim: what the table shows, in a sentence or two.
        machine: the hardware: CPU model or GPU, cores, threads, what else ran.
        capability: ``torch.backends.cpu.get_cpu_capability()`` (and its bf16 units), or the GPU.
        date: the day it was measured, ``YYYY-MM-DD``.
        commit: the commit measured (short hash; ``+dirty`` when the tree had changes).
        command: the command that produced the table, from the repository's root.
        columns: the table's header.
        rows: the table's cells, as text, one tuple per row.
        note: what the table needs said beside it (a missing baseline, a run stopped part way).
        chart: the chart drawn from the table, if any.
    """

    name: str
    title: str
    claim: str
    machine: str
    capability: str
    date: str
    commit: str
    command: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""
    chart: Chart | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ResultError(f"Result.name must be lower-case words joined by '-', but got {self.name!r}.")
        if not _DATE.match(self.date):
            raise ResultError(f"Result.date must be YYYY-MM-DD, but got {self.date!r}.")
        if not _COMMIT.match(self.commit):
            raise ResultError(f"Result.commit must be a hexadecimal commit hash, but got {self.commit!r}.")
        if not self.columns:
            raise ResultError("Result.columns must name at least one column, but got none.")
        for i, row in enumerate(self.rows):
            if len(row) != len(self.columns):
                raise ResultError(
                    f"Result.rows[{i}] must have one cell per column ({len(self.columns)}), but got {len(row)}."
                )
        if self.chart is not None:
            missing = [c for c in (self.chart.group, self.chart.series, self.chart.value) if c not in self.columns]
            if missing:
                raise ResultError(f"Result.chart must name columns of the table, but got {missing[0]!r}.")
            if self.chart.baseline not in self.chart.shown:
                raise ResultError(f"Result.chart.shown must include its baseline, but got {list(self.chart.shown)}.")

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON values (tuples as lists)."""
        data: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(self)))
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Result:
        """The record of :meth:`to_dict`'s output."""
        chart = data.get("chart")
        return cls(
            **{k: v for k, v in data.items() if k not in ("columns", "rows", "chart")},
            columns=tuple(data["columns"]),
            rows=tuple(tuple(row) for row in data["rows"]),
            chart=None if chart is None else Chart(**{**chart, "shown": tuple(chart["shown"])}),
        )


def current_commit() -> str:
    """The short hash of the checkout's HEAD, ``+dirty`` when tracked files have changes."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    return head.stdout.strip() + ("+dirty" if dirty else "")


# The environment variables that change what a run measures (torch's threads, an emulated CPU):
# a command names those set, before ``python``, so that it reproduces the run.
RUN_ENVIRONMENT = ("OMP_NUM_THREADS", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def command_line(script: str, argv: Sequence[str] | None, environ: Mapping[str, str] | None = None) -> str:
    """The command a record names: ``python benchmarks/SCRIPT`` with the arguments the run got
    (``argv``, or this process's own when None), after the variables of :data:`RUN_ENVIRONMENT`
    set in ``environ`` (this process's environment when None), so the record says how to reproduce it."""
    import sys

    env = os.environ if environ is None else environ
    assignments = [f"{name}={env[name]}" for name in RUN_ENVIRONMENT if name in env]
    arguments = sys.argv[1:] if argv is None else argv
    return " ".join([*assignments, "python", f"benchmarks/{Path(script).name}", *arguments])


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table's lines: the header, its rule and one line per row (a ``|`` inside a cell
    escaped, as in a configuration's description)."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    return [line(columns), "|" + "---|" * len(columns), *(line(r) for r in rows)]


def corpus_models(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The corpus models a ``--models a,b`` argument names, in its order; an unknown one is the
    parser's error (one line, exit 2)."""
    from autotune.zoo import CORPUS

    models = text.split(",")
    unknown = [m for m in models if m not in CORPUS]
    if unknown:
        parser.error(f"--models must be corpus models ({', '.join(CORPUS)}), but got {unknown[0]!r}")
    return models


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what the platform says: the machine field
    of a record names the processor, not just its architecture."""
    import platform

    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bf16_units() -> tuple[str, ...]:
    """The CPU's bf16 instruction sets (``avx512_bf16``, ``amx_bf16``) from ``/proc/cpuinfo``'s
    flags: torch's capability (``AVX512``) does not say whether bf16 is native, and it decides
    which precision is fast."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return tuple(sorted(f for f in line.split(":", 1)[1].split() if f.endswith("bf16")))
    except OSError:
        pass
    return ()


def cpu_machine() -> dict[str, Any]:
    """What a CPU record says of the machine it ran on, taken now (after the script set torch's
    threads): the date, the CPU, its cores, torch's threads and version, its capability and bf16
    units. :func:`machine_fields` turns it into the record's fields."""
    import torch

    return {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_units": list(bf16_units()),
    }


class MachineFields(TypedDict):
    """A record's ``machine``, ``capability`` and ``date``, as :func:`write_result` takes them."""

    machine: str
    capability: str
    date: str


def machine_fields(machine: dict[str, Any]) -> MachineFields:
    """The ``machine``, ``capability`` and ``date`` of a record from :func:`cpu_machine`'s values,
    e.g. ``AMD EPYC 7B13, 2 cores, 1 torch thread; torch 2.13.0+cpu`` and ``CPU `AVX512` (avx512_bf16)``."""
    threads = machine["threads"]
    units = machine["bf16_units"]
    return {
        "machine": (
            f"{machine['cpu']}, {machine['cores']} cores, {threads} torch thread{'s' * (threads != 1)}; "
            f"torch {machine['torch']}"
        ),
        "capability": f"CPU `{machine['capability']}`" + (f" ({', '.join(units)})" if units else " (no bf16 units)"),
        "date": machine["date"],
    }


def write_result(
    path: Path,
    *,
    title: str,
    claim: str,
    machine: str,
    capability: str,
    date: str,
    command: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    note: str = "",
    chart: Chart | None = None,
    commit: str | None = None,
) -> Result:
    """Write one record to ``path`` (its stem is the record's name) and return it.

    Args:
        path: where the JSON goes, e.g. ``docs/results/setup-cost.json``.
        title, claim, machine, capability, date, command, note, chart: as :class:`Result`'s.
        columns: the table's header.
        rows: the table's cells; each is written as ``str(cell)``, so format numbers as the
            script's own table does before passing them.
        commit: the commit measured; by default the checkout's (:func:`current_commit`).

    Returns:
        The record written.

    Raises:
        ResultError: a field breaks the format (see :class:`Result`).
    """
    result = Result(
        name=path.stem,
        title=title,
        claim=claim,
        machine=machine,
        capability=capability,
        date=date,
        commit=current_commit() if commit is None else commit,
        command=command,
        columns=tuple(columns),
        rows=tuple(tuple(str(cell) for cell in row) for row in rows),
        note=note,
        chart=chart,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(result))
    return result


def dumps(result: Result) -> str:
    """The record's JSON text: two-space indents, one line per row of the table (diffs show rows)."""
    data = result.to_dict()
    rows = data.pop("rows")
    chart = data.pop("chart")
    head = json.dumps(data, indent=2, ensure_ascii=False)[: -len("\n}")]
    lines = ",\n".join("    " + json.dumps(row, ensure_ascii=False) for row in rows)
    return f'{head},\n  "rows": [\n{lines}\n  ],\n  "chart": {json.dumps(chart, ensure_ascii=False)}\n}}\n'


def load_results(directory: Path = RESULTS_DIR) -> list[Result]:
    """Every record in ``directory``, in the order its ``order.json`` lists their names."""
    order = json.loads((directory / "order.json").read_text())
    found = {p.stem for p in directory.glob("*.json")} - {"order"}
    if set(order) != found:
        raise ResultError(
            f"{directory}/order.json must list every record once, but got {sorted(order)} for {sorted(found)}."
        )
    return [Result.from_dict(json.loads((directory / f"{name}.json").read_text())) for name in order]
