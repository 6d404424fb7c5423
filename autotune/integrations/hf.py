"""``AutotuneCallback`` for the Hugging Face ``transformers.Trainer``.

What it changes mid-run, and what it cannot:

* **Per-block precision** (bf16 autocast islands around the blocks the model declares in
  ``_no_split_modules``) and **per-block activation checkpointing**: both live on the model, so
  any loop honours them from the next forward pass.
* **Not the micro-batch**: the Trainer's DataLoader is built once with
  ``per_device_train_batch_size``.
* **Not the gradient accumulation**: ``Trainer._inner_training_loop`` computes the optimizer steps
  per epoch, the LR scheduler's length and the step arithmetic that decides when to sync from
  ``args.gradient_accumulation_steps`` before the first step, so a change mid-run would desync
  them (and, with the micro-batch fixed, would change the effective batch, which stays the user's).
* **Not fp16 blocks**, unless ``fp16=True``: they need the loss scaler inside the Trainer's backward.

**Your flags are its start** (:mod:`autotune.integrations._flags`), said in one line
(an ``AutotuneWarning``, and the history's first change, source ``"flags"``):

* ``activation_checkpointing=True`` (``gradient_checkpointing=True``), or a model you called
  ``activation_checkpointing_enable()`` on: the blocks the model recomputes are the start's
  ``checkpoint``; autotune's per-block wrappers recompute them and the model's own flags are off
  until ``on_train_end`` sets them back (a module it recomputes that is not a block: the model
  keeps its checkpointing and the checkpoint knob does not move).
* ``torch_compile=True``, or a model (or a submodule) you compiled: each change of per-block knobs
  recompiles; the callback measures it from the steps' wall seconds, counts it in each decision as
  :class:`autotune.Adaptive` does (:mod:`autotune.adapt.recompiles`), and notes what the recompiles
  cost last in the history (source ``"compile"``).
* ``bf16=True`` / ``fp16=True``: accelerate's autocast around the model's forward is the outer
  precision (``outer_precision="bf16"`` / ``"fp16"``, the blocks in it): autotune never wraps the
  forward again and never moves it; a block may become an fp32 exception. Under ``fp16=True``
  the Trainer scales the loss, so fp16 blocks are allowed there.

The decisions are :class:`autotune.Adaptive`'s (one :class:`autotune.adapt.controller.Controller`):
the start within the budget (here: recompute at the Trainer's split; if even that does not fit,
a ``ConfigError`` from ``on_train_begin``), the source's plan before the first step, the memory
model first, and measurement overruling the source; no side-by-side trials and no tracked steps
in the Trainer's loop (see :mod:`autotune.integrations._framework`). Every change is in
:attr:`AutotuneCallback.history`.

Resuming: the callback is a ``transformers.ExportableState``: its state (the configuration, every
decision and measurement) is saved in each checkpoint, and with
``TrainingArguments(restore_callback_states_from_checkpoint=True)`` the Trainer rebuilds it from
its JSON arguments and restores that state at ``on_train_begin``. A ``DecisionSource`` object
cannot be written as JSON: such a callback is refused when the Trainer rebuilds it.

Evaluation (``eval_strategy="steps"`` or ``"epoch"``) is part of the peak the budget protects,
never of the training configuration (transformers#32215): the window from the ``on_step_end`` (or
``on_epoch_end``) that asks for an evaluation to ``on_evaluate`` is bracketed (see
:mod:`autotune.integrations._framework`). The first evaluation's peak is measured
(:attr:`AutotuneCallback.evaluation_peak`: exact tracked bytes on the CPU, the allocator's
reserved peak on CUDA), noted in the history and kept in the callback's state; one over the
budget is said once (lower ``per_device_eval_batch_size``) and changes nothing in training.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from typing_extensions import override  # typing.override from Python 3.12 (typing_extensions: a torch dependency)

from autotune.adapt.recompiles import loop_compiled
from autotune.adapt.source_choice import PolicyArg
from autotune.config import TrainConfig
from autotune.errors import MissingDependencyError, UnsupportedError
from autotune.integrations._flags import LoopPrecision
from autotune.integrations._framework import FrameworkLoop
from autotune.measurement.objective import DEFAULT_OBJECTIVE, ObjectiveName
from autotune.units import MemoryBudget

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
    from transformers.trainer_callback import ExportableState
except ImportError as e:  # optional dependency: name it
    raise MissingDependencyError(
        f"autotune.integrations.hf needs transformers: pip install 'torch-autotune[hf]' ({e})."
    ) from None

from autotune.zoo.transformers_models import hf_loss, require_labels  # after the check above: it imports transformers

if TYPE_CHECKING:
    import torch

__all__ = ["AutotuneCallback", "trainer_loss"]


def trainer_loss(model: torch.nn.Module) -> Callable[[torch.nn.Module, Any], torch.Tensor]:
    """The loss the Trainer training ``model`` computes, as the memory model profiles it.

    The ``Trainer``'s is the model's own (``model(**batch).loss``, which materialises the logits).
    TRL's ``SFTTrainer`` patches a fused LM head onto the model (``add_fused_lm_head``: its
    forward takes ``fused_lm_head=True`` and scores the hidden states in chunks, never holding the
    logits) and trains on its per-token log-probabilities: profiling the model's own loss there
    would count the logits' bytes, which the run never holds.

    Example:
        >>> import transformers
        >>> from autotune.integrations.hf import trainer_loss
        >>> config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16)
        >>> trainer_loss(transformers.GPT2LMHeadModel(config)).__name__  # a plain Trainer's
        'hf_loss'
    """
    # Under mixed precision Accelerate wraps that forward in its autocast and keeps it as
    # ``_original_forward``; under PEFT the head is on the base model, which the adapter's forward
    # hands the keyword on to.
    base = getattr(model, "get_base_model", None)
    for module in (model, base()) if callable(base) else (model,):
        for name in ("forward", "_original_forward"):
            code = getattr(getattr(vars(module).get(name), "__func__", None), "__code__", None)
            if code is not None and "fused_lm_head" in code.co_varnames[code.co_argcount :][: code.co_kwonlyargcount]:
                return fused_head_loss
    return hf_loss


def fused_head_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """TRL ``SFTTrainer``'s loss (``loss_type="nll"``): the label tokens' mean negative log-probability
    through the fused LM head."""
    require_labels(batch)
    out = model(**batch, fused_lm_head=True)
    loss: torch.Tensor = -out.log_probs.sum() / out.label_mask.sum().clamp(min=1)
    return loss


class AutotuneCallback(TrainerCallback, ExportableState):
    """Adapt per-block precision and checkpointing of the Trainer's model while it trains.

    Pass it in ``transformers.Trainer(callbacks=[...])``. The micro-batch and the gradient
    accumulation stay the ``TrainingArguments``' (see the module's docstring for why); every
    decision, applied or refused, is in :attr:`history`. Resumable from the Trainer's
    checkpoints with ``TrainingArguments(restore_callback_states_from_checkpoint=True)``.

    Args:
        policy: ``"pretrained"`` (default: the shipped policy), a policy directory, a
            ``TrainConfig`` (fixed; or its ``to_dict()``, as a checkpoint holds it) or a
            ``DecisionSource`` (see :func:`autotune.adapt.decision_source`).
        memory_budget: Peak tensor bytes allowed, as for :class:`autotune.Adaptive`: ``"8GiB"``,
            bytes, ``"75%"``, or None (default: the default configuration's own peak).
        decide_every: Optimizer steps between decisions (>= 2).
        blocks: Block module names (default: auto-detected, see
            :func:`autotune.block_detection.find_blocks`).
        min_micro_batch: The smallest micro-batch a split may take (``Workload.min_micro_batch``);
            None: any, except for a model with BatchNorm layers in training (their statistics
            are the micro-batch's): then the loop's own.
        objective: Which measured configuration within the budget the run keeps: ``"per-gib"``
            (default), the most samples/s per GiB of peak, or ``"throughput"``, the most samples/s
            (as for :class:`autotune.Adaptive`).
        progress: The setup's lines at ``on_train_begin``, one per phase with its seconds, on
            stderr (as for :class:`autotune.Adaptive`); False: none. A bool: the Trainer rebuilds
            the callback from its checkpoint's JSON arguments.

    Raises:
        ConfigError: ``decide_every`` out of range; from ``on_train_begin``, nothing at the
            Trainer's split fits ``memory_budget``.
        UnsupportedError: the Trainer rebuilds it from a checkpoint whose policy was a
            ``DecisionSource`` object (JSON cannot hold it).

    Example:
        >>> from autotune.integrations.hf import AutotuneCallback
        >>> callback = AutotuneCallback(memory_budget="90%", decide_every=50)
        >>> callback.history  # every change considered, once training has begun
        []

        What a user writes (a full Trainer run, so it runs in CI as ``examples/hf_trainer.py``,
        in ``make examples``, not as a doctest)::

            from autotune.integrations.hf import AutotuneCallback

            callback = AutotuneCallback(memory_budget="90%", decide_every=50)
            trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
            trainer.train()
            for change in callback.history:
                print(change.describe())
    """

    def __init__(
        self,
        *,
        policy: PolicyArg | Mapping[str, Any] = "pretrained",
        memory_budget: MemoryBudget | str | int | None = None,
        decide_every: int = 50,
        blocks: list[str] | None = None,
        min_micro_batch: int | None = None,
        objective: ObjectiveName = DEFAULT_OBJECTIVE,
        progress: bool = True,
    ) -> None:
        if isinstance(policy, Mapping):
            if "source" in policy:  # what state() writes for a DecisionSource object
                raise UnsupportedError(
                    f"transformers rebuilds AutotuneCallback from its checkpoint's JSON arguments, which cannot hold "
                    f"the DecisionSource {policy['source']!r}: give a policy name, directory or TrainConfig to resume."
                )
            policy = TrainConfig.from_dict(policy)
        self.loop = FrameworkLoop(
            policy=policy,
            memory_budget=memory_budget,
            decide_every=decide_every,
            blocks=blocks,
            min_micro_batch=min_micro_batch,
            objective=objective,
            progress=progress,
        )
        self._args = {
            "policy": _json_policy(policy),
            "memory_budget": _json_budget(memory_budget),
            "decide_every": decide_every,
            "blocks": blocks,
            "min_micro_batch": min_micro_batch,
        }
        if objective != DEFAULT_OBJECTIVE:  # a checkpoint of a per-GiB run keeps the arguments it had
            self._args["objective"] = objective
        if not progress:
            self._args["progress"] = False
        self._logged = 0

    @override
    def state(self) -> dict[str, Any]:
        """``ExportableState``: the arguments the Trainer rebuilds the callback with, and the
        adaptive state (:meth:`FrameworkLoop.state_dict`), restored at ``on_train_begin``."""
        return {"args": dict(self._args), "attributes": {"resume_state": self.loop.state_dict()}}

    @property
    def resume_state(self) -> dict[str, Any]:
        """The adaptive state (what ``state()`` saves); set by the Trainer when it restores a checkpoint."""
        return self.loop.state_dict()

    @resume_state.setter
    def resume_state(self, state: dict[str, Any]) -> None:
        if state:
            self.loop.load_state_dict(state)

    @property
    def history(self) -> list[Any]:
        """Every change considered so far, applied or not, oldest first (:class:`~autotune.adapt.records.Change`)."""
        return self.loop.history

    @property
    def evaluation_peak(self) -> int | None:
        """The first evaluation's measured peak bytes (None: none ran under the callback yet)."""
        return self.loop.evaluation_peak

    @override
    def on_train_begin(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        model: torch.nn.Module | None = None,
        train_dataloader: torch.utils.data.DataLoader[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        """Read your flags (``activation_checkpointing``, ``bf16``, ``fp16``, the model's own
        checkpointing), profile the model, resolve the budget, put the run at its start.

        Raises:
            ConfigError: nothing the Trainer lets change (per-block recompute at its split) fits
                the memory budget: raised here, before the first step, rather than training on
                over the budget the user gave.
        """
        assert model is not None, "the Trainer passes its model to on_train_begin"
        dataset = train_dataloader.dataset if train_dataloader is not None else None
        self.loop.begin(
            model,
            dataset,
            trainer_loss(model),
            micro_batch_size=args.per_device_train_batch_size,
            accum=args.gradient_accumulation_steps,
            name=type(model).__name__,
            collate_fn=getattr(train_dataloader, "collate_fn", None),
            precision=loop_precision(args),
            checkpoint_flag=_checkpoint_flag(args),
            compiled=_compiled(args, model),
            optimizer=kwargs.get("optimizer"),  # the Trainer's (accelerate's wrapper around it)
        )

    @override
    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Start the step's measurement window (the CUDA allocator's peaks; a tracked step on the CPU)."""
        self.loop.step_begin()

    @override
    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Before the Trainer's ``optimizer.step()`` (after clipping): a NaN or infinite gradient is
        dropped, every gradient set to None, so the weights and the optimizer's state stay the step
        before's; then the NaN rule (:meth:`FrameworkLoop.before_optimizer_step`). Not under
        ``fp16``: its GradScaler skips such a step itself (an overflow).

        Raises:
            NonFiniteLossError: a gradient is not finite and the run decides: out of
                ``trainer.train()``, before the optimizer and the LR scheduler step.
        """
        model = kwargs.get("model")
        if args.fp16 or model is None:
            return
        self.loop.before_optimizer_step(state.global_step + 1, model.parameters())

    @override
    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Close the step: its loss from the Trainer's logs, its peak, a decision every
        ``decide_every`` steps; open the evaluation window when the Trainer evaluates next."""
        # Losses come from the Trainer's own logs (every ``logging_steps``): no extra sync.
        losses = [e["loss"] for e in state.log_history[self._logged :] if "loss" in e]
        self._logged = len(state.log_history)
        self.loop.step_end(state.global_step, losses[-1] if losses else None)
        if control.should_evaluate:  # set by the Trainer's flow callback, before this one
            self.loop.evaluation_begin(*_optimizers(kwargs))

    @override
    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Open the evaluation window when the Trainer evaluates at the epoch's end (``eval_strategy="epoch"``)."""
        if control.should_evaluate:  # eval_strategy="epoch"
            self.loop.evaluation_begin(*_optimizers(kwargs))

    @override
    def on_prediction_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Count one evaluation batch (the first evaluation is measured, once)."""
        self.loop.evaluation_batch()

    @override
    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        """Close the evaluation window: its peak is kept, and said once if over the budget; the
        training configuration stays."""
        self.loop.evaluation_end(state.global_step, lower="per_device_eval_batch_size")

    @override
    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        """Note what recompiles cost on a compiled model; take the per-block wrappers off the model:
        it is left as it was given."""
        self.loop.finish(state.global_step)
        self.loop.remove()


def loop_precision(args: TrainingArguments) -> LoopPrecision:
    """The Trainer's own autocast, from ``args``: accelerate wraps the model's forward in it.

    Args:
        args: The Trainer's arguments.

    Returns:
        ``bf16=True``: outer bf16; ``fp16=True``: outer fp16; else none.
    """
    if args.bf16:
        return LoopPrecision(outer="bf16", flag="bf16=True")
    if args.fp16:
        return LoopPrecision(outer="fp16", flag="fp16=True")
    return LoopPrecision()


def _compiled(args: TrainingArguments, model: torch.nn.Module) -> str | None:
    """How the Trainer runs ``model`` compiled, in words (None: eager): ``torch_compile=True`` (accelerate
    compiles the model the callbacks are handed unwrapped), or the user's own compile."""
    if args.torch_compile:
        return "torch_compile=True"
    return "your torch.compile" if loop_compiled(model) else None


def _checkpoint_flag(args: TrainingArguments) -> str:
    """How the user turned the model's checkpointing on, as the start line names it."""
    # transformers 5 names it activation_checkpointing (gradient_checkpointing: its alias); 4, gradient_checkpointing.
    for name in ("activation_checkpointing", "gradient_checkpointing"):
        if getattr(args, name, None):
            return f"{name}=True"
    return "the model's own activation checkpointing"


def _optimizers(kwargs: Mapping[str, Any]) -> list[torch.optim.Optimizer]:
    """The Trainer's optimizer, as its callbacks get it (its state is on the device through an evaluation)."""
    optimizer = kwargs.get("optimizer")
    return [optimizer] if optimizer is not None else []


def _json_policy(policy: PolicyArg) -> Any:
    """``policy`` as the JSON a checkpoint holds (a DecisionSource object: its name, refused on rebuild)."""
    if policy is None or isinstance(policy, str):
        return policy
    if isinstance(policy, Path):
        return str(policy)
    if isinstance(policy, TrainConfig):
        return policy.to_dict()
    return {"source": policy.name}


def _json_budget(budget: MemoryBudget | str | int | None) -> str | int | None:
    """The budget as JSON the Trainer rebuilds the callback from: as given, or a MemoryBudget's
    bytes or its text (``str(MemoryBudget)``: the one form a budget is written in)."""
    if not isinstance(budget, MemoryBudget):
        return budget
    return budget.bytes if budget.bytes is not None else str(budget)
