"""An adaptive run over a whole epoch of variable-length batches under a budget between the short
and the long batch's peak never exceeds it; the budget check on the first batch alone would have.

varlen-lm at its tiny size (tests/memory/test_worst_case.py): 8 batches of 8 padded sequences, the
first 7 padded to 13-16 tokens, the last to 32. Every step is tracked (exact MemTracker bytes):
the test forgets the gate's measurements before each one, so each is measured again. Step 0 is not
tracked (Adam creates its state after the activation peak) and is a short batch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from autotune import Adaptive, TrainConfig, Workload
from autotune.adapt.shape_guard import ShapeGuard, splits
from autotune.memory.gate import BudgetGate, Verdict
from autotune.units import MemoryBudget
from autotune.zoo import CORPUS

#: Between the short batches' peak (963508 B at 8 x 1) and the long one's (1626164 B).
BUDGET = 1_300_000
DEFAULT = TrainConfig(micro_batch_size=8, grad_clip=None)  # Adaptive's default: no clipping
#: Exact tracked peaks of the epoch's steps 1-7 at 8 x 1 (padded lengths 16, 16, 15, 16, 13, 15 | 32).
SHORT_PEAKS = [963508, 963508, 922092, 963508, 839260, 922092]
LONG_AT_8 = 1626164
LONG_AT_4 = 1098392  # the long batch split in two micro-batches of 4


def _varlen() -> Workload:
    entry = CORPUS["varlen-lm"]
    return entry.build(**entry.tiny)


class _Stream(IterableDataset[torch.Tensor]):
    """The same sequences as an IterableDataset: its worst case is its first batch only."""

    def __init__(self, dataset: Dataset[torch.Tensor]) -> None:
        self.dataset = dataset

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (self.dataset[i] for i in range(len(self.dataset)))  # type: ignore[arg-type]


def _epoch(dataset: Any, budget: int) -> tuple[Adaptive, list[tuple[int, int, int | None]]]:
    """An adaptive run (no decision source) over one epoch of the user's own padded batches, in
    order; per step (padded length, micro-batch size, tracked peak)."""
    wl = _varlen()
    opt = torch.optim.AdamW(wl.model.parameters(), lr=1e-3)
    run = Adaptive(
        wl.model,
        opt,
        wl.loss_fn,
        dataset if dataset is not None else wl.dataset,
        batch_size=8,
        collate_fn=wl.collate_fn,
        memory_budget=budget,
        policy=None,
        track_memory="all",
    )
    steps = []
    for batch in wl.loader(8):
        run.gate.measured.clear()  # every step tracked, not only each configuration's first
        record = run.step(batch)
        steps.append((batch["input_ids"].shape[1], record.config.micro_batch_size, record.peak_bytes))
    return run, steps


def test_the_long_batch_alone_is_over_the_budget_at_the_default() -> None:
    _, steps = _epoch(None, 10**9)
    lengths = [16, 16, 15, 16, 13, 15]
    assert steps == [(16, 8, None), *((n, 8, p) for n, p in zip(lengths, SHORT_PEAKS, strict=True)), (32, 8, LONG_AT_8)]
    assert max(SHORT_PEAKS) < BUDGET < LONG_AT_8


def test_the_budget_check_on_the_first_batch_alone_admits_the_default_that_the_long_batch_exceeds() -> None:
    first_only = dataclasses.replace(_varlen(), scan_batches=0)
    gate = BudgetGate.build(first_only, MemoryBudget(bytes=BUDGET), DEFAULT, reduced_precision=False)
    verdict = gate.admits(DEFAULT)
    assert verdict.admitted
    assert verdict.predicted is not None and verdict.predicted < LONG_AT_8 - 600_000  # blind to the last batch
    assert LONG_AT_8 > BUDGET  # what the default then measures on the last batch (test above)


def test_a_run_at_the_scanned_worst_case_never_exceeds_the_budget_over_the_epoch() -> None:
    run, steps = _epoch(None, BUDGET)
    assert run.gate.profile is not None
    assert run.gate.profile.worst_case == "worst case: scanned 8 batches (the whole epoch), longest at batch 7"
    assert [micro for _, micro, _ in steps] == [4] * 8  # split from the start: the gate knew the long batch
    peaks = [p for _, _, p in steps[1:]]
    assert peaks[-1] == LONG_AT_4
    assert all(p is not None and p <= BUDGET for p in peaks), peaks
    assert run.over_budget_steps == ()
    assert [c.source for c in run.history] == ["budget"]


def test_the_guard_splits_the_long_batch_of_a_stream_before_it_runs() -> None:
    run, steps = _epoch(_Stream(_varlen().dataset), BUDGET)
    assert [micro for _, micro, _ in steps] == [8] * 7 + [4]
    peaks = [p for _, _, p in steps[1:]]
    assert peaks == [*SHORT_PEAKS, LONG_AT_4]
    assert all(p is not None and p <= BUDGET for p in peaks)
    assert run.over_budget_steps == ()
    (change,) = run.history
    assert (change.step, change.source, change.applied) == (7, "shape guard", True)
    assert (change.before, change.after) == (
        DEFAULT,
        dataclasses.replace(DEFAULT, micro_batch_size=4, grad_accum_steps=2),
    )
    assert change.reason == (
        "the batch of step 7 has 512 B per sample, more than any predicted before (256 B): "
        f"{DEFAULT.describe()} at its shape: predicted 1630256 B (+2% headroom) > budget {BUDGET} B; "
        f"split: predicted 1100432 B (+2% headroom) <= budget {BUDGET} B"
    )
    assert run.gate.profile is not None
    assert run.gate.profile.worst_case == "worst case: declared (Workload.worst_case_batch)"


def test_splits_try_smaller_micro_batches_then_recompute() -> None:
    config = TrainConfig(micro_batch_size=4, grad_accum_steps=3)
    assert [(c.micro_batch_size, c.grad_accum_steps, c.checkpoint) for c in splits(config)] == [
        (3, 4, False),
        (2, 6, False),
        (1, 12, False),
        (4, 3, True),
        (3, 4, True),
        (2, 6, True),
        (1, 12, True),
    ]


class _NothingFits:
    """A gate whose every verdict is over the budget (a budget below any split of the long batch)."""

    device_type = "cpu"

    def __init__(self) -> None:
        self.profiles: list[object] = []

    def replace_profile(self, profile: object, *, unprofiled: str | None = None) -> None:
        self.profiles.append(profile)

    def admits(self, config: TrainConfig) -> Verdict:
        return Verdict(admitted=False, reason="predicted 9 B (+2% headroom) > budget 1 B", predicted=9, measured=None)


def test_a_long_batch_no_split_fits_is_logged_refused_and_a_batch_seen_is_not_checked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("autotune.memory.gate.profile_or_reason", lambda workload, **kw: (None, "no profile"))
    wl, gate = dataclasses.replace(_varlen(), scan_batches=0), _NothingFits()
    guard = ShapeGuard(wl, gate, reduced_precision=False)  # type: ignore[arg-type]
    long = list(wl.loader(8))[-1]
    assert guard.before(wl.first_batch(8), DEFAULT, 0) is None  # no larger than the first batch
    change = guard.before(long, DEFAULT, 7)
    assert change is not None
    assert (change.applied, change.before, change.after, change.predicted_bytes) == (False, DEFAULT, DEFAULT, 9)
    assert change.reason == (
        "the batch of step 7 has 512 B per sample, more than any predicted before (256 B): predicted 9 B "
        "(+2% headroom) > budget 1 B, and no split of the batch fits: it runs as it is"
    )
    assert gate.profiles == [None]
    assert guard.before(long, DEFAULT, 8) is None  # the largest seen now: not profiled again
    assert gate.profiles == [None]


@pytest.mark.parametrize(
    ("outers", "outer", "others"), [(("fp32",), "fp32", ()), (("bf16", "fp32"), "bf16", ("fp32",))]
)
def test_a_long_batch_is_profiled_with_the_gate_s_outer_precisions(
    monkeypatch: pytest.MonkeyPatch, outers: tuple[str, ...], outer: str, others: tuple[str, ...]
) -> None:
    asked: list[dict[str, Any]] = []

    def profile_or_reason(workload: Workload, **kw: Any) -> tuple[None, str]:
        asked.append(kw)
        return None, "no profile"

    monkeypatch.setattr("autotune.memory.gate.profile_or_reason", profile_or_reason)
    wl = dataclasses.replace(_varlen(), scan_batches=0)
    guard = ShapeGuard(wl, _NothingFits(), reduced_precision=True, selective=True, outers=outers)  # type: ignore[arg-type]
    guard.before(list(wl.loader(8))[-1], DEFAULT, 7)
    assert [(kw["outer"], kw["outers"], kw["selective"], kw["reduced_precision"]) for kw in asked] == [
        (outer, others, True, True)
    ]


def test_a_resumed_run_keeps_the_largest_shape_and_does_not_profile_it_again(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, _ = _epoch(_Stream(_varlen().dataset), BUDGET)  # the guard saw the long batch at step 7
    assert run.guard.largest == 512
    path = tmp_path / "tuner.pt"
    torch.save(run.state_dict(), path)
    run.close()
    state = torch.load(path, weights_only=True)  # plain values and tensors
    assert state["version"] == 3 and state["shape_guard"]["largest"] == 512

    wl = _varlen()
    fresh = Adaptive(
        wl.model,
        torch.optim.AdamW(wl.model.parameters(), lr=1e-3),
        wl.loss_fn,
        _Stream(wl.dataset),
        batch_size=8,
        collate_fn=wl.collate_fn,
        memory_budget=BUDGET,
        policy=None,
        track_memory="all",
    )
    fresh.load_state_dict(state)  # the gate profiled at the long shape here, once
    assert fresh.guard.largest == 512
    # What the saved run's gate predicted at that shape (the guard's split reason, test above).
    assert fresh.gate.predict(DEFAULT) == (1630256, True)
    assert fresh.config == dataclasses.replace(DEFAULT, micro_batch_size=4, grad_accum_steps=2)
    assert fresh.guard.batch["input_ids"].shape == (8, 32)
    profiles = []
    monkeypatch.setattr(ShapeGuard, "_reprofile", lambda self, batch: profiles.append(batch))
    long_batch = list(wl.loader(8))[-1]
    assert long_batch["input_ids"].shape[1] == 32
    split = dataclasses.replace(DEFAULT, micro_batch_size=4, grad_accum_steps=2)
    record = fresh.step(long_batch)
    assert profiles == [] and record.config == split  # not profiled again, not split again
    # The saved run's last measurement (its long batch at 4 x 2) stands: not tracked again.
    assert record.peak_bytes is None and fresh.gate.measured == {split: LONG_AT_4}
    assert [c.source for c in fresh.history] == ["shape guard"]  # the saved run's, nothing new
    fresh.close()
