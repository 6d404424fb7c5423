"""Which reduced precisions a study searches: screened with scripted timings (never wall-clock),
the verdict stored with the study and, when a quiet machine reached it, in the cache."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import optuna
import pytest

from autotune import TrainConfig
from autotune.errors import MeasurementFailed
from autotune.measurement.sidebyside import Retimed, Timing
from autotune.search.cache import MeasurementCache
from autotune.search.precisions import PRECISIONS_ATTR, screen_precisions
from autotune.search.spec import MeasureSpec, StudySpec
from autotune.search.study import Prepared, prepare
from tests.paths import TINY_WORKLOAD

FP32 = (100.0, 101.0, 99.0, 100.0)
LEFT_OUT_10X = (
    "bf16 left out of the search: a step of tiny in bf16 takes 10.0x the fp32 step here (side by side at "
    "micro-batch 1): recomputing activations saves more memory for less time"
)


class _ScriptedChild:
    """A measuring child whose steps all run and whose side-by-side timing of fp32 against the
    reduced precision gives ``rates`` (samples/s of each), or fails when ``rates`` is None."""

    def __init__(
        self,
        rates: tuple[float, ...] | None,
        *,
        decided: bool = True,
        other_cores: float | None = 0.0,
        meanwhile: optuna.Study | None = None,
    ) -> None:
        self.rates, self.decided, self.other_cores, self.meanwhile = rates, decided, other_cores, meanwhile
        self.timed: list[tuple[object, ...]] = []

    def measure(self, config: TrainConfig, **_: object) -> None:
        return None

    def retime(self, configs: list[TrainConfig], *, scales: list[float], timeout: float, **rounds: int) -> Retimed:
        self.timed.append((*((c.micro_batch_size, c.precision) for c in configs), rounds))
        if self.meanwhile is not None:  # another worker stores its verdict while this one times
            self.meanwhile.set_user_attr(PRECISIONS_ATTR, {"kept": ["bf16"], "notes": []})
        if self.rates is None:
            raise MeasurementFailed("RuntimeError: the child crashed")
        return Retimed(
            timings=(Timing(rates=FP32), Timing(rates=self.rates)),
            ranking=(0, 1),
            decided=self.decided,
            rounds=1,
            warmup=(2, 2),
            other_cores=self.other_cores,
        )


class _Untimed:
    """A measuring child a reused verdict must never run."""

    def measure(self, config: TrainConfig, **_: object) -> None:
        raise AssertionError(f"measured {config.describe()}: the verdict should have been reused")

    def retime(self, configs: list[TrainConfig], **_: object) -> None:
        raise AssertionError("re-timed: the verdict should have been reused")


def _prepared() -> Prepared:
    spec = StudySpec(
        workload=f"{TINY_WORKLOAD}:build",
        trials=4,
        measure=MeasureSpec(steps=2, warmup=1, threads=1, trial_timeout=60),
        policy_proposal=False,
    )
    return prepare(spec)


def _screen(
    prepared: Prepared, child: object, *, study: optuna.Study | None = None, cache: MeasurementCache | None = None
) -> tuple[Prepared, list[str], optuna.Study]:
    study = optuna.create_study() if study is None else study
    cache = MeasurementCache(None) if cache is None else cache  # an empty cache is falsy (its len)
    notes: list[str] = []
    after = screen_precisions(prepared, child, study=study, cache=cache, machine="m", note=notes.append)
    return after, notes, study


@pytest.mark.parametrize(
    ("rates", "decided", "other_cores", "kept", "note", "cached"),
    [
        # 10x slower (an AVX2 CPU's bf16 on shared-encoder): left out, and the machine remembers.
        ((10.0, 10.5, 9.5, 10.0), True, 0.0, False, LEFT_OUT_10X, True),
        # 2x: dominated (autocast halves at most the activations): left out.
        ((50.0, 50.5, 49.5, 50.0), True, 0.1, False, LEFT_OUT_10X.replace("10.0x", "2.0x"), True),
        ((60.0, 61.0, 59.0, 60.0), True, 0.0, True, None, True),  # 1.7x: kept
        ((60.0, 61.0, 59.0, 60.0), True, 1.0, True, None, False),  # 1.7x, busy: kept, decided again next time
        ((10.0, 10.5, 9.5, 10.0), False, 0.0, True, None, False),  # not separated: kept
        # 5x beside another process: load moves the ratio either way (the test model's 1.2x alone
        # was 2.9x loaded), so a busy machine cannot tell near the threshold, keeps it and says so.
        (
            (20.0, 20.5, 19.5, 20.0),
            True,
            1.2,
            True,
            "bf16 kept in the search: its step measured 5.0x the fp32 step of tiny, but other processes used "
            "1.2 cores meanwhile; a busy machine cannot tell whether it is slow here",
            False,
        ),
        # 10x on a busy machine: beyond three times the threshold, slow whatever the load; the
        # verdict holds for this study, the next one screens again.
        (
            (10.0, 10.5, 9.5, 10.0),
            True,
            1.2,
            False,
            LEFT_OUT_10X.replace("micro-batch 1)", "micro-batch 1; other processes used 1.2 cores meanwhile)"),
            False,
        ),
        (None, True, 0.0, True, None, False),  # the timing failed: kept, the trials will say
    ],
)
def test_a_precision_whose_step_is_half_as_fast_or_worse_on_a_quiet_machine_is_left_out(
    tmp_path: Path,
    rates: tuple[float, ...] | None,
    decided: bool,
    other_cores: float,
    kept: bool,
    note: str | None,
    cached: bool,
) -> None:
    prepared = _prepared()
    child = _ScriptedChild(rates, decided=decided, other_cores=other_cores)
    cache = MeasurementCache(tmp_path / "cache.db")
    after, notes, study = _screen(prepared, child, cache=cache)
    # Every block in bf16 beside fp32 at the smallest micro-batch, one round unless it must settle.
    assert child.timed == [((1, "fp32"), (1, "bf16"), {"rounds": 1, "max_rounds": 3})]
    assert after.space.low_precisions == (("bf16",) if kept else ())
    assert notes == ([note] if note else [])
    assert study.user_attrs[PRECISIONS_ATTR] == {"kept": ["bf16"] if kept else [], "notes": notes}
    if kept:
        assert after is prepared
    else:
        assert after.space == dataclasses.replace(prepared.space, low_precisions=())
    # Another study of the model on this machine: the quiet verdict is reused, anything else screened again.
    if cached:
        again, again_notes, _ = _screen(prepared, _Untimed(), cache=cache)
        assert (again.space, again_notes) == (after.space, notes)
    else:
        child = _ScriptedChild((60.0, 61.0, 59.0, 60.0))
        again, again_notes, _ = _screen(prepared, child, cache=cache)
        assert (len(child.timed), again.space.low_precisions, again_notes) == (1, ("bf16",), [])


def test_a_resumed_study_searches_the_space_it_started_with_whatever_the_load_now() -> None:
    prepared = _prepared()
    first, notes, study = _screen(prepared, _ScriptedChild((10.0, 10.5, 9.5, 10.0)))
    assert (first.space.low_precisions, notes) == ((), [LEFT_OUT_10X])
    # No cache (or another machine's worker): the study's own record decides, nothing is timed.
    resumed, resumed_notes, _ = _screen(prepared, _Untimed(), study=study)
    assert (resumed.space, resumed_notes) == (first.space, [LEFT_OUT_10X])


def test_a_worker_that_screened_beside_another_takes_the_verdict_stored_first() -> None:
    prepared = _prepared()
    study = optuna.create_study()
    child = _ScriptedChild((10.0, 10.5, 9.5, 10.0), meanwhile=study)
    after, notes, _ = _screen(prepared, child, study=study)
    assert len(child.timed) == 1  # it screened: bf16 at 10x, left out...
    # ...but the other worker's verdict was stored first: one space per study.
    assert (after.space.low_precisions, notes) == (("bf16",), [])
    assert study.user_attrs[PRECISIONS_ATTR] == {"kept": ["bf16"], "notes": []}


def test_a_model_held_in_bf16_searches_no_reduced_precision_and_times_nothing() -> None:
    import torch

    prepared = _prepared()
    prepared.workload.model.to(torch.bfloat16)
    after, notes, study = _screen(prepared, _Untimed())
    assert after.space.low_precisions == ()
    assert notes == ["bf16 left out of the search: tiny's parameters are bfloat16 already"]
    assert PRECISIONS_ATTR not in study.user_attrs  # a fact of the model, not a verdict of the machine
