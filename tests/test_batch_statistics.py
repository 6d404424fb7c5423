"""A model whose layers normalise over the batch keeps its micro-batch: every searcher, one rule.

BatchNorm in training normalises each micro-batch by its own statistics, so accumulating over
smaller micro-batches trains a different model. ``Workload.micro_batch_floor`` says how small a
micro-batch may be; the study's space, both environments, the adaptive controller (its start
search and its proposals) and the shape guard read it through
:func:`autotune.knobs.smallest_micro_batch`.
"""

from __future__ import annotations

import re

import pytest
import torch
from autotune.envs._codec import Levels, Move, apply_action
from torch import nn

from autotune import TrainConfig, Workload
from autotune.adapt import Adaptive
from autotune.adapt.shape_guard import splits
from autotune.errors import WorkloadError
from autotune.knobs import smallest_micro_batch
from autotune.search.space import SearchSpace

BATCH = 16


class _Head(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.linear = nn.Linear(channels, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.mean(-1))


def _bn_workload(*, min_micro_batch: int | None = None, frozen: bool = False) -> Workload:
    """Two ``1x1 conv -> BatchNorm -> ReLU`` blocks over (32 channels, 256 positions): the
    activations, not the parameters, make the peak (as in a convolutional network)."""
    torch.manual_seed(0)
    c = 32
    model = nn.Sequential(
        nn.Sequential(nn.Conv1d(c, c, 1), nn.BatchNorm1d(c), nn.ReLU()),
        nn.Sequential(nn.Conv1d(c, c, 1), nn.BatchNorm1d(c), nn.ReLU()),
        _Head(c),
    )
    if frozen:
        for m in model.modules():
            if isinstance(m, nn.BatchNorm1d):
                m.eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, c, 256, generator=g)
    data = torch.utils.data.TensorDataset(x, torch.randint(0, 2, (128,), generator=g))

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        xb, yb = batch
        return nn.functional.cross_entropy(m(xb), yb)

    return Workload(
        name="bn-conv",
        model=model,
        dataset=data,
        loss_fn=loss_fn,
        blocks=["0", "1"],
        batch_size=BATCH,
        min_micro_batch=min_micro_batch,
    )


def test_batchnorm_layers_in_training_set_the_floor_to_the_whole_batch() -> None:
    wl = _bn_workload()
    assert wl.batch_norm_layers == ("0.1", "1.1")
    assert wl.micro_batch_floor is None
    assert smallest_micro_batch(BATCH, wl.micro_batch_floor) == BATCH
    assert wl.micro_batch_note(BATCH) == (
        "BatchNorm normalises over the micro-batch (0.1 and 1 more): it stays 16, no accumulation (the training "
        "you wrote; min_micro_batch, --min-micro-batch in the CLI, allows smaller ones)"
    )


def test_frozen_batchnorm_and_models_without_it_split_freely() -> None:
    frozen = _bn_workload(frozen=True)
    assert (frozen.batch_norm_layers, frozen.micro_batch_floor, frozen.micro_batch_note(BATCH)) == ((), 1, None)
    no_stats = nn.BatchNorm1d(4, track_running_stats=False).eval()  # normalises by the batch in eval too
    wl = Workload(name="x", model=nn.Sequential(no_stats), dataset=frozen.dataset, loss_fn=frozen.loss_fn)
    assert wl.batch_norm_layers == ("0",)


def test_the_user_s_floor_overrides_the_rule() -> None:
    wl = _bn_workload(min_micro_batch=4)
    assert (wl.micro_batch_floor, wl.micro_batch_reason) == (4, "min_micro_batch 4")
    assert wl.micro_batch_note(BATCH) == "micro-batches of at least 4 (min_micro_batch 4)"
    assert smallest_micro_batch(2, wl.micro_batch_floor) == 2  # never above the batch itself


@pytest.mark.parametrize("value", [0, 2.0, True])
def test_a_bad_floor_is_refused_with_the_rule(value: object) -> None:
    message = f"Workload.min_micro_batch must be an int >= 1 or None, but got {value!r}."
    with pytest.raises(WorkloadError, match=f"^{re.escape(message)}$"):
        _bn_workload(min_micro_batch=value)  # type: ignore[arg-type]


def test_the_study_space_offers_only_micro_batches_at_or_above_the_floor() -> None:
    def space(floor: int | None, max_micro: int = 256) -> SearchSpace:
        return SearchSpace(
            batch_sizes=(BATCH,), ranks=(1, 2), ranking=(0, 1), max_micro_batch=max_micro, min_micro_batch=floor
        )

    assert space(1).micro_batch_choices(BATCH, 1) == (1, 2, 4, 8, 16)
    assert space(None).micro_batch_choices(BATCH, 1) == (16,)
    assert space(None).micro_batch_choices(BATCH, 2) == (8,)  # a rank's batch
    assert space(4).micro_batch_choices(BATCH, 1) == (4, 8, 16)
    assert space(None, max_micro=10).micro_batch_choices(BATCH, 1) == (8,)  # the data cannot feed 16


def test_an_agent_s_split_never_goes_below_the_floor() -> None:
    start = Levels.default_for(BATCH)  # 16 x 1
    smaller = Move.SMALLER_MICRO_BATCH.action
    assert apply_action(start, smaller, max_zero_stage=0).micro_batch_size == 8
    assert apply_action(start, smaller, max_zero_stage=0, min_micro=16) == start
    at_eight = apply_action(start, smaller, max_zero_stage=0, min_micro=8)
    assert (at_eight.micro_batch_size, apply_action(at_eight, smaller, max_zero_stage=0, min_micro=8)) == (8, at_eight)
    larger = apply_action(at_eight, Move.LARGER_MICRO_BATCH.action, max_zero_stage=0, min_micro=16)
    assert larger.micro_batch_size == 16  # back up to the floor is always open


