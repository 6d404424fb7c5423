"""``autotune.policies.tune.tune``: the ``tune`` command's flow as one function (the command and
the picks benchmark both call it), on a real training loop."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from autotune.policies.episode import FINALISTS
from autotune.policies.ppo import PRETRAINED_DIR, load_policy
from autotune.policies.tune import tune

from autotune.errors import ConfigError
from autotune.resolve import load_workload
from autotune.search.baselines import HF_BF16, HF_RECIPE, PYTORCH_DEFAULT
from tests.paths import DATA, TINY_WORKLOAD

TINY = f"{TINY_WORKLOAD}:build"

#: The lines ``tune`` says before, and after, its episode on the tiny workload (no fine-tuning).
TUNE_PHASES = [
    "blocks ranked by the activation bytes they save",
    "training loop ready",
    "memory model",
    "memory check fp32 on cpu",
    "memory check recomputed on cpu",
    "memory model",
    "memory check bf16 on cpu",
    "machine probed",
    "step 0 (start)",
    "step 1 (policy)",
    "step 2 (",  # the policy's, or the climb's (below)
    "baseline pytorch-default measured",
    "baseline hf-recipe measured",
    "best steps and baselines re-timed side by side",
]


def test_tune_runs_one_episode_and_names_the_knobs_it_ended_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.measurement import sidebyside

    workload = load_workload(f"{TINY_WORKLOAD}:build")
    shown: list[str] = []
    retimed: list[list[Any]] = []  # the configurations of each side-by-side run (the real one runs)

    def retime_configs(workload: Any, configs: Any, **kwargs: Any) -> Any:
        retimed.append(list(configs))
        return real_retime(workload, configs, **kwargs)

    real_retime = sidebyside.retime_configs
    monkeypatch.setattr(sidebyside, "retime_configs", retime_configs)

    @contextmanager
    def status(message: str) -> Iterator[None]:
        shown.append(message)
        yield

    notes: list[str] = []
    tuned = tune(
        workload,
        load_policy(PRETRAINED_DIR),
        steps=2,
        steps_per_action=2,
        fine_tune_seconds=0,
        status=status,
        note=notes.append,
    )
    episode = tuned.episode
    assert [s.step for s in episode.steps] == [0, 1, 2]
    assert [s.source for s in episode.steps] in ([None, "policy", "climb"], [None, "policy", "policy"])
    assert episode.workload == workload.name
    # The default budget, 75% of the default's peak measured on the loop, is below the default
    # (16x1): the episode starts where an adaptive run would, at the first smaller micro-batch within it.
    assert episode.steps[0].knobs == "8x2" and episode.steps[0].peak_bytes <= episode.budget_bytes
    assert tuned.final_knobs.describe() == episode.steps[-1].knobs
    # No fine-tuning asked for; the baselines after the episode.
    assert shown == [
        "measuring the baseline pytorch-default",
        "measuring the baseline hf-recipe",
        "re-timing the best steps and the baselines side by side",
    ]
    # Every phase said in one line ending with its seconds, in order.
    assert all(re.search(r"(\(|, )\d+\.\d s\)$", line) for line in notes), notes
    heads = [re.split(r":| \(", line)[0] for line in notes]
    assert heads == [re.split(r":| \(", head)[0] for head in TUNE_PHASES]
    assert [line.split(":")[0] for line in notes if line.startswith("step ")] == [
        f"step {s.step} ({s.source or 'start'})" for s in episode.steps
    ]
    # The study's baselines (one implementation): the PyTorch default over the budget at the whole
    # batch, measured at the next smaller micro-batch; the HF recipe, bf16 with every block recomputed,
    # the whole batch in one micro-batch.
    assert [(b.name, b.config.describe(), b.reason) for b in tuned.baselines] == [
        ("pytorch-default", "micro x acc x ranks 8x2x1 | fp32 | ckpt none | ZeRO 0", None),
        ("hf-recipe", "micro x acc x ranks 16x1x1 | bf16, outer bf16 | ckpt all | ZeRO 0", None),
    ]
    assert all(b.throughput and b.peak_bytes and b.peak_bytes <= episode.budget_bytes for b in tuned.baselines)
    best = episode.best
    assert best is not None and episode.retimed is not None
    # One side-by-side run: the best steps, then each baseline within the budget not among them
    # (the PyTorch default's 8x2 is the start's configuration: timed once, for both).
    chosen = [s.config for s in episode.ranked()[:FINALISTS]]
    assert episode.retimed["steps"] == [s.step for s in episode.ranked()[:FINALISTS]]
    assert retimed == [chosen + [b.config for b in tuned.baselines if b.config not in chosen]]
    assert all(b.retimed_throughput and b.retimed_spread is not None for b in tuned.baselines)
    assert tuned.side_by_side
    i = episode.retimed["steps"].index(best.step)
    mine = episode.retimed["retimed_per_gib"][i]
    assert tuned.ratios() == {b.name: mine / b.retimed_per_gib for b in tuned.baselines if b.retimed_per_gib}
    line = tuned.recommended_line()
    beaten_by = tuned.beaten_by  # real timings: on some machines the HF recipe beats every step
    if beaten_by is None:
        assert re.fullmatch(
            rf"recommended: step {best.step}: {re.escape(best.config.describe())}: \d+\.\d samples/s, "
            r"peak [\d.]+ [KM]iB, \d+\.\d samples/s per GiB \(\d+\.\d\dx the PyTorch default and \d+\.\d\dx the HF "
            r"recipe per GiB, timed side by side\)",
            line,
        ), line
        assert f"{episode.retimed['retimed_throughput'][i]:.1f} samples/s" in line  # the re-timed figures
        assert tuned.recommended == {"step": best.step, "config": best.config.to_dict()}
    else:
        assert beaten_by.retimed_per_gib is not None and beaten_by.retimed_per_gib > mine
        assert line.startswith(f"recommended: baseline {beaten_by.name}: {beaten_by.config.describe()}: ")
        ratio = mine / beaten_by.retimed_per_gib
        assert line.endswith(
            f"; the policy's best, step {best.step}, is {ratio:.2f}x of it per GiB, timed side by side"
        )
        assert tuned.recommended == {"baseline": beaten_by.name, "config": beaten_by.config.to_dict()}


def test_tune_fine_tunes_on_a_model_that_cannot_run_in_reduced_precision() -> None:
    # bf16 autocast around nn.LSTM raises on an AVX2 CPU: the run's calibration crashed `tune`
    # (found by benchmarks/picks.py on lstm-lm). Now the profile is fp32-only, and no step is bf16.
    workload = load_workload(f"{DATA / 'no_low_precision.py'}:build")
    shown: list[str] = []

    @contextmanager
    def status(message: str) -> Iterator[None]:
        shown.append(message)
        yield

    tuned = tune(
        workload,
        load_policy(PRETRAINED_DIR),
        memory_budget=1 << 40,  # every fp32 setting fits: the refusals are reduced precision's alone
        steps=3,
        steps_per_action=2,
        fine_tune_seconds=1.0,
        status=status,
    )
    assert shown[:2] == [
        "profiling no-low-precision for the simulator",
        "fine-tuning the policy on no-low-precision's simulator (1 s)",
    ]
    best = tuned.episode.best
    assert best is not None and best.config.precision == "fp32"
    assert {s.config.precision for s in tuned.episode.steps} == {"fp32"}  # every step trained in fp32


@pytest.mark.parametrize("seconds", [-1.0, float("nan")])
def test_a_bad_fine_tuning_time_is_refused_before_anything_trains(
    seconds: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.envs.training import TrainingEnv

    def built(*_: Any, **__: Any) -> None:
        raise AssertionError("the environment was built")

    monkeypatch.setattr(TrainingEnv, "__init__", built)
    workload = load_workload(f"{TINY_WORKLOAD}:build")
    with pytest.raises(ConfigError) as info:
        tune(workload, load_policy(PRETRAINED_DIR), fine_tune_seconds=seconds)
    assert str(info.value) == f"fine_tune_seconds must be a finite number >= 0, but got {seconds!r}."


def test_an_unknown_objective_is_refused_before_anything_trains(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.envs.training import TrainingEnv

    def built(*_: Any, **__: Any) -> None:
        raise AssertionError("the environment was built")

    monkeypatch.setattr(TrainingEnv, "__init__", built)
    workload = load_workload(f"{TINY_WORKLOAD}:build")
    with pytest.raises(ConfigError) as info:
        tune(workload, load_policy(PRETRAINED_DIR), objective="fastest")  # type: ignore[arg-type]
    assert str(info.value) == "objective must be one of ('per-gib', 'throughput'), but got 'fastest'."


def _fake_check() -> Any:
    from autotune.measurement.compiled import CompileCheck
    from autotune.measurement.sidebyside import Timing

    return CompileCheck(
        mode="default",
        eager=Timing(rates=(128.0,) * 3),
        compiled=Timing(rates=(256.0,) * 3),
        samples=16,
        warmup_seconds=(20.0625, 0.0625),
        eager_peak=None,
        compiled_peak=None,
    )


@pytest.mark.parametrize("asked", [True, None])
def test_the_compile_check_times_the_best_step_where_asked(asked: bool | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison faked (a real compile costs a minute here); on the CPU the default is off."""
    check, calls = _fake_check(), []

    def compare_compiled(workload: Any, config: Any, *, device: str | None) -> Any:
        calls.append((workload.name, config, device))
        return check

    monkeypatch.setattr("autotune.measurement.compiled.compare_compiled", compare_compiled)
    workload = load_workload(f"{TINY_WORKLOAD}:build")
    notes: list[str] = []
    tuned = tune(
        workload,
        load_policy(PRETRAINED_DIR),
        steps=1,
        steps_per_action=2,
        fine_tune_seconds=0,
        retime=False,
        refine=False,
        compile_check=asked,
        baselines=False,
        note=notes.append,
    )
    notes = [n for n in notes if n.startswith("torch.compile")]  # the reset's phases said before
    if asked is None:  # the CPU: not checked, nothing said
        assert (calls, notes, tuned.compile_check) == ([], [], None)
        return
    best = tuned.episode.best
    assert best is not None and calls == [(workload.name, best.config, None)]
    assert tuned.compile_check is check
    assert notes == [
        "torch.compile: 2.00x eager (step 62.5 ms vs 125.0 ms, peak not measured: no allocator to ask on the CPU), "
        "compile 20 s, pays back after 320 steps: recommended"
    ]


