"""The workload contract: what the user trains.

A workload is a model, a dataset (map-style, or an ``IterableDataset``) with the collate function
that batches it, a loss function and (optionally) the names of the
model's *blocks*: the repeated units that per-block precision and activation checkpointing act
on. Users write a ``build() -> Workload`` function in a file or module; built-in workloads live
in :mod:`autotune.zoo`; :mod:`autotune.resolve` turns a reference to either into a Workload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from autotune.block_detection import BlockChoice, detect_blocks
from autotune.errors import BatchError, WorkloadError
from autotune.layer_drop import disable_layer_drop, layer_drop_of

if TYPE_CHECKING:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils.data import DataLoader, Dataset

    from autotune.loss_items import LossItems
    from autotune.worst_case import WorstCase

__all__ = ["Workload", "swap_tensors", "DEFAULT_LR", "SCAN_BATCHES"]

#: Learning rate of the default optimizer (AdamW) at the workload's reference batch size.
DEFAULT_LR = 1e-3

#: Batches of a map-style dataset scanned for the longest one (:mod:`autotune.worst_case`).
#: A scan only collates (no forward), once per workload: the cost of reading 100 of the user's
#: batches. The corpus and test workloads hold fewer, so their whole epoch is scanned and the
#: worst case is exact. A larger dataset whose longest batch may lie further declares it
#: (``Workload.worst_case_batch``) or raises ``Workload.scan_batches``.
SCAN_BATCHES = 100

LossFn = Callable[["torch.nn.Module", Any], "torch.Tensor"]
OptimizerFactory = Callable[[Iterable["torch.nn.Parameter"]], "torch.optim.Optimizer"]
CollateFn = Callable[[list[Any]], Any]


@dataclass(frozen=True, kw_only=True)
class Workload:
    """A model to train, with its data and loss.

    Args:
        name: Short identifier, used in reports and caches.
        model: An ``nn.Module`` in fp32 on the CPU. :func:`autotune.measure` trains a deep copy, so
            one workload can be measured under many configurations.
        dataset: A map-style ``torch.utils.data.Dataset`` (shuffled each epoch), or an
            ``IterableDataset`` (read in its own order, each pass an epoch; one process only:
            DeepSpeed ranks shard a map-style dataset).
        loss_fn: ``loss_fn(model, batch) -> scalar tensor``, with ``batch`` as the DataLoader yields it.
        collate_fn: Turns a list of samples into a batch, as ``DataLoader(collate_fn=...)`` (a
            padding collate); ``None`` is the DataLoader's default collate.
        blocks: Qualified names of the block modules (``model.get_submodule`` names), in forward
            order. ``None`` auto-detects them: see :func:`find_blocks`.
        optimizer: ``params -> torch.optim.Optimizer``, or an optimizer over ``model``'s
            parameters (``model.configure_optimizers(...)``, a Trainer's ``create_optimizer()``):
            each copy of the model gets one of its class with its parameter groups and options
            (:mod:`autotune.optimizers`), so groups built by module or name keep theirs. ``None``
            means AdamW at ``DEFAULT_LR``. Its learning rate is the *base* rate at
            ``batch_size``; a config may scale it.
        batch_size: The reference effective batch size: the default effective batch of a study and
            ``B_base`` in linear learning-rate scaling.
        worst_case_batch: A batch as the collate yields it at the longest shapes the data can
            produce (every sequence at the longest length): the memory model predicts at it
            (:mod:`autotune.worst_case`). ``None``: found by scanning a map-style dataset.
        scan_batches: Batches of a map-style dataset scanned for the longest one when no worst
            case is declared (collated, never run); 0: the first batch only.
        min_micro_batch: The smallest micro-batch that keeps the training what the user wrote.
            Gradient accumulation sums the same gradients as one pass over the batch only when the
            samples of a batch do not interact in the forward; BatchNorm in training normalises
            each micro-batch by its own statistics, an in-batch contrastive loss draws its
            negatives from it. ``None`` (default): 1, unless the model has BatchNorm layers that
            normalise over the batch (:attr:`batch_norm_layers`), then no accumulation at all
            (the whole per-rank batch in each micro-batch). An int: the smallest micro-batch the
            user accepts (declare it for a loss that couples samples: it cannot be detected).
        loss_items: What ``loss_fn``'s mean is over, so that a batch split into micro-batches
            trains the batch's gradient (:mod:`autotune.loss_items`): ``"auto"`` (default; a
            mapping batch with integer ``labels``, Hugging Face's convention: the count of label
            tokens, shifted or not, or of samples, that reproduces the loss's gradient, measured
            once on two samples), ``"samples"``, or ``batch -> count`` (an int or a 0-dim
            tensor: e.g. the targets that are not ``ignore_index``). The counts weigh each
            micro-batch's loss, as transformers' ``num_items_in_batch`` does.
        source: The reference this workload was loaded from (set by :func:`load_workload`), so
            other processes (DeepSpeed ranks, study workers) can rebuild it. None if built directly.

    Raises:
        WorkloadError: a field of the wrong type or out of range, a block name the model does
            not have, a map-style dataset with no sample or fewer samples than ``batch_size``;
            the message names the field and the value received.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> from autotune import Workload
        >>> def loss_fn(model, batch):
        ...     x, y = batch
        ...     return nn.functional.cross_entropy(model(x), y)
        >>> data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 2, (64,)))
        >>> model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        >>> wl = Workload(name="toy", model=model, dataset=data, loss_fn=loss_fn, batch_size=16)
        >>> wl.block_names(), wl.dataset_size  # blocks auto-detected: the two Linear layers
        (('0', '2'), 64)
    """

    name: str
    model: torch.nn.Module
    dataset: Dataset[Any]
    loss_fn: LossFn
    blocks: Sequence[str] | None = None
    optimizer: OptimizerFactory | torch.optim.Optimizer | None = None
    batch_size: int = 32
    collate_fn: CollateFn | None = None
    worst_case_batch: Any = field(default=None, compare=False)  # tensors: == would be elementwise
    scan_batches: int = SCAN_BATCHES
    min_micro_batch: int | None = None
    loss_items: str | Callable[[Any], Any] = "auto"
    source: str | None = None

    def __post_init__(self) -> None:
        import torch

        if not isinstance(self.name, str) or not self.name:
            raise WorkloadError(f"Workload.name must be a non-empty string, but got {self.name!r}.")
        if not isinstance(self.model, torch.nn.Module):
            raise WorkloadError(f"Workload.model must be a torch.nn.Module, but got {type(self.model).__name__}.")
        map_style = hasattr(self.dataset, "__getitem__") and hasattr(self.dataset, "__len__")
        if not map_style and not self.iterable:
            raise WorkloadError(
                "Workload.dataset must be a map-style Dataset (with __getitem__ and __len__) or an "
                f"IterableDataset, but got {type(self.dataset).__name__}."
            )
        if not callable(self.loss_fn):
            raise WorkloadError(f"Workload.loss_fn must be callable, but got {self.loss_fn!r}.")
        if isinstance(self.optimizer, torch.optim.Optimizer):
            from autotune.optimizers import check_over_model

            check_over_model(self.optimizer, self.model, workload=self.name)
        elif self.optimizer is not None and not callable(self.optimizer):
            raise WorkloadError(
                "Workload.optimizer must be params -> torch.optim.Optimizer, an optimizer over the model's "
                f"parameters or None, but got {type(self.optimizer).__name__}."
            )
        if self.collate_fn is not None and not callable(self.collate_fn):
            raise WorkloadError(f"Workload.collate_fn must be callable or None, but got {self.collate_fn!r}.")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise WorkloadError(f"Workload.batch_size must be an int >= 1, but got {self.batch_size!r}.")
        if not self.iterable:  # an IterableDataset has no len(): its first batch says (first_batch)
            samples = len(self.dataset)  # type: ignore[arg-type]
            if samples == 0:
                raise WorkloadError(
                    f"Workload.dataset must hold at least one sample, but got an empty {type(self.dataset).__name__}."
                )
            if self.batch_size > samples:
                # The loader would yield a smaller batch than the one every prediction and
                # learning-rate scaling assume.
                raise WorkloadError(
                    f"Workload.batch_size must be at most the dataset's {samples} samples, but got {self.batch_size}."
                )
        if not isinstance(self.scan_batches, int) or isinstance(self.scan_batches, bool) or self.scan_batches < 0:
            raise WorkloadError(f"Workload.scan_batches must be an int >= 0, but got {self.scan_batches!r}.")
        from autotune.knobs import check_min_micro_batch

        check_min_micro_batch(self.min_micro_batch, name="Workload.min_micro_batch", error=WorkloadError)
        from autotune.loss_items import check_loss_items

        check_loss_items(self.loss_items, error=WorkloadError)
        if self.worst_case_batch is not None:
            from autotune.batches import batch_size

            try:
                batch_size(self.worst_case_batch)
            except BatchError as e:
                raise WorkloadError(f"Workload.worst_case_batch: {e}") from None
        if self.blocks is not None:
            object.__setattr__(self, "blocks", tuple(self.blocks))
            block_names(self.model, self.blocks, workload=self.name)

    @property
    def iterable(self) -> bool:
        """Whether the dataset is an ``IterableDataset``: no sampler, no shuffle, no ``len()``."""
        from torch.utils.data import IterableDataset

        return isinstance(self.dataset, IterableDataset)

    @property
    def dataset_size(self) -> int | None:
        """Samples in the dataset; None for an ``IterableDataset`` (its length is unknown)."""
        return None if self.iterable else len(self.dataset)  # type: ignore[arg-type]

    def loader(self, batch_size: int, **kwargs: Any) -> DataLoader[Any]:
        """A ``DataLoader`` of the dataset with the workload's collate (``kwargs``: a sampler, ``drop_last``)."""
        from torch.utils.data import DataLoader

        return DataLoader(self.dataset, batch_size=batch_size, collate_fn=self.collate_fn, **kwargs)

    def first_batch(self, batch_size: int) -> Any:
        """The dataset's first ``batch_size`` samples (fewer if it has fewer), collated: what the
        memory model and the probes run on.

        Raises:
            WorkloadError: the dataset yields no batch (an empty ``IterableDataset``).
        """
        for batch in self.loader(batch_size):
            return batch
        raise WorkloadError(f"Workload {self.name!r}: the dataset yielded no sample; it must yield at least one.")

    @cached_property
    def batch_norm_layers(self) -> tuple[str, ...]:
        """The qualified names of the model's layers that normalise by the statistics of the batch
        they are given: every BatchNorm (``torch.nn.modules.batchnorm._BatchNorm``: BatchNorm1d/2d/3d,
        SyncBatchNorm, the lazy ones) in training mode, or without running statistics (which
        normalises by the batch's in eval mode too). A frozen BatchNorm (eval mode, or
        torchvision's ``FrozenBatchNorm2d``, not a ``_BatchNorm``) uses fixed statistics and is
        not one of them."""
        from torch.nn.modules.batchnorm import _BatchNorm

        return tuple(
            name
            for name, m in self.model.named_modules()
            if isinstance(m, _BatchNorm) and (m.training or m.running_mean is None)
        )

    @property
    def micro_batch_floor(self) -> int | None:
        """The smallest micro-batch a study, a policy or an adaptive run may split a rank's batch
        into (:func:`autotune.knobs.smallest_micro_batch`): :attr:`min_micro_batch` if given, else
        None (no accumulation) for a model with :attr:`batch_norm_layers`, else 1."""
        if self.min_micro_batch is not None:
            return self.min_micro_batch
        return None if self.batch_norm_layers else 1

    @property
    def micro_batch_reason(self) -> str:
        """Why the micro-batch has the floor it has, in a few words (for messages)."""
        if self.min_micro_batch is not None:
            return f"min_micro_batch {self.min_micro_batch}"
        layers = self.batch_norm_layers
        if not layers:
            return "any micro-batch keeps the training"
        more = f" and {len(layers) - 1} more" if len(layers) > 1 else ""
        return f"BatchNorm normalises over the micro-batch ({layers[0]}{more})"

    def micro_batch_note(self, per_rank_batch: int) -> str | None:
        """One line saying why the micro-batch may not go below what it does, or None where every
        split of ``per_rank_batch`` is open."""
        from autotune.knobs import smallest_micro_batch

        smallest = smallest_micro_batch(per_rank_batch, self.micro_batch_floor)
        if smallest <= 1:
            return None
        if self.min_micro_batch is not None:
            return f"micro-batches of at least {smallest} ({self.micro_batch_reason})"
        return (
            f"{self.micro_batch_reason}: it stays {smallest}, no accumulation (the training you wrote; "
            "min_micro_batch, --min-micro-batch in the CLI, allows smaller ones)"
        )

    @cached_property
    def loss_weighting(self) -> LossItems:
        """How a step weighs its micro-batches' losses (:func:`autotune.loss_items.resolve`; decided
        once per workload: for ``"auto"`` with labels, one measured forward and backward at one and
        two samples)."""
        import torch

        from autotune.loss_items import resolve

        # Its DataLoader draws a seed from the global generator: the user's random stream stays as it was.
        with torch.random.fork_rng(devices=[]):
            return resolve(self)

    @cached_property
    def worst_case(self) -> WorstCase:
        """The largest batch the data can produce, declared or scanned, and how it was found
        (:func:`autotune.worst_case.find_worst_case`; found once per workload)."""
        from autotune.worst_case import find_worst_case

        return find_worst_case(self)

    def collate(self, samples: list[Any]) -> Any:
        """``samples`` as one batch, with the workload's collate."""
        from torch.utils.data import default_collate

        return (self.collate_fn or default_collate)(samples)

    @property
    def held_in_16_bits(self) -> str | None:
        """The dtype of the model's floating-point parameters when every one is 16-bit (a model
        loaded with ``torch_dtype=torch.bfloat16``, Lightning's ``"bf16-true"``), else None.

        Such a model trains in that dtype whatever a configuration's precision says: autocast
        casts fp32 operands to 16 bits, and there are none, so no searcher moves its precision
        knobs (the study, ``tune``, an adaptive run, the simulator's calibration).

        Example:
            >>> import torch
            >>> from autotune import Workload
            >>> w = Workload(name="w", model=torch.nn.Linear(2, 2).bfloat16(), dataset=[torch.zeros(2)] * 4,
            ...              loss_fn=lambda m, b: m(b.bfloat16()).sum(), batch_size=2)
            >>> w.held_in_16_bits, w.held_note
            ('bfloat16', "w's parameters are bfloat16 already")
        """
        import torch

        dtypes = {p.dtype for p in self.model.parameters() if p.is_floating_point()}
        if not dtypes or not dtypes <= {torch.bfloat16, torch.float16}:
            return None
        return " and ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))

    @property
    def drops_layers(self) -> str | None:
        """The model's LayerDrop in words (``"layerdrop=0.1"``: layers skipped at random while
        training), else None. Its copies run every layer (:meth:`model_copy`); a step of the model
        itself (the user's training) may skip some, and checks a prediction only where it did not
        come in under it.

        Example:
            >>> import torch
            >>> from autotune import Workload
            >>> model = torch.nn.Linear(2, 2)
            >>> model.layerdrop = 0.1  # as a Hugging Face speech encoder holds it
            >>> w = Workload(name="w", model=model, dataset=[torch.zeros(2)] * 4, loss_fn=lambda m, b: m(b).sum(),
            ...              batch_size=2)
            >>> w.drops_layers, getattr(w.model_copy(), "layerdrop")
            ('layerdrop=0.1', 0.0)
        """
        return layer_drop_of(self.model)

    @property
    def held_note(self) -> str | None:
        """Why no reduced precision is tried on this model, in words (None: they may be)."""
        held = self.held_in_16_bits
        return None if held is None else f"{self.name}'s parameters are {held} already"

    @property
    def num_parameters(self) -> int:
        """Elements of every parameter of the model."""
        return sum(p.numel() for p in self.model.parameters())

    @property
    def fingerprint(self) -> str:
        """A short hash of the model's parameters (names, shapes, which require grad): two models
        with the same fingerprint have the same parameter layout (the same weights or not)."""
        import hashlib

        layout = "\n".join(f"{n}:{tuple(p.shape)}:{p.requires_grad}" for n, p in self.model.named_parameters())
        return hashlib.sha256(layout.encode()).hexdigest()[:12]

    @property
    def largest_parameter(self) -> int:
        """Elements of the largest parameter: what DeepSpeed's bucket sizes are fitted to."""
        return max((p.numel() for p in self.model.parameters()), default=1)

    def model_copy(self, device: torch.device | str = "cpu", *, fake: FakeTensorMode | None = None) -> torch.nn.Module:
        """A deep copy of the model on ``device``, in training mode; the model itself is untouched.
        The copy runs every layer (its LayerDrop off: :mod:`autotune.layer_drop`), the step a
        memory budget must hold, so what it is measured or profiled for is that step.

        The analyses (the memory profile, its checks, the block scan) run on the host, and a model a
        framework already moved to the GPU must not be copied there first: every parameter and
        buffer is copied straight to ``device`` (tied weights stay tied; gradients are not copied).
        With ``fake``, the copy is made of ``fake``'s fake tensors: shapes only, nothing allocated
        on any device.
        """
        import copy
        import itertools

        import torch

        target = torch.device(device)
        state = list(itertools.chain(self.model.parameters(), self.model.buffers()))
        memo: dict[int, Any] = {}
        if fake is not None:
            from torch._subclasses.fake_tensor import FakeCopyMode

            with FakeCopyMode(fake):
                model = copy.deepcopy(self.model, memo)
            if any(not _on(t, target) for t in state):
                with fake:
                    swap_tensors(model, lambda t: t.to(target))
        else:
            for t in state:
                if id(t) not in memo and not _on(t, target):
                    moved = t.detach().to(target, copy=True)
                    memo[id(t)] = (
                        torch.nn.Parameter(moved, t.requires_grad) if isinstance(t, torch.nn.Parameter) else moved
                    )
            model = copy.deepcopy(self.model, memo)
        _repoint_patched_forwards(model, memo)
        disable_layer_drop(model)
        return model.train()

    def block_names(self) -> tuple[str, ...]:
        """The block names: the declared ones, else the auto-detected ones."""
        if self.blocks is not None:
            return tuple(self.blocks)
        return self.block_choice().names

    def block_choice(self) -> BlockChoice:
        """The blocks and why they are the blocks: declared in ``blocks``, else the rule of
        :func:`find_blocks` that found them (``choice.describe()`` is the line the CLI says).
        Detected once per module tree: a module added, removed or replaced detects them again."""
        if self.blocks is not None:
            return BlockChoice(tuple(self.blocks), f"{len(self.blocks)} declared in Workload.blocks")
        # Every prediction asks for the blocks, and the simulator's memory tables are 2,400
        # predictions: detecting them each time was most of a prediction's time.
        tree = tuple(map(id, self.model.modules()))
        cached = self.__dict__.get("_detected")
        if cached is None or cached[0] != tree:
            cached = (tree, detect_blocks(self.model, workload=self.name))
            self.__dict__["_detected"] = cached  # frozen fields; a cache beside them, as cached_property's
        return cached[1]

    def make_optimizer(self, params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        """The workload's optimizer over ``params`` (AdamW at ``DEFAULT_LR`` when none is given).

        Args:
            params: The parameters to optimize (of a copy of the model).

        Returns:
            The optimizer, at the base learning rate.

        Raises:
            WorkloadError: the factory returned something other than a ``torch.optim.Optimizer``.
        """
        import torch

        if self.optimizer is None:
            return torch.optim.AdamW(params, lr=DEFAULT_LR)
        if isinstance(self.optimizer, torch.optim.Optimizer):
            from autotune.optimizers import rebuilt

            return rebuilt(self.optimizer, self.model, params)
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


def _repoint_patched_forwards(model: torch.nn.Module, memo: dict[int, Any]) -> None:
    """Point the forwards that libraries patched onto ``model``'s modules at the copy.

    ``copy.deepcopy`` copies a function by reference. A forward patched onto an instance as a
    closure over the original's bound ``forward`` (TRL's ``SFTTrainer`` fused LM head does:
    ``original_forward = model.forward``, then ``model.forward = MethodType(_fused_forward,
    model)``; Accelerate then wraps that function in its autocast) would run the original's
    modules, with the original's weights, from every copy: a copy made of fake tensors fails on
    the first real one. Each instance attribute that is a method or function is rebuilt where
    its closures (through the functions and callable objects they hold: Accelerate's
    ``ConvertOutputsToFp32``) reach a part of the model (``memo``: what the copy replaced), with
    that part's copy in their place.
    """
    import types

    rebuilt: dict[int, Any] = {}

    def repoint(value: Any, depth: int) -> Any:
        if isinstance(value, types.MethodType):
            func, owner = repoint(value.__func__, depth), memo.get(id(value.__self__), value.__self__)
            return value if func is value.__func__ and owner is value.__self__ else types.MethodType(func, owner)
        if id(value) in memo:
            return memo[id(value)]
        if _callable_object(value) and depth <= 8:
            if id(value) not in rebuilt:
                fields = {k: repoint(v, depth + 1) for k, v in vars(value).items()}
                changed = {k: v for k, v in fields.items() if v is not vars(value)[k]}
                # Not copy.copy: Accelerate's wrapper refuses to be pickled, which copy.copy asks.
                twin = value if not changed else object.__new__(type(value))
                vars(twin).update(fields)
                rebuilt[id(value)] = twin
            return rebuilt[id(value)]
        if not isinstance(value, types.FunctionType):
            return value
        if not value.__closure__ or depth > 8:  # decorators nest a few deep; a cycle stops here
            return value
        if id(value) not in rebuilt:
            cells = tuple(_cell(repoint, c, depth + 1) for c in value.__closure__)
            if all(new is old for new, old in zip(cells, value.__closure__, strict=True)):
                rebuilt[id(value)] = value
            else:
                func = types.FunctionType(value.__code__, value.__globals__, value.__name__, value.__defaults__, cells)
                func.__kwdefaults__ = value.__kwdefaults__
                func.__dict__.update(value.__dict__)  # functools.wraps' __wrapped__, which signatures follow
                rebuilt[id(value)] = func
        return rebuilt[id(value)]

    for module in model.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, types.MethodType | types.FunctionType):
                new = repoint(value, 0)
                if new is not value:
                    setattr(module, name, new)


