"""The real-model corpus: third-party model classes as built-in workloads, at any size.

Each entry builds a model from its library's *config class* with seeded random initialisation
(never ``from_pretrained``: nothing is downloaded) on generated, learnable data. Sizes are
keyword overrides of :meth:`CorpusEntry.build`; ``CorpusEntry.sizes`` holds the built-in size
(what ``autotune workloads`` lists) and ``CorpusEntry.tiny`` a preset whose training step takes
tens of milliseconds, for tests::

    for entry in CORPUS.values():
        workload = entry.build(**entry.tiny)

This module imports neither torch nor transformers; the builders do, when called.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING

from autotune.dependencies import install_command
from autotune.errors import WorkloadError

if TYPE_CHECKING:
    from autotune.workload import Workload

__all__ = ["Requirement", "CorpusEntry", "CORPUS", "build_corpus"]


@dataclass(frozen=True, kw_only=True)
class Requirement:
    """An optional dependency of a workload: the module its builder imports and the autotune extra
    that installs it."""

    module: str
    extra: str

    @property
    def hint(self) -> str:
        return install_command(self.extra)

    def available(self) -> bool:
        """Whether ``module`` imports (this imports it: the builder would anyway)."""
        try:
            importlib.import_module(self.module)
        except ImportError:
            return False
        return True

    def check(self, workload: str) -> None:
        """Raise :class:`WorkloadError` naming what to install if ``module`` does not import."""
        if not self.available():
            raise WorkloadError(f"workload {workload!r} needs {self.module}: {self.hint}")


#: transformers, for every ``hf-*`` workload.
TRANSFORMERS = Requirement(module="transformers", extra="hf")


@cache
def installed_version(distribution: str) -> str | None:
    """The installed version of ``distribution``, or None (reads package metadata, imports nothing)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