def test_a_best_step_on_deepspeed_ranks_is_not_compile_checked() -> None:
    from contextlib import nullcontext

    from autotune.policies.tune import _compile_check

    from autotune.config import TrainConfig

    notes: list[str] = []
    config = TrainConfig(micro_batch_size=8, zero_stage=2)
    workload = load_workload(f"{TINY_WORKLOAD}:build")
    checked = _compile_check(workload, config, device=None, show=lambda _m: nullcontext(), note=notes.append)
    assert checked is None
    assert notes == ["torch.compile: not checked (the best configuration runs on DeepSpeed ranks)"]


def _step(step: int, micro: int, throughput: float, peak: int) -> Any:
    from autotune.policies.episode import EpisodeStep

    from autotune.config import TrainConfig

    return EpisodeStep(
        step=step,
        action=None if step == 0 else (1, 1, 1, 1, 1, 1, 1),
        knobs=f"{micro}x{16 // micro}",
        batch=16,
        config=TrainConfig(micro_batch_size=micro, grad_accum_steps=16 // micro),
        throughput=throughput,
        peak_bytes=peak,
        b_noise=None,
        loss=1.0,
        reward=None if step == 0 else 0.0,
        source=None if step == 0 else "policy",
    )


def _baselines() -> tuple[Any, ...]:
    from autotune.policies.tune import TunedBaseline

    from autotune.config import TrainConfig

    over = TunedBaseline(
        name="pytorch-default",
        config=TrainConfig(micro_batch_size=1, grad_accum_steps=16),
        throughput=None,
        peak_bytes=3 * GIB,
        reason="over budget",
        within_budget=False,
    )
    hf = TrainConfig(micro_batch_size=16, precision="bf16", outer_precision="bf16", checkpoint=True)
    return over, TunedBaseline(name="hf-recipe", config=hf, throughput=5.0, peak_bytes=GIB // 4)


GIB = 2**30


def test_the_baselines_within_the_budget_are_re_timed_in_the_best_steps_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The side-by-side run faked (its figures exact): the best steps and the HF recipe in one
    run, the PyTorch default over the budget kept with its peak and compared with nothing."""
    from contextlib import nullcontext

    from autotune.policies.episode import Episode
    from autotune.policies.tune import Tuned, _retime

    from autotune.measurement import sidebyside
    from autotune.measurement.sidebyside import Retimed, Timing

    episode = Episode(
        workload="fake",
        budget_bytes=2 * GIB,
        # Step 2 over the budget; step 3 the start's configuration again: two best steps.
        steps=(_step(0, 8, 10.0, GIB), _step(1, 4, 8.0, GIB // 2), _step(2, 16, 30.0, 4 * GIB), _step(3, 8, 9.0, GIB)),
    )
    calls: list[tuple[list[Any], list[float]]] = []
    rates = (12.0, 20.0, 4.0)  # 4x4 (0.5 GiB), 8x2 (1 GiB), the HF recipe (0.25 GiB)

    def retime_configs(workload: Any, configs: Any, *, scales: Any, device: Any) -> Retimed:
        calls.append((list(configs), list(scales)))
        timings = tuple(Timing(rates=(r, r)) for r in rates)
        return Retimed(timings=timings, ranking=(1, 0, 2), decided=True, rounds=3, warmup=(2, 2, 2), other_cores=None)

    monkeypatch.setattr(sidebyside, "retime_configs", retime_configs)
    measured = _baselines()
    notes: list[str] = []
    retimed, baselines = _retime(
        episode,
        load_workload(f"{TINY_WORKLOAD}:build"),
        measured,
        device=None,
        show=lambda _m: nullcontext(),
        say=notes.append,
    )
    hf = measured[1]
    # The best steps by their first measurement (step 1, then step 0; step 3 is step 0's
    # configuration, step 2 over the budget), then the HF recipe, each with its scale (1 / GiB).
    assert calls == [([episode.steps[1].config, episode.steps[0].config, hf.config], [2.0, 1.0, 4.0])]
    assert retimed.retimed is not None
    assert {k: v for k, v in retimed.retimed.items() if k != "retimed_spread"} == {
        "steps": [1, 0],
        "retimed_throughput": [12.0, 20.0],
        "retimed_per_gib": [24.0, 20.0],
        "winner": 1,  # 24 per GiB against 20: the HF recipe's 16 competes for no step's place
        "decided": True,
        "rounds": 3,
        "note": None,
    }
    assert baselines == (measured[0], dataclasses.replace(hf, retimed_throughput=4.0, retimed_spread=0.0))
    assert re.fullmatch(
        r"best steps and baselines re-timed side by side \(steps \[1, 0\], baselines hf-recipe, \d+\.\d s\)", notes[0]
    )
    tuned = Tuned(episode=retimed, final_knobs=None, baselines=baselines)  # type: ignore[arg-type]
    assert tuned.side_by_side
    assert tuned.ratios() == {"pytorch-default": None, "hf-recipe": 1.5}  # 24 / 16 per GiB, one run
    assert tuned.recommended_line() == (
        f"recommended: step 1: {episode.steps[1].config.describe()}: 12.0 samples/s, peak 512 MiB, "
        "24.0 samples/s per GiB (1.50x the HF recipe per GiB, timed side by side)"
    )
    assert tuned.beaten_by is None and tuned.recommended == {"step": 1, "config": episode.steps[1].config.to_dict()}
    # Without the re-timing, each its own first measurement: not side by side.
    first = Tuned(episode=episode, final_knobs=None, baselines=measured)  # type: ignore[arg-type]
    assert not first.side_by_side
    assert first.ratios() == {"pytorch-default": None, "hf-recipe": 16.0 / 20.0}  # step 1's 8 / 0.5 GiB, 5 / 0.25
    assert first.beaten_by is None  # 20 per GiB against 16, but not side by side: the step holds

    # Re-timed at 8 samples/s (32 per GiB, against step 1's 24, no spread): the HF recipe is recommended.
    faster = dataclasses.replace(hf, retimed_throughput=8.0, retimed_spread=0.0)
    beaten = Tuned(episode=retimed, final_knobs=None, baselines=(measured[0], faster))  # type: ignore[arg-type]
    assert beaten.beaten_by == faster
    assert beaten.recommended == {"baseline": "hf-recipe", "config": hf.config.to_dict()}
    assert beaten.recommended_line() == (
        f"recommended: baseline hf-recipe: {hf.config.describe()}: 8.0 samples/s, peak 256 MiB, 32.0 samples/s per "
        "GiB; the policy's best, step 1, is 0.75x of it per GiB, timed side by side"
    )
    # Within the spreads (32 with 20% against 24 with 10%: 8 <= 6.4 + 2.4), the step holds.
    noisy = dataclasses.replace(faster, retimed_spread=0.2)
    spread = {**retimed.retimed, "retimed_spread": [0.1, 0.0]}  # type: ignore[dict-item]
    close = Tuned(
        episode=dataclasses.replace(retimed, retimed=spread), final_knobs=None, baselines=(measured[0], noisy)
    )  # type: ignore[arg-type]
    assert close.beaten_by is None


def test_tune_json_holds_the_episode_the_baselines_and_the_ratios() -> None:
    from autotune.policies.episode import Episode
    from autotune.policies.tune import Tuned

    from autotune.config import TrainConfig

    over, hf = _baselines()
    hf = dataclasses.replace(hf, retimed_throughput=4.0, retimed_spread=0.0)

    episode = Episode(
        workload="fake",
        budget_bytes=2 * GIB,
        steps=(_step(0, 8, 10.0, GIB),),
        retimed={
            "steps": [0],
            "retimed_throughput": [20.0],
            "retimed_spread": [0.0],
            "retimed_per_gib": [20.0],
            "winner": 0,
            "decided": True,
            "rounds": 3,
            "note": None,
        },
    )
    tuned = Tuned(episode=episode, final_knobs=None, baselines=(over, hf))  # type: ignore[arg-type]
    d = json.loads(tuned.to_json())
    assert list(d) == [*episode.to_dict(), "baselines", "ratios", "side_by_side", "recommended"]
    assert d["baselines"] == [
        {
            "name": "pytorch-default",
            "config": TrainConfig(micro_batch_size=1, grad_accum_steps=16).to_dict(),
            "throughput": None,
            "peak_bytes": 3 * GIB,
            "per_gib": None,
            "within_budget": False,
            "reason": "over budget",
            "retimed_throughput": None,
            "retimed_spread": None,
            "retimed_per_gib": None,
        },
        {
            "name": "hf-recipe",
            "config": hf.config.to_dict(),
            "throughput": 5.0,
            "peak_bytes": GIB // 4,
            "per_gib": 20.0,
            "within_budget": True,
            "reason": None,
            "retimed_throughput": 4.0,
            "retimed_spread": 0.0,
            "retimed_per_gib": 16.0,
        },
    ]
    assert (d["ratios"], d["side_by_side"]) == ({"pytorch-default": None, "hf-recipe": 1.25}, True)


def test_under_throughput_tune_also_measures_the_hf_bf16_only_recipe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each baseline's search for its largest micro-batch faked: which are measured, in order."""
    import autotune.policies.tune_baselines as tb

    measured: list[tuple[str, str]] = []

    def largest_within(workload: Any, space: Any, name: str, knobs: Any, **kw: Any) -> Any:
        config = space.config(knobs)
        measured.append((name, config.describe()))
        return tb.TunedBaseline(name=name, config=config, throughput=1.0, peak_bytes=GIB)

    monkeypatch.setattr(tb, "_largest_within", largest_within)
    workload = load_workload(TINY)
    lines: list[str] = []
    for objective in ("per-gib", "throughput"):
        tb.measure_baselines(
            workload, budget=2 * GIB, device="cpu", show=_no_status, say=lines.append, objective=objective
        )
    whole = f"{workload.batch_size}x1x1"
    hf = (HF_RECIPE, f"micro x acc x ranks {whole} | bf16, outer bf16 | ckpt all | ZeRO 0")
    default = (PYTORCH_DEFAULT, f"micro x acc x ranks {whole} | fp32 | ckpt none | ZeRO 0")
    fast = (HF_BF16, f"micro x acc x ranks {whole} | bf16, outer bf16 | ckpt none | ZeRO 0")
    assert measured == [default, hf, default, hf, fast]
    assert len(lines) == 5 and lines[-1].startswith(f"baseline hf-bf16 measured: {fast[1]}: 1.0 samples/s")


@contextmanager
def _no_status(message: str) -> Iterator[None]:
    yield
