"""Selective activation recompute: which operations of a block keep their outputs for backward.

A block at ``TrainConfig.checkpoint="selective"`` runs under non-reentrant
``torch.utils.checkpoint`` with :func:`selective_contexts` as its ``context_fn``
(``torch.utils.checkpoint.create_selective_checkpoint_contexts``): the outputs of the operations
in :data:`SAVED_OPS` are kept from the forward (``CheckpointPolicy.MUST_SAVE``) and every other
operation is recomputed in backward (``PREFER_RECOMPUTE``), as in Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models", Sec. 5: recompute what is
cheap to recompute and large to keep).

Why these operations: they are where a block's compute is (a matmul or a convolution costs
O(k) multiply-adds per output element, attention O(sequence)), while what lies between them
(norms, activations, dropout, residual sums, casts) costs a few operations per element: saving
the matmul-like outputs makes the recompute cheap, and recomputing the rest drops the many
elementwise intermediates. The list follows torchtitan's ``_save_list``
(``torchtitan/distributed/activation_checkpoint.py``: ``aten.mm`` and the fused attention
kernels) and xformers' default allow-list (``aten.mm``, ``aten.addmm``), widened to what eager
PyTorch dispatches for the same layers here: ``nn.Linear`` reaches the dispatcher as ``addmm``
(2-D input with bias) or ``mm``, batched ``matmul`` as ``bmm``/``baddbmm``,
``F.scaled_dot_product_attention`` as one fused kernel per backend (``_for_cpu`` on the host),
``nn.Conv*d`` as ``convolution``. Unlike torchtitan we save *every* matmul (it recomputes every
second ``mm`` to save more memory): one stateless rule, the same in the forward, the recompute
and the memory model's fake run. Attention's math fallback is not an operator of its own (it
dispatches ``bmm`` and ``softmax``), so its ``bmm`` outputs are kept and the softmax recomputed.
Recurrent kernels (``nn.LSTM``) are left out: their output is not what backward needs (their
workspace is), so saving it would keep bytes and still recompute the kernel.

A kept output that the block later changes in place (``F.relu(conv(x), inplace=True)``) makes
torch raise in backward rather than compute wrong gradients (``allow_cache_entry_mutation``
stays off): such a block cannot be recomputed selectively.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

__all__ = ["SAVED_OPS", "saved_output", "selective_contexts", "selective_policy"]

_SAVED_NAMES = (
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "_addmm_activation",
    "_scaled_mm",
    "convolution",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)

#: The ATen operations whose outputs a selectively recomputed block keeps (the ``.default``
#: overload of each name above that this build of torch has).
SAVED_OPS: frozenset[Any] = frozenset(
    getattr(torch.ops.aten, name).default for name in _SAVED_NAMES if hasattr(torch.ops.aten, name)
)


def saved_output(op: Any) -> bool:
    """Whether a selectively recomputed block keeps the output of ``op`` (an ATen ``OpOverload``)."""
    return op in SAVED_OPS


def selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """The policy ``create_selective_checkpoint_contexts`` asks for every operation: keep the
    outputs of :data:`SAVED_OPS`, recompute the rest.

    Example:
        >>> import torch
        >>> selective_policy(None, torch.ops.aten.mm.default)
        <CheckpointPolicy.MUST_SAVE: 0>
        >>> selective_policy(None, torch.ops.aten.gelu.default)
        <CheckpointPolicy.PREFER_RECOMPUTE: 3>
    """
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_contexts() -> tuple[Any, Any]:
    """A fresh (forward, recompute) context pair for one checkpoint invocation: the ``context_fn``
    of ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``."""
    contexts: tuple[Any, Any] = create_selective_checkpoint_contexts(selective_policy)
    return contexts
