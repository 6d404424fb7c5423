"""THE search for a start within the budget: its order, exact, and its first admitted."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.memory.gate import Verdict, admission
from autotune.memory.start import first_within, start_candidates


def _split(c: TrainConfig) -> tuple[int, int, object, int]:
    return (c.micro_batch_size, c.grad_accum_steps, c.checkpoint, c.zero_stage)


def test_smaller_micro_batches_then_every_block_recomputed_each_at_the_lowest_stage_first() -> None:
    default = TrainConfig(micro_batch_size=8, grad_accum_steps=1)
    assert [_split(c) for c in start_candidates(default, min_micro_batch=2)] == [
        (8, 1, False, 0),
        (4, 2, False, 0),
        (2, 4, False, 0),
        (8, 1, True, 0),
        (4, 2, True, 0),
        (2, 4, True, 0),
    ]
    on_ranks = TrainConfig(micro_batch_size=4, grad_accum_steps=1, ranks=2)
    assert [_split(c) for c in start_candidates(on_ranks, min_micro_batch=4, stages=(0, 3))] == [
        (4, 1, False, 0),
        (4, 1, False, 3),
        (4, 1, True, 0),
        (4, 1, True, 3),
    ]


def test_only_micro_batches_that_divide_the_default_s_and_no_more_accumulation_than_allowed() -> None:
    default = TrainConfig(micro_batch_size=12, grad_accum_steps=1)
    # 12, 6, 3, then 1 (3 // 2): each divides 12; 1 is past the allowed accumulation of 4.
    micro = [c.micro_batch_size for c in start_candidates(default, min_micro_batch=1, max_accum=4)]
    assert micro == [12, 6, 3, 12, 6, 3]
    # No accumulation allowed (a BatchNorm model's floor, None): the default's split only.
    assert [_split(c) for c in start_candidates(default, min_micro_batch=None)] == [(12, 1, False, 0), (12, 1, True, 0)]


def test_the_first_admitted_wins_and_the_refused_are_kept_in_order() -> None:
    default = TrainConfig(micro_batch_size=8, grad_accum_steps=1)
    peaks = {8: 900, 4: 700, 2: 500}

    def check(c: TrainConfig) -> Verdict:
        return admission(budget=600, headroom=0.0, measured=peaks[c.micro_batch_size])

    found, refused = first_within(start_candidates(default, min_micro_batch=1), check)
    assert found is not None and _split(found[0]) == (2, 4, False, 0)
    assert found[1].reason == "measured 500 B <= budget 600 B"
    assert [v.measured for v in refused] == [900, 700]
    none, all_refused = first_within(start_candidates(default, min_micro_batch=4), check)
    assert none is None and [v.measured for v in all_refused] == [900, 700, 900, 700]
