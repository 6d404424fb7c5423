"""What a loss averages over, so that a batch split into micro-batches trains the batch's gradient.

``loss_fn`` returns a mean. Split into micro-batches, a batch's mean loss is the micro-batches'
means weighted by each one's share of what the mean is over: its samples for a per-sample mean (a
classifier's cross-entropy), its label tokens for a token mean (a language model's cross-entropy
over the labels that are not -100: padding and masked prompts do not count). Weighting a token
mean by samples trains another gradient than the user's batch does: on a transformers GPT-2 with
16 sequences of 8-256 tokens it moved the gradient by 17% of its norm at two micro-batches and by
78% at one sample each (docs/benchmarks.md, "A split batch's gradient"). It is the
gradient-accumulation error transformers fixed in 4.46 by passing ``num_items_in_batch`` to the
loss (huggingface/transformers#34191).

:func:`resolve` decides the rule for a workload (``Workload.loss_items``):

* ``"samples"``: every sample weighs the same (what every trainer did before);
* a callable ``batch -> int | Tensor``: the user's own count of what their loss averages over
  (nanoGPT's targets that are not -1, say);
* ``"auto"`` (default): a batch that is a mapping with an integer ``labels`` tensor (Hugging Face's
  convention) is weighted by the count that reproduces the user's own gradient, **measured**: two
  samples of the dataset whose counts differ are run as one micro-batch and as two (eval mode,
  one forward and backward each, the model's ``.grad`` untouched), and the count whose weighting
  of the two gradients gives the pair's gradient is the rule (gradients, not losses: at random
  initialisation every sample's loss is about the same, while their gradients differ): the label
  tokens (``labels != -100``; a collate's ``shift_labels`` where it gives one), the shifted
  ones (``labels[..., 1:] != -100``: a causal language model's loss predicts each token from the
  ones before it, so the first label is never a target), or the samples. Where every sample of
  the first batch holds the same count, all three weigh equal-sized micro-batches alike, and
  nothing runs. Anything else is weighted by samples.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from autotune.batches import batch_size, map_tensors, select_rows
from autotune.errors import one_line

if TYPE_CHECKING:
    from autotune.workload import Workload

__all__ = ["IGNORE_INDEX", "LossItems", "check_loss_items", "resolve"]

#: The label that no loss term counts: torch's ``cross_entropy`` default, Hugging Face's padding label.
IGNORE_INDEX = -100

#: Samples of the first batch scanned for two whose counts differ (counted only: no forward).
_SCAN = 64

Count = Callable[[Any], "int | torch.Tensor"]


@dataclass(frozen=True)
class LossItems:
    """How a step weighs its micro-batches' losses.

    Attributes:
        name: The rule, in words (``"samples"``, ``"label tokens (labels != -100)"``, ...).
        count: What one micro-batch's loss averages over (a count, an int or a 0-dim tensor);
            None: its samples.
        line: One line saying what was found and how (for the run's progress).
        measured: Whether the rule was measured on the user's loss.
    """

    name: str
    count: Count | None
    line: str
    measured: bool = False

    @property
    def said(self) -> bool:
        """Whether a run says :attr:`line`: the rule is not plain samples, or was measured."""
        return self.count is not None or self.measured


SAMPLES = LossItems("samples", None, "loss weighting: each micro-batch by its samples")


def check_loss_items(value: object, *, error: type[Exception]) -> None:
    """Refuse a ``loss_items`` that is not ``"auto"``, ``"samples"`` or a callable."""
    if value in ("auto", "samples") or (callable(value) and not isinstance(value, str)):
        return
    raise error(f"Workload.loss_items must be 'auto', 'samples' or a callable batch -> count, but got {value!r}.")


def _labels(batch: Any) -> torch.Tensor | None:
    if not isinstance(batch, Mapping):
        return None
    for key in ("shift_labels", "labels"):
        labels = batch.get(key)
        if isinstance(labels, torch.Tensor) and not labels.is_floating_point() and labels.dim() >= 1:
            return labels
    return None


def label_tokens(batch: Any) -> torch.Tensor:
    """The label tokens a loss counts: ``shift_labels`` (a collate's, already shifted) or ``labels``
    that are not -100."""
    labels = _labels(batch)
    assert labels is not None
    return torch.count_nonzero(labels.ne(IGNORE_INDEX))


def shifted_label_tokens(batch: Any) -> torch.Tensor:
    """A causal language model's targets: ``labels[..., 1:]`` that are not -100 (``shift_labels``,
    already shifted, as they are)."""
    labels = _labels(batch)
    assert labels is not None
    given = isinstance(batch, Mapping) and batch.get("shift_labels") is labels
    targets: torch.Tensor = labels if given else labels[..., 1:]
    return torch.count_nonzero(targets.ne(IGNORE_INDEX))


def _samples(batch: Any) -> int:
    return batch_size(batch)


_RULES: tuple[tuple[str, Count], ...] = (
    ("label tokens (labels != -100)", label_tokens),
    ("shifted label tokens (labels[..., 1:] != -100)", shifted_label_tokens),
    ("samples", _samples),
)


def resolve(workload: Workload) -> LossItems:
    """The rule ``workload``'s steps weigh micro-batches by (the module docstring says how).

    A measured rule runs ``workload.loss_fn`` and its gradient on ``workload.model`` three times at
    one and two samples, in eval mode (``torch.autograd.grad``: the model's ``.grad`` untouched), the
    RNG state and every module's mode restored.
    """
    given = workload.loss_items
    if given == "samples":
        return LossItems("samples", None, "loss weighting: each micro-batch by its samples (Workload.loss_items)")
    if callable(given):
        return LossItems("your loss_items", given, "loss weighting: each micro-batch by your Workload.loss_items")
    first = workload.first_batch(min(_SCAN, workload.dataset_size or _SCAN))
    if _labels(first) is None:
        return SAMPLES
    pair = _distinct_pair(first)
    if pair is None:
        return LossItems(
            "samples", None, "loss weighting: each micro-batch by its samples (every sample holds as many labels)"
        )
    start = time.perf_counter()
    both = _trimmed(select_rows(first, torch.tensor(pair)))
    try:
        sketches = [_sketch(workload, part) for part in (both, *(select_rows(both, torch.tensor([i])) for i in (0, 1)))]
    # The user's loss on one sample in eval mode: whatever it raises leaves the weighting as it was.
    except Exception as e:
        return LossItems(
            "samples",
            None,
            f"loss weighting: each micro-batch by its samples: the loss on one sample could not be measured "
            f"({one_line(e)}); Workload.loss_items says what your loss averages over",
            measured=True,
        )
    errors = {name: float((_weighted(count, both, sketches[1:]) - sketches[0]).norm()) for name, count in _RULES}
    scale = max(float(sketches[0].norm()), 1e-12)
    tolerance = 5e-2 if _held_in_16_bits(workload.model) else 1e-3
    name = min(errors, key=lambda n: (errors[n], n != "samples"))  # samples where it is as good
    seconds = time.perf_counter() - start
    counts = [int(label_tokens(select_rows(both, torch.tensor([i])))) for i in (0, 1)]
    how = f"the pair's gradient from its two halves, measured on two samples of {counts[0]} and {counts[1]} labels"
    if errors[name] > tolerance * scale:
        return LossItems(
            "samples",
            None,
            f"loss weighting: each micro-batch by its samples: neither its samples nor its label tokens give "
            f"{how} (closest {errors[name] / scale:.1e} off); Workload.loss_items says what your loss averages over "
            f"({seconds:.1f} s)",
            measured=True,
        )
    count = dict(_RULES)[name]
    if name == "samples":
        return LossItems(
            "samples", None, f"loss weighting: each micro-batch by its samples ({how}, {seconds:.1f} s)", measured=True
        )
    return LossItems(name, count, f"loss weighting: each micro-batch by its {name} ({how}, {seconds:.1f} s)", True)


def _distinct_pair(batch: Any) -> tuple[int, int] | None:
    """Two samples of ``batch`` whose label counts differ (every rule's shares differ where two
    such samples exist), the shortest such pair (their measurement costs what they hold), or None."""
    n = batch_size(batch)
    rows = [select_rows(batch, torch.tensor([i])) for i in range(n)]
    counts = [(int(label_tokens(one)), int(shifted_label_tokens(one))) for one in rows]
    extents = [_extent(one) for one in rows]
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n) if counts[i][0] != counts[j][0]]
    # Three different shares where possible: samples 1/2, tokens a0/(a0+b0), shifted a1/(a1+b1).
    distinct = [(i, j) for i, j in pairs if counts[i][0] * counts[j][1] != counts[i][1] * counts[j][0]]
    return min(distinct or pairs, key=lambda p: (max(extents[p[0]], extents[p[1]]), p), default=None)


def _extent(batch: Any) -> int:
    """Where a right-padded batch's last label or attended token is, plus one (its padded length
    where it has neither, or is not a mapping)."""
    labels = _labels(batch)
    assert labels is not None
    marks = labels.ne(IGNORE_INDEX)
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.shape == labels.shape:
        marks = marks | mask.bool()
    if labels.dim() < 2:
        return 1
    used = marks.reshape(labels.shape[0], labels.shape[1], -1).any(dim=(0, 2)).nonzero()
    return int(used.max()) + 1 if used.numel() else int(labels.shape[1])


def _trimmed(batch: Any) -> Any:
    """``batch`` without the sequence positions after its last label and attended token: right
    padding, which changes no loss (a causal model's real tokens never see it, a mask hides it),
    and costs the measurement what it holds (a sequence padded to 1024 tokens, 1024 positions)."""
    labels = _labels(batch)
    assert labels is not None
    if labels.dim() < 2:
        return batch
    length, end = labels.shape[1], _extent(batch)
    return map_tensors(lambda t: t[:, :end] if t.dim() >= 2 and t.shape[1] == length else t, batch)


def _weighted(count: Count, both: Any, sketches: list[torch.Tensor]) -> torch.Tensor:
    k = [float(count(select_rows(both, torch.tensor([i])))) for i in (0, 1)]
    return (k[0] * sketches[0] + k[1] * sketches[1]) / (k[0] + k[1])


def _sketch(workload: Workload, batch: Any) -> torch.Tensor:
    """The gradient of ``workload``'s loss on ``batch``, subsampled (at most ~1024 entries of each
    trainable parameter, a fixed stride: linear, so a weighting of two gradients is that of their
    sketches), with the loss appended; in fp32 on the host."""
    model = workload.model
    params = [p for p in model.parameters() if p.requires_grad]
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    modes = {m: m.training for m in model.modules()}
    model.eval()  # no dropout: the three forwards compute the same function
    try:
        with torch.enable_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            loss = workload.loss_fn(model, map_tensors(lambda t: t.to(device), batch))
            grads = torch.autograd.grad(loss, params, allow_unused=True) if params and loss.requires_grad else ()
        parts = [g.flatten()[:: max(1, g.numel() // 1024)].float() for g in grads if g is not None]
        return torch.cat([*(p.cpu() for p in parts), loss.detach().float().reshape(1).cpu()])
    finally:
        for m, training in modes.items():
            m.training = training


def _held_in_16_bits(model: torch.nn.Module) -> bool:
    return any(p.dtype in (torch.bfloat16, torch.float16) for p in model.parameters())