def _callable_object(value: Any) -> bool:
    """An instance that stands in for a function (a wrapper class with ``__call__``), not a module."""
    import types

    import torch

    return (
        not isinstance(
            value, type | torch.nn.Module | types.FunctionType | types.MethodType | types.BuiltinFunctionType
        )
        and callable(value)
        and hasattr(value, "__dict__")
        and "__call__" in vars(type(value))
    )


def _cell(repoint: Callable[[Any, int], Any], cell: Any, depth: int) -> Any:
    """``cell`` itself, or a new cell with ``repoint`` of its contents where they differ."""
    import types

    try:
        contents = cell.cell_contents
    except ValueError:  # an empty cell (a name the closure assigns later)
        return cell
    new = repoint(contents, depth)
    return cell if new is contents else types.CellType(new)


def _on(t: torch.Tensor, device: torch.device) -> bool:
    return t.device.type == device.type and (t.device.index or 0) == (device.index or 0)


def swap_tensors(model: torch.nn.Module, convert: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Replace every parameter and buffer of ``model``, in place, by ``convert`` of it.

    One new object per tensor, so tied parameters (and shared buffers) stay tied; a parameter
    stays a parameter with its ``requires_grad``. ``Module.to`` cannot swap fake tensors in place.
    """
    import torch

    new: dict[int, torch.Tensor] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                if id(p) not in new:
                    new[id(p)] = torch.nn.Parameter(convert(p.detach()), requires_grad=p.requires_grad)
                module._parameters[name] = new[id(p)]  # type: ignore[assignment]
        for name, b in module._buffers.items():
            if b is not None:
                new.setdefault(id(b), convert(b))
                module._buffers[name] = new[id(b)]
