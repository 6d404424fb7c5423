"""Hugging Face transformers models built from their config classes (no download), on generated data.

Every builder seeds the initialisation (:func:`~autotune.zoo.data.seeded_init`) and the data, so
building twice gives bit-identical weights and samples. Batches are dicts (``input_ids``,
``pixel_values``, ``labels``) and the loss is the model's own: ``model(**batch).loss``. Library
defaults are kept (dropout, tied embeddings, attention implementation) except ``use_cache=False``
(training needs no key/value cache) and the special token ids: the token languages use ids
``0..vocab-1`` and one extra id, ``vocab``, serves as pad/bos/eos (BERT adds ``vocab + 1`` as
[MASK]), so every configured id lies inside the vocabulary.

Vision models come from transformers too: torchvision (and timm, which needs it) cannot be
imported beside the local CPU torch wheel here (``operator torchvision::nms does not exist``).
"""

from __future__ import annotations

from typing import Any

import torch
import transformers
from torch import nn

from autotune.errors import WorkloadError
from autotune.workload import Workload
from autotune.zoo.data import TensorDict, markov_corpus, prototype_images, seeded_init

__all__ = [
    "hf_loss",
    "require_labels",
    "build_gpt2",
    "build_bert",
    "build_llama",
    "build_t5",
    "build_vit",
    "build_resnet",
    "build_convnext",
]

_NUM_CLASSES = 10