@dataclass(frozen=True, kw_only=True)
class CorpusEntry:
    """A corpus model: how to build it, at which sizes, and where its model class comes from.

    Args:
        name: The workload name (``autotune measure -w NAME``).
        description: One line: architecture, parameters and data at the built-in size.
        library: The distribution that ships the model class (``transformers``, ``torch``).
        model_class: The class the workload trains, e.g. ``GPT2LMHeadModel`` or ``nn.LSTM``.
        requires: The optional dependency the builder needs, None if torch alone suffices.
        builder: ``builder(**sizes) -> Workload``; every size is a keyword argument.
        sizes: Every size override and its built-in value.
        tiny: Overrides that make a training step take tens of milliseconds (for tests).
    """

    name: str
    description: str
    library: str
    model_class: str
    requires: Requirement | None
    builder: Callable[..., Workload]
    sizes: Mapping[str, int]
    tiny: Mapping[str, int]

    def __post_init__(self) -> None:
        for field in ("name", "description", "library", "model_class"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise WorkloadError(f"CorpusEntry.{field} must be a non-empty string, but got {value!r}.")
        for field in ("sizes", "tiny"):
            sizes = getattr(self, field)
            bad = {k: v for k, v in sizes.items() if not _is_size(v)}
            if bad:
                raise WorkloadError(f"CorpusEntry.{field} values must be ints >= 1, but got {bad!r}.")
            object.__setattr__(self, field, MappingProxyType(dict(sizes)))
        unknown = sorted(set(self.tiny) - set(self.sizes))
        if unknown:
            raise WorkloadError(f"CorpusEntry.tiny must only override keys of sizes, but got {unknown!r}.")

    @property
    def source(self) -> str:
        """E.g. ``transformers 5.23.0 GPT2LMHeadModel``: the library version installed now."""
        return f"{self.library} {installed_version(self.library) or '(not installed)'} {self.model_class}"

    def build(self, **overrides: int) -> Workload:
        """The workload at the built-in size, with ``overrides`` replacing some sizes.

        Raises:
            WorkloadError: if an override is unknown or not an int >= 1, if the required library
                is not installed, or if the sizes do not fit together (the builder says which).
        """
        unknown = sorted(set(overrides) - set(self.sizes))
        if unknown:
            raise WorkloadError(
                f"workload {self.name!r}: unknown size override(s) {unknown!r}; expected some of {sorted(self.sizes)!r}"
            )
        for key, value in overrides.items():
            if not _is_size(value):
                raise WorkloadError(f"workload {self.name!r}: size {key} must be an int >= 1, but got {value!r}")
        if self.requires is not None:
            self.requires.check(self.name)
        return self.builder(**{**self.sizes, **overrides})


def _is_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def lazy_builder(module: str, function: str) -> Callable[..., Workload]:
    """A builder that imports ``module`` (and torch, transformers with it) only when called."""

    def build(**sizes: int) -> Workload:
        workload: Workload = getattr(importlib.import_module(module), function)(**sizes)
        return workload

    build.__qualname__ = build.__name__ = function
    return build


_LM = {"layers": 6, "width": 256, "heads": 4, "seq_len": 128, "vocab": 512, "num_samples": 4096, "batch_size": 16}
_LM_TINY = {"layers": 2, "width": 32, "heads": 2, "seq_len": 16, "vocab": 64, "num_samples": 64, "batch_size": 8}
_IMAGES_TINY = {"image_size": 32, "num_samples": 64, "batch_size": 8}

CORPUS: dict[str, CorpusEntry] = {
    e.name: e
    for e in (
        CorpusEntry(
            name="hf-gpt2",
            description="GPT-2 causal LM, 4.9M params, 6 layers x 256, context 128, synthetic Markov text",
            library="transformers",
            model_class="GPT2LMHeadModel",
            requires=TRANSFORMERS,
            builder=lazy_builder("autotune.zoo.transformers_models", "build_gpt2"),
            sizes=_LM,
            tiny=_LM_TINY,
        ),
        CorpusEntry(
            name="hf-bert",
            description="BERT masked LM, 5.0M params, 6 layers x 256, context 128, 15% of tokens masked",
            library="transformers",
            model_class="BertForMaskedLM",
            requires=TRANSFORMERS,
            builder=lazy_builder("autotune.zoo.transformers_models", "build_bert"),
            sizes=_LM,
            tiny=_LM_TINY,
        ),
        CorpusEntry(
            name="hf-llama",
            description="Llama causal LM (RMSNorm, rotary, SwiGLU, GQA), 4.7M params, 6 layers x 256, context 128",
            library="transformers",
            model_class="LlamaForCausalLM",
            requires=TRANSFORMERS,
            builder=lazy_builder("autotune.zoo.transformers_models", "build_llama"),
            sizes=_LM,
            tiny=_LM_TINY,
        ),
        CorpusEntry(
            name="hf-t5",
            description="T5 encoder-decoder, 7.5M params, 4+4 layers x 256, 64 tokens -> the next 32",
            library="transformers",
            model_class="T5ForConditionalGeneration",
            requires=TRANSFORMERS,
            builder=lazy_builder("autotune.zoo.transformers_models", "build_t5"),
            sizes={"layers": 4, "width": 256, "heads": 4, "source_len": 64, "target_len": 32}
            | {"vocab": 512, "num_samples": 4096, "batch_size": 16},
            tiny={"layers": 1, "width": 32, "heads": 2, "source_len": 12, "target_len": 4}
            | {"vocab": 64, "num_samples": 64, "batch_size": 8},
        ),
        CorpusEntry(
            name="hf-vit",
            description="ViT classifier, 2.7M params, 6 layers x 192, 32x32 images in 4x4 patches, 10 classes",
            library="transformers",
            model_class="ViTForImageClassification",
            requires=TRANSFORMERS,
            builder=lazy_builder("autotune.zoo.transformers_models", "build_vit"),
            sizes={"layers": 6, "width": 192, "heads": 3, "patch_size": 4, "image_size": 32}
            | {"num_samples": 4000, "batch_size": 32},
            tiny={"layers": 2, "width": 32, "heads": 2, "patch_size": 8} | _IMAGES_TINY,
        ),
        CorpusEntry(
            name="hf-resnet",
            description="ResNet, 3.5M params, 2 bottlenecks (BatchNorm) per stage x 4 stages of 128-1024, 64x64 images",
            library="transformers",
            model_class="ResNetForImageClassification",
            requires=TRANSFORMERS,
            builder=lazy_builder("autotune.zoo.transformers_models", "build_resnet"),
            sizes={"depth": 2, "width": 128, "image_size": 64, "num_samples": 4000, "batch_size": 32},
            tiny={"depth": 1, "width": 16} | _IMAGES_TINY,
        ),
        CorpusEntry(
            name="hf-convnext",
            description="ConvNeXt, 6.4M params, 2 layers per stage x 4 stages of 64-512, 64x64 images, 10 classes",
            library="transformers",
            model_class="ConvNextForImageClassification",
            requires=TRANSFORMERS,
            builder=lazy_builder("autotune.zoo.transformers_models", "build_convnext"),
            sizes={"depth": 2, "width": 64, "image_size": 64, "num_samples": 4000, "batch_size": 32},
            tiny={"depth": 1, "width": 8} | _IMAGES_TINY,
        ),
        CorpusEntry(
            name="lstm-lm",
            description="LSTM LM, 2.2M params, 4 residual nn.LSTM blocks x 256, context 128, synthetic Markov text",
            library="torch",
            model_class="nn.LSTM",
            requires=None,
            builder=lazy_builder("autotune.zoo.recurrent", "build_lstm_lm"),
            sizes={"layers": 4, "width": 256, "seq_len": 128, "vocab": 512, "num_samples": 4096, "batch_size": 16},
            tiny={"layers": 2, "width": 32, "seq_len": 16, "vocab": 64, "num_samples": 64, "batch_size": 8},
        ),
        CorpusEntry(
            name="gru-lm",
            description="GRU LM, 1.7M params, 4 residual nn.GRU blocks x 256, context 128, synthetic Markov text",
            library="torch",
            model_class="nn.GRU",
            requires=None,
            builder=lazy_builder("autotune.zoo.recurrent", "build_gru_lm"),
            sizes={"layers": 4, "width": 256, "seq_len": 128, "vocab": 512, "num_samples": 4096, "batch_size": 16},
            tiny={"layers": 2, "width": 32, "seq_len": 16, "vocab": 64, "num_samples": 64, "batch_size": 8},
        ),
        CorpusEntry(
            name="shared-encoder",
            description="nn.TransformerEncoder classifier, 1.0M params, 6 layers x 128 (layer 3 is layer 0), "
            "head tied to the embedding, 8 Markov languages",
            library="torch",
            model_class="nn.TransformerEncoder",
            requires=None,
            builder=lazy_builder("autotune.zoo.structured", "build_shared_encoder"),
            sizes={"layers": 6, "width": 128, "heads": 4, "seq_len": 64, "vocab": 256, "classes": 8}
            | {"num_samples": 4096, "batch_size": 16},
            tiny={"layers": 4, "width": 32, "heads": 2, "seq_len": 16, "vocab": 64, "classes": 4}
            | {"num_samples": 64, "batch_size": 8},
        ),
        CorpusEntry(
            name="unet-tiny",
            description="two-level UNet (BatchNorm, skip concatenations), 0.6M params, base width 32, "
            "64x64 images, per-pixel classes",
            library="torch",
            model_class="nn.Conv2d+nn.BatchNorm2d",
            requires=None,
            builder=lazy_builder("autotune.zoo.structured", "build_unet"),
            sizes={"width": 32, "image_size": 64, "num_samples": 4000, "batch_size": 16},
            tiny={"width": 4, "image_size": 16, "num_samples": 64, "batch_size": 8},
        ),
        CorpusEntry(
            name="varlen-lm",
            description="GPT LM, 0.9M params, 4 layers x 128, sequences of 16-128 tokens padded per batch "
            "with an attention mask, the longest batch last",
            library="torch",
            model_class="nn.Linear+scaled_dot_product_attention",
            requires=None,
            builder=lazy_builder("autotune.zoo.pipelines", "build_varlen_lm"),
            sizes={"layers": 4, "width": 128, "heads": 4, "min_len": 16, "max_len": 128, "vocab": 512}
            | {"num_samples": 2048, "batch_size": 16},
            tiny={"layers": 2, "width": 32, "heads": 2, "min_len": 4, "max_len": 32, "vocab": 64}
            | {"num_samples": 64, "batch_size": 8},
        ),
        CorpusEntry(
            name="stream-lm",
            description="GPT LM, 0.9M params, 4 layers x 128, context 64, Markov text from an IterableDataset",
            library="torch",
            model_class="nn.Linear+scaled_dot_product_attention",
            requires=None,
            builder=lazy_builder("autotune.zoo.pipelines", "build_stream_lm"),
            sizes={"layers": 4, "width": 128, "heads": 4, "seq_len": 64, "vocab": 512}
            | {"num_samples": 2048, "batch_size": 16},
            tiny={"layers": 2, "width": 32, "heads": 2, "seq_len": 16, "vocab": 64, "num_samples": 64, "batch_size": 8},
        ),
        CorpusEntry(
            name="frozen-backbone",
            description="GPT backbone, 4.9M params, 6 layers x 256, embeddings and every block frozen, "
            "a trainable head (2.6K params) over 8 Markov languages",
            library="torch",
            model_class="requires_grad_(False)",
            requires=None,
            builder=lazy_builder("autotune.zoo.adapters", "build_frozen_backbone"),
            sizes={"layers": 6, "frozen": 6, "width": 256, "heads": 4, "seq_len": 128, "vocab": 512}
            | {"classes": 8, "num_samples": 4096, "batch_size": 16},
            tiny={"layers": 3, "frozen": 3, "width": 32, "heads": 2, "seq_len": 16, "vocab": 64}
            | {"classes": 4, "num_samples": 64, "batch_size": 8},
        ),
        CorpusEntry(
            name="lora-lm",
            description="GPT LM, 5.1M params, 6 layers x 256, all frozen but rank-8 LoRA adapters on every "
            "projection (0.2M), context 128",
            library="torch",
            model_class="LoRA (plain torch)",
            requires=None,
            builder=lazy_builder("autotune.zoo.adapters", "build_lora_lm"),
            sizes={"layers": 6, "width": 256, "heads": 4, "seq_len": 128, "vocab": 512, "rank": 8, "alpha": 16}
            | {"num_samples": 4096, "batch_size": 16},
            tiny={"layers": 2, "width": 32, "heads": 2, "seq_len": 16, "vocab": 64, "rank": 4, "alpha": 32}
            | {"num_samples": 64, "batch_size": 8},
        ),
    )
}


def build_corpus(name: str, **overrides: int) -> Workload:
    """``CORPUS[name].build(**overrides)``, with an error listing the corpus for an unknown name.

    Raises:
        WorkloadError: for an unknown name, and as :meth:`CorpusEntry.build`.
    """
    if name not in CORPUS:
        raise WorkloadError(f"unknown corpus model {name!r}: expected one of {', '.join(CORPUS)}")
    return CORPUS[name].build(**overrides)
