"""TrainingState files: what the session's rank 0 writes and the parent reads (safetensors, no pickle).

Gathering from and restoring into real engines is tested on 2 ranks in test_session.py.
"""

from __future__ import annotations

from pathlib import Path

import torch

from autotune.train.zero_state import TrainingState, load_into_module, load_state, save_state


def _state() -> TrainingState:
    g = torch.Generator().manual_seed(0)
    return TrainingState(
        parameters={"0.weight": torch.randn(3, 2, generator=g), "0.bias": torch.randn(3, generator=g)},
        optimizer_state={
            "0.weight": {"exp_avg": torch.randn(3, 2, generator=g), "exp_avg_sq": torch.rand(3, 2, generator=g)},
            "0.bias": {"exp_avg": torch.randn(3, generator=g), "exp_avg_sq": torch.rand(3, generator=g)},
        },
        optimizer_scalars={"step": torch.tensor(7.0)},
        buffers={"1.running_mean": torch.randn(3, generator=g)},
    )


def test_a_state_file_round_trips_exactly(tmp_path: Path) -> None:
    state = _state()
    save_state(state, tmp_path / "s.safetensors")
    again = load_state(tmp_path / "s.safetensors")
    assert again.parameters.keys() == state.parameters.keys()
    assert all(torch.equal(again.parameters[n], t) for n, t in state.parameters.items())
    assert again.optimizer_state.keys() == state.optimizer_state.keys()
    for name, moments in state.optimizer_state.items():
        assert again.optimizer_state[name].keys() == moments.keys()
        assert all(torch.equal(again.optimizer_state[name][k], t) for k, t in moments.items())
    assert again.optimizer_scalars.keys() == {"step"}
    assert torch.equal(again.optimizer_scalars["step"], torch.tensor(7.0))
    assert torch.equal(again.buffers["1.running_mean"], state.buffers["1.running_mean"])


def test_a_fresh_module_starts_from_the_state() -> None:
    state = _state()
    module = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3, affine=False))
    load_into_module(module, state)
    assert torch.equal(module[0].weight, state.parameters["0.weight"])
    assert torch.equal(module[0].bias, state.parameters["0.bias"])
    assert torch.equal(module[1].running_mean, state.buffers["1.running_mean"])
    assert module[1].running_var.eq(1).all()  # a buffer the state does not hold stays as it was
