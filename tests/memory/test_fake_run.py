"""One fake forward/backward and what it observes (autotune/memory/fake_run.py)."""

from __future__ import annotations

import torch

from autotune import TrainConfig, Workload, measure, predict_memory


class _DetachedScale(torch.nn.Module):
    """A block that builds a graph in its forward and uses its result only detached (as PEFT's
    DoRA does with its adapters' weight product, whose factors train through their own output):
    what that graph saved is freed in the forward."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin, self.a, self.b = torch.nn.Linear(d, d), torch.nn.Linear(d, 8), torch.nn.Linear(8, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        product = torch.tanh(self.b.weight @ self.a.weight)  # with gradients (tanh saves its output), discarded
        return torch.relu(self.lin(x)) * product.detach().norm() + self.b(self.a(x))


def test_a_graph_the_forward_discards_is_freed_in_the_fake_run_as_in_the_real_step() -> None:
    # Before, the plain profile run held that graph to the end of the step (its saved output,
    # packed as itself by the ledger's hook, held its own grad_fn: a reference cycle), +7.7% on
    # this model without recompute; and a freed storage's address stayed in the ledger, so the next
    # storage given that address could read as saved already (DoRA's predictions moved by percents).
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(_DetachedScale(64) for _ in range(4)), torch.nn.Linear(64, 2))
    data = torch.utils.data.TensorDataset(torch.randn(64, 16, 64), torch.randint(0, 2, (64, 16)))
    wl = Workload(
        name="detached",
        model=model,
        dataset=data,
        loss_fn=lambda m, b: torch.nn.functional.cross_entropy(m(b[0]).flatten(0, 1), b[1].flatten()),
        batch_size=8,
        blocks=["0", "1", "2", "3"],
    )
    for checkpoint in (False, (True, False, "selective", False)):
        config = TrainConfig(micro_batch_size=8, checkpoint=checkpoint, grad_clip=None)
        predicted = {predict_memory(wl, config, verify=False).total for _ in range(2)}
        measured = measure(wl, config, steps=1, warmup=1).peak_bytes
        assert len(predicted) == 1 and measured is not None
        assert abs(predicted.pop() - measured) <= 64, checkpoint
