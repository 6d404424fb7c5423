"""Pieces shared by the built-in workloads: seeded synthetic data, seeded init, the loss.

Every data generator takes an explicit seed and draws only from its own ``torch.Generator``, so a
workload built twice gets bit-identical data and the global RNG is left alone. Generation runs
once at build time and is vectorised over samples: each generator takes well under a second.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from autotune.errors import WorkloadError

__all__ = [
    "TokenSequences",
    "TensorDict",
    "seeded_init",
    "classification_loss",
    "markov_corpus",
    "language_classes",
    "prototype_images",
]


@contextmanager
def seeded_init(seed: int) -> Iterator[None]:
    """Seed the global CPU RNG for the duration of a model's construction, then restore it.

    ``nn.Module`` initialisers draw from the global RNG; forking it makes the initial weights a
    function of ``seed`` alone without disturbing the caller's random stream.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def classification_loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """Cross-entropy of ``model(inputs)`` against integer ``labels``, in fp32.

    The batch is already on the model's device (the caller moves it), so nothing is moved here.
    """
    inputs, labels = batch
    return F.cross_entropy(model(inputs).float(), labels)


class TokenSequences(Dataset[torch.Tensor]):
    """A map-style dataset of equal-length token sequences: item ``i`` is row ``i`` (a LongTensor)."""

    def __init__(self, tokens: torch.Tensor) -> None:
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise WorkloadError(
                "TokenSequences needs a 2-D LongTensor (sequences x positions), but got "
                f"{tokens.dim()}-D {tokens.dtype}."
            )
        self.tokens = tokens

    def __len__(self) -> int:
        return self.tokens.size(0)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.tokens[index]


class TensorDict(Dataset[dict[str, torch.Tensor]]):
    """A map-style dataset of named tensors with a common first dimension: item ``i`` is
    ``{name: tensor[i]}``, the batch layout of Hugging Face models (``model(**batch)``)."""

    def __init__(self, **tensors: torch.Tensor) -> None:
        sizes = {name: t.size(0) if t.dim() > 0 else None for name, t in tensors.items()}
        if not tensors or len(set(sizes.values())) != 1 or None in sizes.values():
            raise WorkloadError(
                f"TensorDict needs one or more tensors with the same first dimension, but got sizes {sizes!r}."
            )
        self.tensors = tensors

    def __len__(self) -> int:
        return next(iter(self.tensors.values())).size(0)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {name: t[index] for name, t in self.tensors.items()}


def markov_corpus(
    *,
    num_sequences: int,
    length: int,
    vocab_size: int,
    num_topics: int,
    branching: int,
    seed: int,
) -> torch.Tensor:
    """Sample sequences of a sparse, topic-switched first-order Markov "language".

    Each of ``num_topics`` topics has its own transition table in which every token has only
    ``branching`` possible successors with skewed probabilities. Each sequence draws one topic.
    Measured for the GPT workloads' settings (512 tokens, 4 topics, branching 8): unigram entropy
    ~4.2 nats, bigram conditional entropy ~2.2 nats, within a topic at most ~1.4 nats, against
    ``log(512) = 6.24``. The loss thus falls in stages: token frequencies, then bigrams, then,
    by inferring the topic from the context (attention), towards the per-topic entropy.

    Returns:
        A ``(num_sequences, length)`` LongTensor.
    """
    g = torch.Generator().manual_seed(seed)
    # Successors are drawn from a Zipf(1) law over a random ranking of the vocabulary, so token
    # frequencies are skewed as in natural text (and the unigram statistics are learned first).
    zipf = 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64)
    rank_to_token = torch.randperm(vocab_size, generator=g)
    drawn = torch.multinomial(zipf, num_topics * vocab_size * branching, replacement=True, generator=g)
    successors = rank_to_token[drawn].view(num_topics, vocab_size, branching)
    # randn * 1.5 through a softmax gives a few dominant successors per token, like real text.
    weights = torch.softmax(1.5 * torch.randn(num_topics, vocab_size, branching, generator=g), dim=-1)
    cumulative = weights.cumsum(dim=-1)
    topic = torch.randint(num_topics, (num_sequences,), generator=g)
    token = torch.randint(vocab_size, (num_sequences,), generator=g)
    out = torch.empty(num_sequences, length, dtype=torch.long)
    for t in range(length):
        out[:, t] = token
        u = torch.rand(num_sequences, 1, generator=g)
        # Inverse-CDF sampling of all sequences at once; clamp guards the rounding of cumsum < 1.
        choice = (u > cumulative[topic, token]).sum(dim=1).clamp(max=branching - 1)
        token = successors[topic, token, choice]
    return out


def language_classes(*, classes: int, num_samples: int, seq_len: int, vocab: int, seed: int) -> TensorDict:
    """``num_samples`` token sequences, each from one of ``classes`` Markov languages (one per
    class, :func:`markov_corpus` with seed ``seed + 2 + c``), shuffled with seed ``seed``:
    ``{"tokens", "labels"}``. Which language a sequence comes from is learnable from its bigrams."""
    per_class = -(-num_samples // classes)
    texts = [
        markov_corpus(
            num_sequences=per_class, length=seq_len, vocab_size=vocab, num_topics=1, branching=4, seed=seed + 2 + c
        )
        for c in range(classes)
    ]
    order = torch.randperm(per_class * classes, generator=torch.Generator().manual_seed(seed))[:num_samples]
    labels = torch.arange(classes).repeat_interleave(per_class)
    return TensorDict(tokens=torch.cat(texts)[order], labels=labels[order])


def prototype_images(
    *,
    num_images: int,
    num_classes: int,
    modes_per_class: int,
    size: int,
    noise: float,
    max_shift: int,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample RGB images of smooth random class prototypes, shifted and noised.

    Each class has ``modes_per_class`` prototypes (sub-modes), each a 4x4 random grid bilinearly
    upsampled to ``size`` x ``size``: smooth, so convolutions see spatial structure. An image is
    one of its class's prototypes, randomly contrast-scaled, cyclically shifted by up to
    ``max_shift`` pixels in each direction, plus Gaussian pixel noise of std ``noise`` (the
    prototypes have unit std). Sub-modes, shifts and noise keep a single linear template from
    solving the task; a small CNN learns it over a few hundred steps.

    Returns:
        ``(images, labels)``: a float32 ``(num_images, 3, size, size)`` tensor and a LongTensor.
    """
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(num_classes * modes_per_class, 3, 4, 4, generator=g)
    prototypes = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    prototypes = prototypes / prototypes.std(dim=(1, 2, 3), keepdim=True)
    labels = torch.arange(num_images) % num_classes
    mode = torch.randint(modes_per_class, (num_images,), generator=g)
    images = prototypes[labels * modes_per_class + mode]
    images = images * (0.7 + 0.6 * torch.rand(num_images, 1, 1, 1, generator=g))
    shifts = torch.randint(-max_shift, max_shift + 1, (num_images, 2), generator=g)
    # One roll per distinct shift rather than per image: at most (2 * max_shift + 1) ** 2 rolls.
    for dy, dx in torch.unique(shifts, dim=0).tolist():
        rows = ((shifts[:, 0] == dy) & (shifts[:, 1] == dx)).nonzero().squeeze(1)
        images[rows] = torch.roll(images[rows], shifts=(dy, dx), dims=(2, 3))
    images = images + noise * torch.randn(images.shape, generator=g)
    return images.contiguous(), labels
