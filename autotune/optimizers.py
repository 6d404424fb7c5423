"""The user's own optimizer, rebuilt over a copy of the model.

autotune trains, profiles and checks *copies* of the user's model, each with an optimizer of its
own. Where the user has an optimizer object (``Workload(optimizer=...)`` given one, an adaptive
run's, the Trainer's under the callbacks), each copy gets the same class with the same parameter
groups and options, its parameters matched by position: a copy made by ``copy.deepcopy`` lists
its parameters in the original's order. So the memory model counts the state the user's optimizer
keeps (Adafactor's factored moments, SGD's momentum in only some groups, a Muon/AdamW split by
module), not AdamW's.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from autotune.errors import WorkloadError

if TYPE_CHECKING:
    import torch

__all__ = ["check_over_model", "is_over", "rebuilt", "unwrapped"]


def unwrapped(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer inside a framework's wrapper: accelerate's ``AcceleratedOptimizer`` (what a
    Hugging Face Trainer holds) and Lightning's ``LightningOptimizer`` keep the user's optimizer
    as ``.optimizer`` / ``._optimizer``; their constructors take it, not parameter groups."""
    import torch

    inner = optimizer
    while True:
        found = next(
            (
                getattr(inner, name)
                for name in ("optimizer", "_optimizer")
                if isinstance(getattr(inner, name, None), torch.optim.Optimizer)
            ),
            None,
        )
        if found is None or found is inner:
            return inner
        inner = found


def check_over_model(optimizer: torch.optim.Optimizer, model: torch.nn.Module, *, workload: str) -> None:
    """Refuse an optimizer some of whose parameters are not ``model``'s (no copy could match them).

    Raises:
        WorkloadError: a parameter of a group is not one of ``model``'s, said with its group and place.
    """
    foreign = _foreign(optimizer, model)
    if foreign is not None:
        g, i, shape = foreign
        raise WorkloadError(
            f"Workload {workload!r}: the optimizer must be over the model's parameters, but parameter {i} "
            f"of its param group {g} {shape} is not one of them."
        )


def is_over(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> bool:
    """Whether every parameter of ``optimizer`` is one of ``model``'s (:func:`check_over_model`'s rule)."""
    return _foreign(optimizer, model) is None


def _foreign(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> tuple[int, int, tuple[int, ...]] | None:
    """(group, place, shape) of the optimizer's first parameter that is not ``model``'s, or None."""
    own = {id(p) for p in model.parameters()}
    for g, group in enumerate(unwrapped(optimizer).param_groups):
        for i, p in enumerate(group["params"]):
            if id(p) not in own:
                return g, i, tuple(p.shape)
    return None


def rebuilt(
    optimizer: torch.optim.Optimizer, model: torch.nn.Module, params: Iterable[torch.nn.Parameter]
) -> torch.optim.Optimizer:
    """A fresh optimizer of ``optimizer``'s class over ``params`` (a copy's), with its groups.

    Args:
        optimizer: The user's optimizer over ``model``'s parameters (wrapped or not).
        model: The model ``optimizer`` is over.
        params: The copy's parameters, in ``model.parameters()`` order; any other list (ZeRO's
            one flat parameter) gets one group with the options of the group holding the most
            elements.

    Returns:
        The optimizer, no state yet, at the groups' own learning rates.
    """
    template = unwrapped(optimizer)
    mine = list(params)
    originals = list(model.parameters())
    options = [{k: v for k, v in group.items() if k != "params"} for group in template.param_groups]
    if len(mine) == len(originals) and all(a.shape == b.shape for a, b in zip(mine, originals, strict=True)):
        place = {id(p): i for i, p in enumerate(originals)}
        groups = [
            {**opts, "params": [mine[place[id(p)]] for p in group["params"]]}
            for opts, group in zip(options, template.param_groups, strict=True)
        ]
    else:
        largest = max(range(len(options)), key=lambda g: sum(p.numel() for p in template.param_groups[g]["params"]))
        groups = [{**options[largest], "params": mine}]
    return type(template)(groups, **_defaults(template))


def _defaults(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's defaults its constructor takes (torch's AdamW keeps ``decoupled_weight_decay``
    in its defaults without accepting it; nanochat's MuonAdamW takes groups only)."""
    accepted = inspect.signature(type(optimizer)).parameters
    return {k: v for k, v in optimizer.defaults.items() if k in accepted}
