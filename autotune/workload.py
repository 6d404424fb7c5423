"""The workload contract: what the user trains, and how a reference to one is resolved.

A workload is a model, a map-style dataset, a loss function and (optionally) the names of the
model's *blocks*: the repeated units that per-block precision and activation checkpointing act
on. Users write a ``build() -> Workload`` function in a file or module; built-in workloads live
in :mod:`autotune.zoo`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.errors import WorkloadError

if TYPE_CHECKING:
    import torch
    from torch.utils.data import Dataset

__all__ = ["Workload", "load_workload", "find_blocks", "DEFAULT_LR"]

#: Learning rate of the default optimizer (AdamW) at the workload's reference batch size.
DEFAULT_LR = 1e-3

LossFn = Callable[["torch.nn.Module", Any], "torch.Tensor"]
OptimizerFactory = Callable[[Iterable["torch.nn.Parameter"]], "torch.optim.Optimizer"]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A model to train, with its data and loss.

    Args:
        name: Short identifier, used in reports and caches.
        model: An ``nn.Module`` in fp32 on the CPU. :func:`autotune.measure` trains a deep copy, so
            one workload can be measured under many configurations.
        dataset: A map-style ``torch.utils.data.Dataset``; batches use the default collate.
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``, with ``batch`` as the DataLoader yields it.
        blocks: Qualified names of the block modules (``model.get_submodule`` names), in forward
            order. ``None`` auto-detects them: see :func:`find_blocks`.
        optimizer: ``params -> torch.optim.Optimizer``. ``None`` means AdamW at ``DEFAULT_LR``.
            Its learning rate is the *base* rate at ``batch_size``; a config may scale it.
        batch_size: The reference effective batch size: the default effective batch of a study and
            ``B_base`` in linear learning-rate scaling.
        source: The reference this workload was loaded from (set by :func:`load_workload`), so
            other processes (DeepSpeed ranks, study workers) can rebuild it. None if built directly.
    """

    name: str
    model: torch.nn.Module
    dataset: Dataset[Any]
    loss_fn: LossFn
    blocks: Sequence[str] | None = None
    optimizer: OptimizerFactory | None = None
    batch_size: int = 32
    source: str | None = None

    def __post_init__(self) -> None:
        import torch

        if not isinstance(self.name, str) or not self.name:
            raise WorkloadError(f"Workload.name must be a non-empty string, but got {self.name!r}.")
        if not isinstance(self.model, torch.nn.Module):
            raise WorkloadError(f"Workload.model must be a torch.nn.Module, but got {type(self.model).__name__}.")
        if not hasattr(self.dataset, "__getitem__") or not hasattr(self.dataset, "__len__"):
            raise WorkloadError(
                "Workload.dataset must be a map-style Dataset (with __getitem__ and __len__), "
                f"but got {type(self.dataset).__name__}."
            )
        if not callable(self.loss_fn):
            raise WorkloadError(f"Workload.loss_fn must be callable, but got {self.loss_fn!r}.")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise WorkloadError(f"Workload.batch_size must be an int >= 1, but got {self.batch_size!r}.")
        if self.blocks is not None:
            object.__setattr__(self, "blocks", tuple(self.blocks))
            block_names(self.model, self.blocks, workload=self.name)

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    @property
    def largest_parameter(self) -> int:
        """Elements of the largest parameter: what DeepSpeed's bucket sizes are fitted to."""
        return max((p.numel() for p in self.model.parameters()), default=1)

    def block_names(self) -> tuple[str, ...]:
        """The block names: the declared ones, else the auto-detected ones."""
        if self.blocks is not None:
            return tuple(self.blocks)
        return find_blocks(self.model, workload=self.name)

    def make_optimizer(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        import torch

        if self.optimizer is None:
            return torch.optim.AdamW(params, lr=DEFAULT_LR)
        opt = self.optimizer(params)
        if not isinstance(opt, torch.optim.Optimizer):
            raise WorkloadError(
                f"Workload {self.name!r}: optimizer factory must return a torch.optim.Optimizer, "
                f"but returned {type(opt).__name__}."
            )
        return opt


def block_names(model: torch.nn.Module, names: Sequence[str], *, workload: str) -> tuple[str, ...]:
    """Check that every name is a submodule of ``model`` and return them as a tuple."""
    if len(names) == 0:
        raise WorkloadError(f"Workload {workload!r}: blocks must name at least one module, but got [].")
    for name in names:
        try:
            model.get_submodule(name)
        except AttributeError:
            raise WorkloadError(
                f"Workload {workload!r}: blocks names {name!r}, which is not a submodule of the model."
            ) from None
    if len(set(names)) != len(names):
        raise WorkloadError(f"Workload {workload!r}: blocks has duplicates: {list(names)!r}.")
    return tuple(names)


def find_blocks(model: torch.nn.Module, *, workload: str = "?") -> tuple[str, ...]:
    """Auto-detect the blocks: the children of the largest ``ModuleList``/``Sequential`` whose
    children all have one type (largest = most children, then most parameters).

    Raises:
        WorkloadError: if the model has no such container (pass ``blocks=`` explicitly then).
    """
    import torch

    best: tuple[int, int, str, torch.nn.Module] | None = None
    for name, module in model.named_modules():
        if not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
            continue
        children = list(module.children())
        if len(children) < 2 or len({type(c) for c in children}) != 1:
            continue
        if sum(p.numel() for p in module.parameters()) == 0:
            continue
        key = (len(children), sum(p.numel() for p in module.parameters()), name, module)
        if best is None or key[:2] > best[:2]:
            best = key
    if best is None:
        raise WorkloadError(
            f"Workload {workload!r}: cannot auto-detect blocks (no nn.ModuleList or nn.Sequential "
            "of two or more same-typed modules with parameters); pass blocks=[...] to Workload."
        )
    prefix = f"{best[2]}." if best[2] else ""
    return tuple(f"{prefix}{child}" for child, _ in best[3].named_children())


def load_workload(ref: str) -> Workload:
    """Resolve a workload reference.

    ``ref`` is a built-in name (see ``autotune workloads``), ``random:SEED`` for a generated
    architecture, ``path/to/file.py:build`` or ``package.module:build``. The function named after
    the colon is called with no arguments and must return a :class:`Workload`.

    Raises:
        WorkloadError: with one line saying which file or name failed and what was expected.
    """
    from autotune import zoo

    if ref in zoo.BUILTINS:
        return dataclasses.replace(zoo.BUILTINS[ref].build(), source=ref)
    if ref.startswith("random:"):
        return dataclasses.replace(zoo.random_workload_from_ref(ref), source=ref)
    if ":" not in ref:
        names = ", ".join(sorted(zoo.BUILTINS))
        raise WorkloadError(
            f"unknown workload {ref!r}: expected a built-in name ({names}), 'random:SEED', "
            "'path/to/file.py:build' or 'package.module:build'"
        )
    target, _, attr = ref.rpartition(":")
    if not attr.isidentifier():
        raise WorkloadError(f"workload {ref!r}: {attr!r} after ':' is not a Python function name")
    module = _import_target(target, ref)
    fn = getattr(module, attr, None)
    if fn is None:
        raise WorkloadError(f"workload {ref!r}: {target!r} has no attribute {attr!r}")
    if not callable(fn):
        raise WorkloadError(f"workload {ref!r}: {attr!r} is a {type(fn).__name__}, expected a function")
    try:
        workload = fn()
    except WorkloadError:
        raise
    except Exception as e:  # the user's build() failed: report it in one line, keep the chain
        raise WorkloadError(f"workload {ref!r}: {attr}() raised {type(e).__name__}: {e}") from e
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"workload {ref!r}: {attr}() returned {type(workload).__name__}, expected autotune.Workload"
        )
    return dataclasses.replace(workload, source=_absolute(ref, target, attr))


def _absolute(ref: str, target: str, attr: str) -> str:
    """A file reference with an absolute path, valid from any working directory."""
    return f"{Path(target).resolve()}:{attr}" if _is_file(target) else ref


def _is_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _import_target(target: str, ref: str) -> Any:
    is_file = _is_file(target)
    try:
        if not is_file:
            return importlib.import_module(target)
        path = Path(target)
        if not path.is_file():
            raise WorkloadError(f"workload {ref!r}: file {target!r} does not exist")
        name = f"_autotune_user_workload_{abs(hash(path.resolve()))}"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        spec.loader.exec_module(module)
        return module
    except WorkloadError:
        raise
    except ModuleNotFoundError as e:
        if not is_file and e.name is not None and target.startswith(e.name):
            raise WorkloadError(f"workload {ref!r}: no module named {target!r}") from None
        raise WorkloadError(f"workload {ref!r}: importing {target!r} raised {type(e).__name__}: {e}") from e
    except Exception as e:  # any error while importing user code becomes one line
        raise WorkloadError(f"workload {ref!r}: importing {target!r} raised {type(e).__name__}: {e}") from e
