"""Built-in workloads, the real-model corpus and the random-architecture generator.

================ ==========================================================================
gpt-tiny         GPT-2-style LM, ~1.3M parameters, context 64, on a synthetic Markov language
gpt-small        GPT-2-style LM, ~10.9M parameters, context 128, same kind of language
resnet-tiny      CIFAR-style ResNet-14, ~0.18M parameters, on synthetic 32x32 10-class images
mlp-digits       residual MLP, ~0.55M parameters, on scikit-learn's bundled 8x8 digits
hf-gpt2          transformers GPT2LMHeadModel, ~4.9M parameters, context 128, Markov text
hf-bert          transformers BertForMaskedLM, ~5.0M parameters, 15% masked Markov text
hf-llama         transformers LlamaForCausalLM, ~4.7M parameters, context 128, Markov text
hf-t5            transformers T5ForConditionalGeneration, ~7.5M, 64 tokens -> the next 32
hf-vit           transformers ViTForImageClassification, ~2.7M, 32x32 prototype images
hf-resnet        transformers ResNetForImageClassification, ~3.5M, bottlenecks, 64x64 images
hf-convnext      transformers ConvNextForImageClassification, ~6.4M, 64x64 images
lstm-lm          4 residual nn.LSTM blocks, ~2.2M parameters, context 128, Markov text
gru-lm           4 residual nn.GRU blocks, ~1.7M parameters, context 128, Markov text
shared-encoder   nn.TransformerEncoder classifier, ~1.0M, layer 3 is layer 0, tied head
unet-tiny        two-level UNet, ~0.6M, BatchNorm, skip concatenations, 64x64 images
varlen-lm        GPT LM, ~0.9M, 16-128 token sequences padded per batch, the longest batch last
stream-lm        GPT LM, ~0.9M, context 64, Markov text from an IterableDataset
frozen-backbone  GPT backbone, ~4.9M, embeddings and blocks frozen, a trainable classifier head
lora-lm          GPT LM, ~5.1M frozen, rank-8 LoRA adapters (~0.2M) on every projection
random:SEED      a generated architecture (mlp / attention / conv blocks), 0.05M-3M parameters
random2:SEED     the same with shared blocks, tied heads, skips, running state, dict batches
================ ==========================================================================

The ``hf-*``, ``lstm-lm``, ``gru-lm``, ``shared-encoder``, ``unet-tiny``, ``varlen-lm``,
``stream-lm``, ``frozen-backbone`` and ``lora-lm`` workloads are the *corpus*
(:mod:`autotune.zoo.corpus`): third-party model classes built from their config classes with
random initialisation (nothing is downloaded), and torch's own layers in the structures users
write (:mod:`autotune.zoo.structured`: a shared layer and a tied head, a UNet's skips;
:mod:`autotune.zoo.adapters`: frozen parameters and LoRA adapters), at any size:
``CORPUS[name].build(**overrides)``, ``CORPUS[name].tiny`` for tests. The ``hf-*`` ones need
transformers (``pip install 'torch-autotune[hf]'``). Vision models come from transformers because
torchvision (and timm, which needs it) does not import beside the local CPU torch wheel this
project is developed on (``operator torchvision::nms does not exist``).

Every builder is deterministic: building twice gives bit-identical weights and data. Importing
this package does not import torch (``autotune`` must import fast); each builder imports its
module, and torch with it, when called.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.errors import WorkloadError
from autotune.workload import Workload
from autotune.zoo.corpus import CORPUS, CorpusEntry, Requirement, build_corpus, lazy_builder

if TYPE_CHECKING:
    from typing import Unpack

    from autotune.zoo.random_arch import RandomOverrides

__all__ = [
    "ZooEntry",
    "BUILTINS",
    "CORPUS",
    "CorpusEntry",
    "Requirement",
    "build_corpus",
    "random_workload",
    "random_workload_from_ref",
    "RANDOM_PREFIXES",
]

#: The reference prefix of each version of the random architectures (``random2:SEED``).
RANDOM_PREFIXES = {"random": 1, "random2": 2}


@dataclass(frozen=True, kw_only=True)
class ZooEntry:
    """A built-in workload: its name, a one-line description, its builder, where its model class
    comes from (``source``: ``autotune`` or e.g. ``transformers 5.23.0 GPT2LMHeadModel``, with the
    version installed when the entry was made) and the optional dependency it needs, if any."""

    name: str
    description: str
    build: Callable[[], Workload]
    source: str = "autotune"
    requires: Requirement | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise WorkloadError(f"ZooEntry.name must be a non-empty string, but got {self.name!r}.")
        if not isinstance(self.description, str) or not self.description:
            raise WorkloadError(f"ZooEntry.description must be a non-empty string, but got {self.description!r}.")
        if not callable(self.build):
            raise WorkloadError(f"ZooEntry.build must be callable, but got {self.build!r}.")
        if not isinstance(self.source, str) or not self.source:
            raise WorkloadError(f"ZooEntry.source must be a non-empty string, but got {self.source!r}.")


BUILTINS: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry(
            name="gpt-tiny",
            description="GPT-2-style LM, 1.3M params, 6 layers x 128, context 64, synthetic Markov text",
            build=lazy_builder("autotune.zoo.gpt", "build_gpt_tiny"),
        ),
        ZooEntry(
            name="gpt-small",
            description="GPT-2-style LM, 10.9M params, 6 layers x 384, context 128, synthetic Markov text",
            build=lazy_builder("autotune.zoo.gpt", "build_gpt_small"),
        ),
        ZooEntry(
            name="resnet-tiny",
            description="CIFAR-style ResNet-14, 0.18M params, synthetic 32x32 RGB images, 10 classes",
            build=lazy_builder("autotune.zoo.resnet", "build_resnet_tiny"),
        ),
        ZooEntry(
            name="mlp-digits",
            description="residual MLP, 0.55M params, 4 blocks x 256, scikit-learn digits (8x8, 10 classes)",
            build=lazy_builder("autotune.zoo.mlp", "build_mlp_digits"),
        ),
        *(
            ZooEntry(name=c.name, description=c.description, build=c.build, source=c.source, requires=c.requires)
            for c in CORPUS.values()
        ),
    )
}


def random_workload(seed: int, *, version: int = 1, **overrides: Unpack[RandomOverrides]) -> Workload:
    """A generated architecture with learnable data, identical for identical ``seed``.

    ``overrides`` fix fields of the drawn architecture (``block_type``, ``depth``, ``width``,
    ``seq_len``, ``in_features``, ``num_classes``, ``batch_size``); the other fields are drawn to
    fit the size bounds. ``version`` 2 adds the structures users write beyond a chain of blocks
    (shared modules, skips, running state, dict batches, two outputs). See
    :mod:`autotune.zoo.random_arch`.

    Raises:
        WorkloadError: if ``seed`` is not an int in ``[0, 2**63)``, ``version`` not 1 or 2, or an
            override is unknown or invalid.
    """
    from autotune.zoo.random_arch import random_workload as build

    return build(seed, version=version, **overrides)


def random_workload_from_ref(ref: str) -> Workload:
    """Build the workload a ``random:SEED`` (version 1) or ``random2:SEED`` (version 2) reference names.

    Raises:
        WorkloadError: if ``ref`` is not ``random:`` or ``random2:`` followed by an integer in
            ``[0, 2**63)``.
    """
    prefix, _, seed = ref.partition(":")
    # Stricter than int(): refuse "+1", "1_0", " 1" and non-ASCII digits, which int() accepts.
    digits = seed.removeprefix("-")
    if prefix not in RANDOM_PREFIXES or not (digits.isascii() and digits.isdecimal()):
        shown = prefix if prefix in RANDOM_PREFIXES else "random"
        raise WorkloadError(f"workload {ref!r}: expected '{shown}:SEED' with an integer SEED")
    if not 0 <= int(seed) < 2**63:  # the bound of random_arch.MAX_SEED, without importing torch
        raise WorkloadError(f"workload {ref!r}: SEED must be in [0, 2**63), but got {seed}")
    return random_workload(int(seed), version=RANDOM_PREFIXES[prefix])
