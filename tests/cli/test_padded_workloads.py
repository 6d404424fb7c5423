"""``measure``, ``predict`` and ``train`` on a workload file with a padding collate, its dataset an
IterableDataset (``build``) or a list (``build_map_style``)."""

from __future__ import annotations

import json
import re

import pytest

from autotune.cli.main import main
from tests.paths import PADDED_WORKLOAD, ROOT

ITERABLE, MAP_STYLE = f"{PADDED_WORKLOAD}:build", f"{PADDED_WORKLOAD}:build_map_style"
#: Embedding 50 x 32, two blocks (LayerNorm 32, Linear 32 -> 64, Linear 64 -> 32), head 32 -> 50.
PARAMETER_BYTES = (50 * 32 + 2 * (2 * 32 + 32 * 64 + 64 + 64 * 32 + 32) + 32 * 50 + 50) * 4


@pytest.mark.parametrize("workload", [ITERABLE, MAP_STYLE])
def test_measure(workload: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["measure", "-w", workload, "--micro-batch", "4", "--accum", "2", "--steps", "2", "--warmup", "1", "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["workload"], data["status"], data["reason"]) == ("padded", "ok", None)
    assert data["memory"]["parameters"] == PARAMETER_BYTES
    assert data["noise"]["steps"] == 4  # every step had its two micro-batches of 4 (warmup, tracked, timed)


def test_predict_an_iterable_dataset_verified_on_its_first_padded_batch(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "-w", ITERABLE, "--micro-batch", "4", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["parameters"], data["verified"]) == (PARAMETER_BYTES, True)
    assert data["verification"]["config"]["micro_batch_size"] == 4


def test_train_an_iterable_dataset_past_its_end(capsys: pytest.CaptureFixture[str]) -> None:
    # 64 sequences in batches of 8: step 8 starts the second pass over the dataset.
    assert main(["train", ITERABLE, "--steps", "10", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert [(s["step"], s["samples"], s["config"]["micro_batch_size"]) for s in run["steps"]] == [
        (i, 8, 8) for i in range(10)
    ]


@pytest.mark.parametrize("command", ["measure", "train"])
def test_an_iterable_dataset_on_ranks_is_refused_in_one_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    workload = ["-w", ITERABLE] if command == "measure" else [ITERABLE]
    assert main([command, *workload, "--ranks", "2", "--steps", "1"]) == 2
    assert capsys.readouterr().err == (
        f"autotune {command}: error: DeepSpeed ranks shard a map-style dataset with a DistributedSampler, but "
        "workload 'padded' has an IterableDataset (Sequences), which every rank would read whole: give it as a "
        "map-style Dataset, or run one process (ranks=1).\n"
    )


VARLEN = f"{ROOT / 'tests' / 'zoo' / 'tiny_corpus.py'}:varlen_lm"


def test_predict_says_which_batch_it_predicted_at(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    worst = "worst case: scanned 8 batches (the whole epoch), longest at batch 7"
    assert main(["predict", "-w", VARLEN, "--micro-batch", "8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["worst_case"], data["verified"]) == (worst, True)
    monkeypatch.setenv("COLUMNS", "200")  # the table's note on one line
    assert main(["predict", "-w", VARLEN, "--micro-batch", "8"]) == 0
    assert re.search(f"│ batch +│ +│ {re.escape(worst)} +│", capsys.readouterr().out)
