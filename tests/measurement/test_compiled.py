"""The torch.compile decision (autotune.measurement.compiled): exact values from plain numbers.

The real compile runs only in the slow test at the end (tens of seconds on 2 cores)."""

from __future__ import annotations

import re

import pytest

from autotune import ConfigError
from autotune.measurement.compiled import CompileCheck, compile_line, compiled_step_memory, payback_steps
from autotune.measurement.sidebyside import Timing
from autotune.workload import Workload

MIB = 1024**2


def _check(eager: tuple[float, ...], compiled: tuple[float, ...], **kwargs: object) -> CompileCheck:
    fields: dict[str, object] = {
        "mode": "default",
        "samples": 1,
        "warmup_seconds": (20.125, 0.25, 0.125),
        "eager_peak": None,
        "compiled_peak": None,
    }
    fields.update(kwargs)
    return CompileCheck(eager=Timing(rates=eager), compiled=Timing(rates=compiled), **fields)  # type: ignore[arg-type]


def test_payback_is_compile_seconds_over_the_seconds_saved_per_step() -> None:
    assert payback_steps(compile_seconds=20.0, eager_step=0.25, compiled_step=0.125) == 160.0
    assert payback_steps(compile_seconds=-1.0, eager_step=0.25, compiled_step=0.125) == 0.0
    assert payback_steps(compile_seconds=20.0, eager_step=0.125, compiled_step=0.125) is None  # never
    assert payback_steps(compile_seconds=20.0, eager_step=0.125, compiled_step=0.25) is None


def test_a_compile_that_wins_beyond_the_noise_is_recommended() -> None:
    check = _check((4.0, 4.0, 4.0), (8.0, 8.0, 8.0))
    assert (check.eager_step, check.compiled_step, check.speedup) == (0.25, 0.125, 2.0)
    # Every warm-up step's excess over the steady compiled step: 20 + 0.125 + 0.
    assert check.compile_seconds == 20.125
    assert check.payback_steps == 161.0
    assert check.faster and check.recommended
    assert compile_line(check) == (
        "torch.compile: 2.00x eager (step 125.0 ms vs 250.0 ms, peak not measured: no allocator to ask on the "
        "CPU), compile 20 s, pays back after 160 steps: recommended"
    )


def test_a_gain_within_the_spreads_is_not_recommended() -> None:
    # Medians 4.4 vs 4.0: the gap 0.4 is less than the spreads together (0.5 + 0.5).
    check = _check((4.0, 4.5, 3.5), (4.4, 4.9, 3.9))
    assert not check.faster and not check.recommended
    assert check.verdict == "not recommended (within the noise)"


def test_a_slower_compile_never_pays_back() -> None:
    check = _check((4.0, 4.0, 4.0), (2.0, 2.0, 2.0), mode="max-autotune", eager_peak=300 * MIB, compiled_peak=280 * MIB)
    assert check.payback_steps is None
    assert compile_line(check) == (
        "torch.compile (mode max-autotune): 0.50x eager (step 500.0 ms vs 250.0 ms, peak 280 MiB vs 300 MiB), "
        "compile 20 s, never pays back: not recommended (slower)"
    )


def test_a_faster_compile_over_the_budget_is_not_recommended() -> None:
    check = _check(
        (4.0, 4.0, 4.0), (8.0, 8.0, 8.0), eager_peak=300 * MIB, compiled_peak=400 * MIB, memory_budget=350 * MIB
    )
    assert check.faster and check.over_budget and not check.recommended
    assert check.verdict == "not recommended (its peak exceeds the memory budget)"
    within = _check((4.0, 4.0, 4.0), (8.0, 8.0, 8.0), compiled_peak=350 * MIB, memory_budget=350 * MIB)
    assert within.recommended  # a peak at the budget fits it


def test_payback_is_said_in_two_significant_figures() -> None:
    check = _check((4.0, 4.0, 4.0), (8.0, 8.0, 8.0), warmup_seconds=(640.125,))
    assert check.payback_steps == 5120.0
    assert "pays back after 5,100 steps" in compile_line(check)


def test_a_check_round_trips_through_its_dict() -> None:
    check = _check((4.0, 4.5), (8.0, 8.5), eager_peak=3, compiled_peak=2, memory_budget=9, rounds=3, other_cores=0.5)
    assert CompileCheck.from_dict(check.to_dict()) == check


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"mode": "none"}, "CompileCheck.mode must be 'default' or 'max-autotune', but got 'none'."),
        ({"samples": 0}, "CompileCheck.samples must be >= 1, but got 0."),
    ],
)
def test_a_check_states_its_rules(kwargs: dict[str, object], msg: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(msg)}$"):
        _check((4.0,), (8.0,), **kwargs)


