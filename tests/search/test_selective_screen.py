"""The study leaves the selective recompute level out of its space on a model whose blocks run no
operation the level keeps (an LSTM), and keeps it where they do (a transformer)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from autotune import load_workload
from autotune.search.selective_screen import blocks_with_saved_ops, screen_selective
from autotune.search.spec import SpaceSpec, StudySpec
from autotune.search.study import prepare
from tests.paths import DATA
from tests.zoo import tiny_corpus


def test_a_transformer_s_blocks_run_kept_operations_and_an_lstm_s_do_not() -> None:
    assert blocks_with_saved_ops(load_workload("gpt-tiny")) == (True,) * 6
    lstm = tiny_corpus.build("lstm-lm")
    assert blocks_with_saved_ops(lstm) == (False,) * len(lstm.block_names())


def test_a_layer_at_two_block_positions_counts_at_both() -> None:
    # shared-encoder's layer 3 is layer 0: one forward per call, credited to both positions.
    shared = tiny_corpus.build("shared-encoder")
    assert blocks_with_saved_ops(shared) == (True,) * len(shared.block_names())


def test_a_model_the_fake_forward_cannot_run_concludes_nothing() -> None:
    # Its forward branches on a value (.item()): the fake pass raises, the level stays in.
    assert blocks_with_saved_ops(load_workload(f"{DATA / 'data_dependent.py'}:build")) is None


@pytest.mark.parametrize(
    ("name", "kept", "line"),
    [
        ("hf-gpt2", True, r"selective recompute kept: 2 of 2 blocks run a kept operation \(\d+\.\d s\)"),
        (
            "lstm-lm",
            False,
            r"selective recompute left out: no block runs an operation whose output it keeps \(matmul, attention, "
            r"convolution\), so it would recompute as a whole block does \(\d+\.\d s\)",
        ),
    ],
)
def test_the_study_s_space_keeps_the_level_only_where_it_keeps_something(name: str, kept: bool, line: str) -> None:
    spec = StudySpec(
        workload=tiny_corpus.reference(name), trials=1, policy_proposal=False, space=SpaceSpec(selective=True)
    )
    prepared = prepare(spec)
    assert prepared.space.selective
    said: list[str] = []
    screened = screen_selective(prepared, said.append)
    assert screened.space.selective is kept
    assert len(said) == 1 and re.fullmatch(line, said[0]), said
    assert screened.space == (prepared.space if kept else dataclasses.replace(prepared.space, selective=False))


def test_a_study_not_asked_for_the_level_is_not_screened() -> None:
    # Off by default (spec.py: the level made a 12-trial study's pick worse where measured).
    prepared = prepare(StudySpec(workload=tiny_corpus.reference("hf-gpt2"), trials=1, policy_proposal=False))
    assert not prepared.space.selective
    said: list[str] = []
    assert screen_selective(prepared, said.append) is prepared
    assert said == []
