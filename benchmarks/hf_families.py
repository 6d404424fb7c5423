"""The memory model on the Hugging Face model families people fine-tune beyond decoders.

Speech recognizers with CTC heads and LayerDrop on (Wav2Vec2, HuBERT, WavLM), speech-to-text
(Whisper), encoders (ModernBERT with its unpadding, DeBERTa-v2), a sequence-to-sequence model
(BART), a state-space model (Mamba), a windowed vision transformer (Swin) and a two-tower model
(CLIP), each built from its transformers config class (2-4 layers, random weights, no download)
with a loss as its model class computes it. Each cell compares the memory model's prediction
(fake-tensor profile, ``verify=False``) with one exactly tracked real step at micro-batch 8, or
says why it failed.

Run: python benchmarks/hf_families.py [--threads 2] [--result docs/results/hf-families.json]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from autotune import Workload

#: The configurations of each row, by column title.
_CONFIGS: dict[str, dict[str, Any]] = {
    "fp32": {},
    "every block recomputed": {"checkpoint": True},
    "HF bf16=True + every block recomputed": {"precision": "bf16", "outer_precision": "bf16", "checkpoint": True},
}
_N = 32  # samples in each dataset


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _workload(name: str, model: torch.nn.Module, data: list[dict[str, torch.Tensor]], **loss: Any) -> Workload:
    # A list of samples is a map-style dataset (``__getitem__`` and ``__len__``), as users pass one.
    dataset = cast("torch.utils.data.Dataset[Any]", data)
    return Workload(name=name, model=model, dataset=dataset, loss_fn=lambda m, b: m(**b, **loss).loss, batch_size=8)


def wav2vec2() -> Workload:
    """``Wav2Vec2ForCTC`` with LayerDrop on: a workload to give autotune (``hf_families.py:wav2vec2``)."""
    return _speech("Wav2Vec2Config", "Wav2Vec2ForCTC")


def _speech(config_cls: str, model_cls: str) -> Workload:
    """A CTC speech recognizer with LayerDrop on (``layerdrop=0.1``, as the released checkpoints)."""
    import transformers

    config = getattr(transformers, config_cls)(
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        conv_dim=(32, 32, 32),
        conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        vocab_size=32,
        layerdrop=0.1,
        mask_time_prob=0.0,
    )
    audio = torch.randn(_N, 4000, generator=_generator())
    labels = torch.randint(1, 32, (_N, 20), generator=_generator())
    labels[::2, 15:] = -100  # shorter transcripts, padded
    data = [{"input_values": a, "labels": y} for a, y in zip(audio, labels, strict=True)]
    return _workload(model_cls, getattr(transformers, model_cls)(config), data)


def _tokens(vocab: int, seq: int = 32) -> torch.Tensor:
    return torch.randint(3, vocab, (_N, seq), generator=_generator())


#: The encoder-decoders' shape (Whisper, BART): 2 + 2 layers of width 64.
_ENCODER_DECODER: dict[str, Any] = {
    "vocab_size": 128,
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
}


def _whisper() -> Workload:
    import transformers

    config = transformers.WhisperConfig(
        **_ENCODER_DECODER,
        num_mel_bins=16,
        max_source_positions=50,
        max_target_positions=32,
        pad_token_id=0,
        decoder_start_token_id=1,
        bos_token_id=1,
        eos_token_id=2,
    )
    features = torch.randn(_N, 16, 100, generator=_generator())
    data = [{"input_features": f, "labels": y} for f, y in zip(features, _tokens(128, 16), strict=True)]
    return _workload("WhisperForConditionalGeneration", transformers.WhisperForConditionalGeneration(config), data)


def _modernbert() -> Workload:
    import transformers

    config = transformers.ModernBertConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=64,
        pad_token_id=0,
    )
    data = []
    for i, ids in enumerate(_tokens(128)):
        mask = (torch.arange(32) < 32 - (i % 4) * 4).long()  # padded rows: ModernBERT unpads them
        data.append({"input_ids": ids, "attention_mask": mask, "labels": torch.where(mask.bool(), ids, -100)})
    return _workload("ModernBertForMaskedLM", transformers.ModernBertForMaskedLM(config), data)


def _deberta() -> Workload:
    import transformers

    config = transformers.DebertaV2Config(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    config.num_labels = 3
    data = [{"input_ids": ids, "labels": torch.tensor(i % 3)} for i, ids in enumerate(_tokens(128))]
    model = transformers.DebertaV2ForSequenceClassification(config)
    return _workload("DebertaV2ForSequenceClassification", model, data)


def _bart() -> Workload:
    import transformers

    config = transformers.BartConfig(**_ENCODER_DECODER, max_position_embeddings=64)
    data = [{"input_ids": ids, "labels": ids} for ids in _tokens(128)]
    return _workload("BartForConditionalGeneration", transformers.BartForConditionalGeneration(config), data)


def _mamba() -> Workload:
    import transformers

    config = transformers.MambaConfig(vocab_size=128, hidden_size=64, state_size=8, num_hidden_layers=4, expand=2)
    data = [{"input_ids": ids, "labels": ids} for ids in _tokens(128)]
    return _workload("MambaForCausalLM", transformers.MambaForCausalLM(config), data)


def _swin() -> Workload:
    import transformers

    config = transformers.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4], window_size=4
    )
    config.num_labels = 10
    pixels = torch.randn(_N, 3, 32, 32, generator=_generator())
    data = [{"pixel_values": p, "labels": torch.tensor(i % 10)} for i, p in enumerate(pixels)]
    return _workload("SwinForImageClassification", transformers.SwinForImageClassification(config), data)


def _clip() -> Workload:
    import transformers

    tower = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2}
    config = transformers.CLIPConfig(
        text_config={**tower, "vocab_size": 128, "max_position_embeddings": 32, "bos_token_id": 1, "eos_token_id": 2},
        vision_config={**tower, "image_size": 32, "patch_size": 8},
    )
    pixels = torch.randn(_N, 3, 32, 32, generator=_generator())
    data = [{"input_ids": ids, "pixel_values": p} for ids, p in zip(_tokens(128, 16), pixels, strict=True)]
    return _workload("CLIPModel", transformers.CLIPModel(config), data, return_loss=True)


#: Each row's workload, by family.
FAMILIES: dict[str, Callable[[], Workload]] = {
    "Wav2Vec2 (CTC, LayerDrop)": wav2vec2,
    "HuBERT (CTC, LayerDrop)": lambda: _speech("HubertConfig", "HubertForCTC"),
    "WavLM (CTC, LayerDrop)": lambda: _speech("WavLMConfig", "WavLMForCTC"),
    "Whisper": _whisper,
    "ModernBERT (unpadded)": _modernbert,
    "DeBERTa-v2": _deberta,
    "BART": _bart,
    "Mamba": _mamba,
    "Swin": _swin,
    "CLIP": _clip,
}


def rows() -> list[list[str]]:
    """Every family, one line printed per row as it is done."""
    # One cell of a memory record, as the PEFT benchmark beside this one computes it (micro-batch
    # 8). Imported here: a user's autotune loads this file as a workload (``hf_families.py:wav2vec2``).
    from peft_adapters import cell

    out = []
    for family, build in FAMILIES.items():
        torch.manual_seed(0)
        with warnings.catch_warnings():  # transformers' notes on configs built without a checkpoint
            warnings.simplefilter("ignore")
            try:
                wl = build()
            except Exception as e:
                row = [family, "-", *(f"fails to build: {type(e).__name__}: {e}" for _ in _CONFIGS)]
            else:
                row = [family, type(wl.model).__name__, *(cell(wl, knobs) for knobs in _CONFIGS.values())]
        print(" | ".join(row), flush=True)
        out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--result", type=Path, help="write the record here (docs/results/)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    table = rows()
    if args.result is None:
        return
    from results import command_line, cpu_machine, machine_fields, write_result

    write_result(
        args.result,
        title="The memory model on Hugging Face model families (CPU)",
        claim=(
            "The memory model's prediction (fake-tensor profile) against a real step's exact peak on model "
            "families people fine-tune beyond decoders, each built from its transformers config class (2-4 layers, "
            "random weights, micro-batch 8) with the loss its model class computes; the speech recognizers with "
            "CTC heads and LayerDrop on, as their released checkpoints set it."
        ),
        **machine_fields(cpu_machine()),
        command=command_line("benchmarks/hf_families.py", sys.argv[1:]),
        columns=("family", "model class", *_CONFIGS),
        rows=table,
        note=(
            f"transformers {transformers.__version__}. On the code of bb1f091 (a worktree, PYTHONPATH) the three "
            "speech recognizers could not be profiled at all: LayerDrop's draw per layer ('cannot profile ... "
            "DataDependentOutputException: aten._local_scalar_dense') and, past it, CTC's loss "
            "('DynamicOutputShapeException: aten._ctc_loss.Tensor'). Every copy autotune profiles or measures "
            "runs every layer (autotune.layer_drop), the step a memory budget must hold."
        ),
    )


if __name__ == "__main__":
    main()