@pytest.mark.slow
def test_measure_compiles_a_tiny_model_and_reports_its_peak() -> None:
    """Tens of seconds on 2 cores: the compile of a 2-block MLP of width 32."""
    import autotune
    from autotune import TrainConfig
    from tests.conftest import make_resmlp

    wl = make_resmlp(depth=2, d=32, n=64, seq=8)
    eager = autotune.measure(wl, TrainConfig(micro_batch_size=8), steps=2, warmup=2)
    compiled = autotune.measure(wl, TrainConfig(micro_batch_size=8, compile="default"), steps=2, warmup=2)
    assert compiled.status == "ok" and compiled.peak_bytes is not None and compiled.peak_bytes > 0
    # autotune's exact tracker is a dispatch mode, under which Dynamo runs the step eagerly: the
    # tracked peak of a compiled configuration is its eager peak (docs/study.md says so).
    assert compiled.memory == eager.memory
    n = min(len(eager.losses), len(compiled.losses))
    assert n >= 3
    for a, b in zip(eager.losses[:n], compiled.losses[:n], strict=True):
        assert b == pytest.approx(a, rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_compare_compiled_times_a_tiny_model_both_ways() -> None:
    from autotune import TrainConfig
    from autotune.measurement.compiled import compare_compiled
    from tests.conftest import make_resmlp

    wl = make_resmlp(depth=2, d=32, n=64, seq=8)
    check = compare_compiled(wl, TrainConfig(micro_batch_size=8), rounds=1, max_rounds=1, steps_per_round=2)
    assert (check.mode, check.samples, check.rounds) == ("default", 8, 1)
    assert len(check.eager.rates) == len(check.compiled.rates) == 2
    assert check.eager_peak is None and check.compiled_peak is None  # the CPU: no allocator to ask
    assert len(check.warmup_seconds) >= 2 and check.compile_seconds > 0  # the first step compiled
    assert compile_line(check).startswith("torch.compile: ")


def _mse_mlp() -> Workload:
    """Linear-GELU-Linear under a mean squared error: every tensor of the forward but the loss is
    saved for backward (the input by the first Linear, the output and the target by the loss)."""
    import torch
    from torch import nn

    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 16, generator=g), torch.randn(64, 8, generator=g))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8))

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(m(x), y)

    return Workload(name="mse-mlp", model=model, dataset=data, loss_fn=loss_fn, batch_size=8)


def test_saved_bytes_are_the_trackers_activations_but_the_loss_on_an_eager_step() -> None:
    from autotune import TrainConfig
    from autotune.measurement.tracker import tracked_step
    from autotune.train.local import Trainer

    trainer = Trainer(_mse_mlp(), TrainConfig(micro_batch_size=8))
    trainer.step()
    tracked = tracked_step(trainer)
    memory = compiled_step_memory(trainer)
    trainer.close()
    # input 8x16, hidden 8x32 (GELU's), its output 8x32 (the second Linear's), output 8x8 and
    # target 8x8 (the loss'): fp32.
    assert memory.saved == 4 * (8 * 16 + 8 * 32 + 8 * 32 + 8 * 8 + 8 * 8) == 3072
    # The exact tracker's activation peak is reached inside the loss, which nothing saves: its
    # squared difference (8x8 fp32) and two fp32 scalars (the sum, the mean) beside the saved bytes.
    assert tracked.category_peaks.activations == memory.saved + 8 * 8 * 4 + 4 + 4
    # The step allocates the activations, the loss and the gradients (2.6 KiB of parameters) at least.
    assert memory.allocated_peak is not None and memory.allocated_peak >= memory.saved + 4 * (16 * 32 + 32 * 8)


def test_saved_bytes_are_one_micro_batchs_with_accumulation() -> None:
    from autotune import TrainConfig
    from autotune.train.local import Trainer

    one = Trainer(_mse_mlp(), TrainConfig(micro_batch_size=8))
    two = Trainer(_mse_mlp(), TrainConfig(micro_batch_size=8, grad_accum_steps=2))
    # each micro-batch's saved tensors are freed by its backward: the largest, not the sum
    assert compiled_step_memory(two).saved == compiled_step_memory(one).saved == 3072
    one.close()
    two.close()


def test_full_recompute_saves_only_the_blocks_inputs() -> None:
    from autotune import TrainConfig
    from autotune.train.local import Trainer
    from tests.conftest import make_resmlp

    wl = make_resmlp(depth=2, d=32, n=64, seq=8)
    none = Trainer(wl, TrainConfig(micro_batch_size=8))
    full = Trainer(wl, TrainConfig(micro_batch_size=8, checkpoint=True))
    kept, recomputed = compiled_step_memory(none), compiled_step_memory(full)
    none.close()
    full.close()
    assert recomputed.saved < kept.saved


@pytest.mark.slow
def test_the_hooks_see_a_compiled_steps_saved_tensors_and_the_budget_at_compile_time() -> None:
    """Tens of seconds on 2 cores: two compiles of a 2-block MLP of width 32."""
    import torch

    from autotune import TrainConfig
    from autotune.train.local import Trainer
    from tests.conftest import make_resmlp

    wl = make_resmlp(depth=2, d=32, n=64, seq=8)
    eager = Trainer(wl, TrainConfig(micro_batch_size=8))
    kept = compiled_step_memory(eager).saved
    eager.close()
    saved = {}
    for budget in (1.0, 0.0):
        torch._dynamo.reset()
        trainer = Trainer(wl, TrainConfig(micro_batch_size=8, compile="default"))
        # The partitioner reads the budget when the first step compiles, not when a step runs
        # (AOTAutograd's cache keys on it: a cached graph of another budget is not served).
        with torch._functorch.config.patch(activation_memory_budget=budget):
            trainer.step()
        saved[budget] = compiled_step_memory(trainer).saved
        trainer.close()
    torch._dynamo.reset()
    # The compiler's default partition saves no more than eager autograd (here one 8x8 fp32 less:
    # 178,436 bytes against 178,692), and a budget of 0 less again.
    assert saved[0.0] < saved[1.0] <= kept