def hf_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The loss a Hugging Face model computes itself when the batch has ``labels``.

    Raises:
        WorkloadError: the batch has no ``labels``.
    """
    require_labels(batch)
    loss: torch.Tensor = model(**batch).loss
    return loss


def require_labels(batch: Any) -> None:
    """Refuse a batch without ``labels``: the model computes no loss from it, and a ``Trainer``
    that trains on it computes its own (a ``compute_loss`` override, TRL's preference pairs),
    which nothing here can profile."""
    if not hasattr(batch, "keys") or "labels" not in batch:
        keys = ", ".join(map(str, batch.keys())) if hasattr(batch, "keys") else type(batch).__name__
        raise WorkloadError(
            f"a batch without 'labels' (it holds {keys}): autotune profiles the loss the model computes from "
            "them, and a Trainer that computes its own loss (a compute_loss override, TRL's DPO pairs) is not "
            "one it can profile."
        )


def _check_heads(name: str, width: int, heads: int) -> None:
    if width % heads != 0:
        raise WorkloadError(
            f"workload {name!r}: width must be divisible by heads, but got (width={width}, heads={heads})"
        )


def _tokens(*, num_samples: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    # The settings of the gpt-* workloads: 4 topics, 8 successors per token (see markov_corpus).
    return markov_corpus(
        num_sequences=num_samples, length=length, vocab_size=vocab, num_topics=4, branching=8, seed=seed
    )


def _images(*, num_samples: int, image_size: int, seed: int) -> TensorDict:
    images, labels = prototype_images(
        num_images=num_samples,
        num_classes=_NUM_CLASSES,
        modes_per_class=4,
        size=image_size,
        noise=1.0,
        max_shift=max(1, image_size // 8),
        seed=seed,
    )
    return TensorDict(pixel_values=images, labels=labels)


def _workload(name: str, model: nn.Module, dataset: TensorDict, batch_size: int) -> Workload:
    # blocks=None: auto-detected from model._no_split_modules (see autotune.block_detection.find_blocks).
    return Workload(name=name, model=model, dataset=dataset, loss_fn=hf_loss, batch_size=batch_size)


def _build(config_class: Any, model_class: Any, seed: int, **config: Any) -> transformers.PreTrainedModel:
    with seeded_init(seed):
        model: transformers.PreTrainedModel = model_class(config_class(**config))
    return model


def _causal_lm(
    name: str, model: nn.Module, *, seq_len: int, vocab: int, num_samples: int, batch_size: int, seed: int
) -> Workload:
    tokens = _tokens(num_samples=num_samples, length=seq_len, vocab=vocab, seed=seed)
    # The model shifts labels itself: position t predicts labels[t + 1].
    return _workload(name, model, TensorDict(input_ids=tokens, labels=tokens), batch_size)


def build_gpt2(
    *, layers: int, width: int, heads: int, seq_len: int, vocab: int, num_samples: int, batch_size: int
) -> Workload:
    """``GPT2LMHeadModel``: learned positions, pre-LayerNorm blocks, GELU MLP, tied output head."""
    _check_heads("hf-gpt2", width, heads)
    model = _build(
        transformers.GPT2Config,
        transformers.GPT2LMHeadModel,
        4001,
        vocab_size=vocab + 1,
        n_positions=seq_len,
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        bos_token_id=vocab,
        eos_token_id=vocab,
        use_cache=False,
    )
    # transformers picks the loss from the class name; "GPT2LMHeadModel" matches none, so it logs a
    # warning and falls back to this very loss. Naming it keeps the log clean.
    model.loss_type = "ForCausalLM"
    return _causal_lm(
        "hf-gpt2", model, seq_len=seq_len, vocab=vocab, num_samples=num_samples, batch_size=batch_size, seed=4002
    )


def build_llama(
    *, layers: int, width: int, heads: int, seq_len: int, vocab: int, num_samples: int, batch_size: int
) -> Workload:
    """``LlamaForCausalLM``: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention."""
    _check_heads("hf-llama", width, heads)
    model = _build(
        transformers.LlamaConfig,
        transformers.LlamaForCausalLM,
        4011,
        vocab_size=vocab + 1,
        hidden_size=width,
        # Llama's SwiGLU width: 2/3 of a 4x MLP (same parameters), rounded up to a multiple of 64.
        intermediate_size=-(-8 * width // 3 // 64) * 64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads // 2 if heads % 2 == 0 else heads,
        max_position_embeddings=seq_len,
        bos_token_id=vocab,
        eos_token_id=vocab,
        pad_token_id=vocab,
        use_cache=False,
    )
    return _causal_lm(
        "hf-llama", model, seq_len=seq_len, vocab=vocab, num_samples=num_samples, batch_size=batch_size, seed=4012
    )


def build_bert(
    *, layers: int, width: int, heads: int, seq_len: int, vocab: int, num_samples: int, batch_size: int
) -> Workload:
    """``BertForMaskedLM``: 15% of the positions of each sequence (at least one) are replaced by
    [MASK] and predicted; the other labels are -100 (ignored by the loss)."""
    _check_heads("hf-bert", width, heads)
    pad, mask = vocab, vocab + 1
    model = _build(
        transformers.BertConfig,
        transformers.BertForMaskedLM,
        4021,
        vocab_size=vocab + 2,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        max_position_embeddings=seq_len,
        pad_token_id=pad,
    )
    tokens = _tokens(num_samples=num_samples, length=seq_len, vocab=vocab, seed=4022)
    g = torch.Generator().manual_seed(4023)
    # A fixed number of masked positions per sequence: a batch never has zero targets (NaN loss).
    num_masked = max(1, round(0.15 * seq_len))
    positions = torch.rand(num_samples, seq_len, generator=g).argsort(dim=1)[:, :num_masked]
    masked = torch.zeros(num_samples, seq_len, dtype=torch.bool).scatter_(1, positions, True)
    inputs = tokens.masked_fill(masked, mask)
    labels = tokens.masked_fill(~masked, -100)
    return _workload("hf-bert", model, TensorDict(input_ids=inputs, labels=labels), batch_size)


def build_t5(
    *,
    layers: int,
    width: int,
    heads: int,
    source_len: int,
    target_len: int,
    vocab: int,
    num_samples: int,
    batch_size: int,
) -> Workload:
    """``T5ForConditionalGeneration``: the encoder reads ``source_len`` tokens of Markov text, the
    decoder predicts the ``target_len`` tokens that follow."""
    _check_heads("hf-t5", width, heads)
    model = _build(
        transformers.T5Config,
        transformers.T5ForConditionalGeneration,
        4031,
        vocab_size=vocab + 1,
        d_model=width,
        d_kv=width // heads,
        d_ff=4 * width,
        num_layers=layers,
        num_decoder_layers=layers,
        num_heads=heads,
        pad_token_id=vocab,
        eos_token_id=vocab,
        decoder_start_token_id=vocab,
        use_cache=False,
    )
    tokens = _tokens(num_samples=num_samples, length=source_len + target_len, vocab=vocab, seed=4032)
    data = TensorDict(input_ids=tokens[:, :source_len].contiguous(), labels=tokens[:, source_len:].contiguous())
    return _workload("hf-t5", model, data, batch_size)


def build_vit(
    *, layers: int, width: int, heads: int, patch_size: int, image_size: int, num_samples: int, batch_size: int
) -> Workload:
    """``ViTForImageClassification`` on 10-class prototype images (see ``prototype_images``)."""
    _check_heads("hf-vit", width, heads)
    if image_size % patch_size != 0:
        raise WorkloadError(
            "workload 'hf-vit': image_size must be divisible by patch_size, "
            f"but got (image_size={image_size}, patch_size={patch_size})"
        )
    model = _build(
        transformers.ViTConfig,
        transformers.ViTForImageClassification,
        4041,
        image_size=image_size,
        patch_size=patch_size,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=4 * width,
        num_labels=_NUM_CLASSES,
    )
    return _workload("hf-vit", model, _images(num_samples=num_samples, image_size=image_size, seed=4042), batch_size)


def build_resnet(*, depth: int, width: int, image_size: int, num_samples: int, batch_size: int) -> Workload:
    """``ResNetForImageClassification``: bottleneck layers (BatchNorm), ``depth`` per stage, stage
    widths ``width * (1, 2, 4, 8)`` (ResNet-50: 256; a 7x7 stem of ``width / 4`` channels)."""
    model = _build(
        transformers.ResNetConfig,
        transformers.ResNetForImageClassification,
        4051,
        embedding_size=max(1, width // 4),
        hidden_sizes=[width * 2**i for i in range(4)],
        depths=[depth] * 4,
        layer_type="bottleneck",
        num_labels=_NUM_CLASSES,
    )
    return _workload("hf-resnet", model, _images(num_samples=num_samples, image_size=image_size, seed=4052), batch_size)


def build_convnext(*, depth: int, width: int, image_size: int, num_samples: int, batch_size: int) -> Workload:
    """``ConvNextForImageClassification``: ``depth`` layers per stage, stage widths ``width * (1, 2, 4, 8)``
    (ConvNeXt-T: 96), a 4x4 patchify stem."""
    model = _build(
        transformers.ConvNextConfig,
        transformers.ConvNextForImageClassification,
        4061,
        hidden_sizes=[width * 2**i for i in range(4)],
        depths=[depth] * 4,
        num_labels=_NUM_CLASSES,
    )
    return _workload(
        "hf-convnext", model, _images(num_samples=num_samples, image_size=image_size, seed=4062), batch_size
    )
