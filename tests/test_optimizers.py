"""The user's own optimizer rebuilt over copies of the model (autotune/optimizers.py), and what
the memory model then counts: its state, not AdamW's."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

from autotune import TrainConfig, Workload, WorkloadError, predict_memory
from autotune.optimizers import is_over, rebuilt, unwrapped
from autotune.procs.measure import measure


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def _two_groups(model: nn.Sequential) -> torch.optim.SGD:
    """Momentum on the first layer only (its 8 x 16 + 16 = 144 elements), another rate on the head."""
    return torch.optim.SGD(
        [
            {"params": model[0].parameters(), "momentum": 0.9},
            {"params": model[2].parameters(), "lr": 0.01},
        ],
        lr=0.1,
    )


class Wrapper(torch.optim.Optimizer):
    """A framework's wrapper (accelerate's AcceleratedOptimizer): the user's optimizer inside."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    @property
    def param_groups(self) -> list[dict[str, object]]:  # type: ignore[override]
        return self.optimizer.param_groups


def test_a_copy_gets_the_class_groups_and_options_over_its_own_parameters() -> None:
    model = _model()
    opt = _two_groups(model)
    copied = copy.deepcopy(model)
    for template in (opt, Wrapper(opt)):
        again = rebuilt(template, model, copied.parameters())
        assert type(again) is torch.optim.SGD and not again.state
        assert [[id(p) for p in g["params"]] for g in again.param_groups] == [
            [id(p) for p in copied[0].parameters()],
            [id(p) for p in copied[2].parameters()],
        ]
        options = [{k: v for k, v in g.items() if k != "params"} for g in again.param_groups]
        assert options == [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
        assert (options[0]["momentum"], options[1]["momentum"], options[1]["lr"]) == (0.9, 0, 0.01)
    assert unwrapped(Wrapper(opt)) is opt


def test_another_parameter_list_gets_one_group_of_the_largest_group_s_options() -> None:
    model = _model()
    flat = nn.Parameter(torch.zeros(178))  # ZeRO's one flat parameter
    (group,) = rebuilt(_two_groups(model), model, [flat]).param_groups
    assert (group["params"], group["momentum"], group["lr"]) == ([flat], 0.9, 0.1)  # 144 elements over 34


def test_an_optimizer_over_other_parameters_is_refused_with_where() -> None:
    model = _model()
    other = torch.optim.SGD([{"params": model.parameters()}, {"params": [nn.Parameter(torch.zeros(3, 4))]}], lr=0.1)
    assert not is_over(other, model) and is_over(_two_groups(model), model)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    message = (
        "Workload 'w': the optimizer must be over the model's parameters, but parameter 0 of its param "
        "group 1 (3, 4) is not one of them."
    )
    with pytest.raises(WorkloadError, match=f"^{re.escape(message)}$"):
        Workload(name="w", model=model, dataset=data, loss_fn=_loss, optimizer=other)
    message = (
        "Workload.optimizer must be params -> torch.optim.Optimizer, an optimizer over the model's parameters "
        "or None, but got str."
    )
    with pytest.raises(WorkloadError, match=f"^{re.escape(message)}$"):
        Workload(name="w", model=model, dataset=data, loss_fn=_loss, optimizer="sgd")  # type: ignore[arg-type]


def _loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


@pytest.mark.parametrize("which", ["sgd-groups", "adafactor"])
def test_the_memory_model_counts_the_state_of_the_user_s_optimizer_exactly(which: str) -> None:
    model = _model()
    if which == "sgd-groups":
        opt: torch.optim.Optimizer = _two_groups(model)
        state = 144 * 4  # one momentum buffer per parameter of the first group, none in the second
    else:
        opt = torch.optim.Adafactor(model.parameters(), lr=0.01)
        # Per 2-D weight a row and a column vector, per bias one vector, each parameter a 0-d step (fp32).
        state = (16 + 8 + 16 + 2 + 16 + 2) * 4 + 4 * 4
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    wl = Workload(name="w", model=model, dataset=data, loss_fn=_loss, optimizer=opt, batch_size=16)
    config = TrainConfig(micro_batch_size=16)
    estimate = predict_memory(wl, config)
    assert estimate.optimizer_state == state
    assert estimate.optimizer_state < 2 * 178 * 4  # AdamW's two moments of 178 elements
    measured = measure(wl, config, steps=1, warmup=1)
    assert measured.memory is not None and measured.memory.optimizer_state == state
    # The cross-entropy's few bytes apart, as for any optimizer (within tens of bytes).
    assert estimate.verified and abs(estimate.total - measured.memory.total) <= 16


@torch.compile(fullgraph=True)
def _momentum_update(p: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor, lr: float) -> None:
    buf.mul_(0.9).add_(grad)
    p.add_(buf, alpha=-lr)


class CompiledMomentum(torch.optim.Optimizer):
    """An optimizer whose update is compiled with fullgraph=True, as nanochat's MuonAdamW: its
    constructor takes parameter groups only."""

    def __init__(self, groups: list[dict[str, object]]) -> None:
        super().__init__(groups, defaults={})

    @torch.no_grad()
    def step(self, closure: object = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if "buf" not in self.state[p]:
                    self.state[p]["buf"] = torch.zeros_like(p)
                _momentum_update(p, p.grad, self.state[p]["buf"], group["lr"])


def test_an_optimizer_with_a_compiled_update_is_predicted_and_checked() -> None:
    """The fake step and the tracked check step run the compiled update eagerly (nothing compiles
    here): its state, one buffer per parameter, predicted exactly and verified."""
    model = _model()
    opt = CompiledMomentum([{"params": list(model.parameters()), "lr": 0.1}])
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
    wl = Workload(name="w", model=model, dataset=data, loss_fn=_loss, optimizer=opt, batch_size=16)
    estimate = predict_memory(wl, TrainConfig(micro_batch_size=16))
    assert estimate.optimizer_state == 178 * 4 and estimate.verified