def test_the_simulated_env_keeps_the_split_of_a_batchnorm_model() -> None:
    from autotune.envs.simulated import SimulatedEnv

    env = SimulatedEnv(memory_budget=1.0, noise=0.0, min_micro_batch=None)
    env.reset(seed=0)
    start = env._cursor
    assert env._next_levels(Move.SMALLER_MICRO_BATCH.action) == start
    free = SimulatedEnv(memory_budget=1.0, noise=0.0)
    free.reset(seed=0)
    assert free._next_levels(Move.SMALLER_MICRO_BATCH.action).micro_batch_size == free._cursor.micro_batch_size // 2


def test_the_shape_guard_splits_down_to_the_floor_then_recomputes() -> None:
    config = TrainConfig(micro_batch_size=8, grad_accum_steps=2)
    assert [(c.micro_batch_size, c.grad_accum_steps, c.checkpoint) for c in splits(config, min_micro_batch=4)] == [
        (4, 4, False),
        (8, 2, True),
        (4, 4, True),
    ]
    assert [(c.micro_batch_size, c.checkpoint) for c in splits(config, min_micro_batch=None)] == [(8, True)]


def _adaptive(wl: Workload, **kwargs: object) -> Adaptive:
    optimizer = torch.optim.SGD(wl.model.parameters(), lr=0.1)
    args: dict[str, object] = {"batch_size": BATCH, "blocks": wl.blocks, "min_micro_batch": wl.min_micro_batch}
    return Adaptive(wl.model, optimizer, wl.loss_fn, wl.dataset, **(args | kwargs))  # type: ignore[arg-type]


# A source profiles bf16 too; on this toy the memory model's bf16 check is off (1x1 convolutions
# in bf16 on the CPU): unverified, so measured before it is admitted, which this test does not need.
@pytest.mark.filterwarnings("ignore::autotune.errors.PredictionWarning")
def test_an_adaptive_run_takes_a_proposal_but_not_its_split() -> None:
    proposal = TrainConfig(micro_batch_size=4, grad_accum_steps=4, checkpoint=True, grad_clip=None)
    run = _adaptive(_bn_workload(), policy=proposal)
    try:
        run.step()
        assert (run.config.micro_batch_size, run.config.grad_accum_steps, run.config.checkpoint) == (16, 1, True)
        reason = run.history[0].reason
        assert reason.endswith(
            "; split 4x4 not taken, 16x1 kept: BatchNorm normalises over the micro-batch (0.1 and 1 more)"
        ), reason
    finally:
        run.close()
    allowed = _adaptive(_bn_workload(min_micro_batch=4), policy=proposal)
    try:
        allowed.step()
        assert (allowed.config.micro_batch_size, allowed.config.grad_accum_steps) == (4, 4)
    finally:
        allowed.close()


def test_a_start_over_the_budget_recomputes_instead_of_splitting_a_batchnorm_model() -> None:
    default_peak = _adaptive(_bn_workload(), policy=None)
    default_peak.close()
    budget = default_peak.budget_bytes - 1  # the default does not fit: the start search moves
    run = _adaptive(_bn_workload(), policy=None, memory_budget=budget)
    run.close()
    assert (run.config.micro_batch_size, run.config.checkpoint) == (16, True)
    free = _adaptive(_bn_workload(min_micro_batch=1), policy=None, memory_budget=budget)
    free.close()
    assert (free.config.micro_batch_size, free.config.checkpoint) == (8, False)


@pytest.mark.filterwarnings("ignore::autotune.errors.PredictionWarning")  # the bf16 check, as above
def test_the_training_env_keeps_the_split_of_a_batchnorm_model() -> None:
    from autotune.envs.training import TrainingEnv

    env = TrainingEnv(workloads=[_bn_workload()], memory_budget=1.0, steps_per_action=2, horizon=2)
    try:
        env.reset(seed=0)
        assert env._cursor.micro_batch_size == BATCH
        assert env._next_levels(Move.SMALLER_MICRO_BATCH.action) == env._cursor
        assert env._next_levels(Move.MORE_RECOMPUTE.action).checkpoint == env._cursor.checkpoint + 1
    finally:
        env.close()
    free = TrainingEnv(workloads=[_bn_workload(min_micro_batch=1)], memory_budget=1.0, steps_per_action=2, horizon=2)
    try:
        free.reset(seed=0)
        assert free._next_levels(Move.SMALLER_MICRO_BATCH.action).micro_batch_size == BATCH // 2
    finally:
        free.close()


@pytest.mark.filterwarnings("ignore::autotune.errors.PredictionWarning")  # the bf16 check, as above
def test_an_episode_over_the_budget_starts_recomputed_where_the_split_is_closed() -> None:
    from autotune.envs.training import TrainingEnv

    env = TrainingEnv(workloads=[_bn_workload()], memory_budget=0.9, steps_per_action=2, horizon=2)
    try:
        _, info = env.reset(seed=0)
        (default, default_peak), (start, start_peak) = env.measured_peaks[:2]
        assert default_peak > info["budget_bytes"] >= start_peak == info["peak_bytes"]
        assert (start.micro_batch_size, start.checkpoint_blocks) == (BATCH, env.num_blocks)  # every block recomputed
        assert default == env._levels_knobs(Levels.default_for(BATCH))
    finally:
        env.close()
