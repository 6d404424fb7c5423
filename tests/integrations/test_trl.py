"""TRL's ``SFTTrainer`` (the ``Trainer`` subclass people fine-tune language models with) under the callback.

SFTTrainer patches a fused LM head onto the model's forward (a closure over the original's bound
forward) and trains on its per-token log-probabilities, never materialising the logits.
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from autotune import TrainConfig, measure, predict_memory
from autotune.errors import AutotuneWarning, WorkloadError
from autotune.integrations.hf import AutotuneCallback, fused_head_loss, trainer_loss
from autotune.worst_case import at_worst_case
from autotune.zoo.transformers_models import hf_loss

trl = pytest.importorskip("trl", reason="TRL is a dev dependency (pyproject's dev extra)")
datasets = pytest.importorskip("datasets")

# SFTConfig sets the Trainer's deprecated `gradient_checkpointing` itself, and TRL's PEFT path reads
# `is_gradient_checkpointing` (TRL's own calls, not ours).
pytestmark = [
    pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning"),
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

WORDS = [f"w{i}" for i in range(40)]


def _tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer built here (nothing downloaded): pad 0, eos 1, unk 2, then the words."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def _prompts(n: int) -> Any:
    """Prompt-completion pairs of varied lengths: padded batches, a completion-only loss."""
    rng = random.Random(0)
    words = lambda lo, hi: " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))  # noqa: E731
    return datasets.Dataset.from_list([{"prompt": words(3, 20), "completion": " " + words(2, 12)} for _ in range(n)])


def _model() -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=len(WORDS) + 3,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    return transformers.Qwen2ForCausalLM(config)


def _trainer(tmp_path: Path, callback: AutotuneCallback, **flags: Any) -> Any:
    flags.setdefault("per_device_train_batch_size", 4)
    args = trl.SFTConfig(
        output_dir=str(tmp_path),
        max_steps=2,
        max_length=48,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        **flags,
    )
    return trl.SFTTrainer(
        model=_model(), args=args, train_dataset=_prompts(32), processing_class=_tokenizer(), callbacks=[callback]
    )


def test_the_memory_model_profiles_the_fused_head_sft_trains_with(tmp_path: Path) -> None:
    """SFTConfig's defaults: bf16 and every layer recomputed, so Accelerate's autocast wraps TRL's
    patched forward. The callback's copies ran the original model through TRL's closure (a fake
    copy failed on its first real weight), and its loss was the model's own, which holds the
    logits SFT never makes."""
    callback = AutotuneCallback(policy=None, progress=False)
    trainer = _trainer(tmp_path, callback)
    assert trainer_loss(trainer.model) is fused_head_loss
    with pytest.warns(AutotuneWarning, match=r"^autotune: starting from your flags: activation_checkpointing=True"):
        result = trainer.train()
    assert result.global_step == 2 and math.isfinite(result.training_loss)
    first = callback.history[0]
    assert (first.source, first.applied) == ("flags", True)
    assert first.after.describe() == "micro x acc x ranks 4x1x1 | bf16, outer bf16 | ckpt all | ZeRO 0"
    workload = callback.loop.gate.workload
    assert workload.loss_fn is fused_head_loss
    for config in (first.after, TrainConfig(micro_batch_size=4)):  # the run's start, and fp32 throughout
        predicted = predict_memory(workload, config, verify=False).total
        measured = measure(at_worst_case(workload, 4), config, steps=1, warmup=1).memory
        assert measured is not None
        assert abs(predicted - measured.total) <= 0.01 * measured.total, (config.describe(), predicted, measured)


def test_under_lora_the_fused_head_is_found_on_the_base_model(tmp_path: Path) -> None:
    """SFT with ``peft_config``: TRL patches the base model, under PEFT's wrapper."""
    from peft import LoraConfig

    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = trl.SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], max_length=48)
    trainer = trl.SFTTrainer(
        model=_model(), args=args, train_dataset=_prompts(8), processing_class=_tokenizer(), peft_config=lora
    )
    assert type(trainer.model).__name__ == "PeftModelForCausalLM"
    assert trainer_loss(trainer.model) is fused_head_loss


def test_a_model_the_trainer_did_not_patch_keeps_its_own_loss() -> None:
    assert trainer_loss(_model()) is hf_loss


def test_a_packed_batch_is_refused_in_one_line(tmp_path: Path) -> None:
    """``packing=True`` (padding-free rows of several sequences): one row has no sample to split by."""
    from autotune.errors import BatchError

    callback = AutotuneCallback(policy=None, progress=False)
    trainer = _trainer(tmp_path, callback, packing=True)
    with pytest.raises(BatchError, match=r"^a packed batch \(several sequences in one row"):
        trainer.train()


def test_a_trainer_that_computes_its_own_loss_is_refused_in_one_line(tmp_path: Path) -> None:
    """DPO trains on preference pairs through its own loss: the batch holds no ``labels`` (the
    profile failed on ``None[...]`` inside TRL's head, under a budget error's advice)."""
    import copy

    rng = random.Random(0)
    words = lambda: " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8)))  # noqa: E731
    pairs = datasets.Dataset.from_list(
        [{"prompt": words(), "chosen": " " + words(), "rejected": " " + words()} for _ in range(16)]
    )
    model = _model()
    args = trl.DPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        max_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        bf16=False,
        gradient_checkpointing=False,
    )
    trainer = trl.DPOTrainer(
        model=model,
        ref_model=copy.deepcopy(model),
        args=args,
        train_dataset=pairs,
        processing_class=_tokenizer(),
        callbacks=[AutotuneCallback(policy=None, progress=False)],
    )
    msg = (
        "a batch without 'labels' (it holds input_ids, attention_mask, completion_mask): autotune profiles the loss "
        "the model computes from them, and a Trainer that computes its own loss (a compute_loss override, TRL's DPO "
        "pairs) is not one it can profile."
    )
    with pytest.raises(WorkloadError, match=f"^{re.escape(msg)}$"):
        trainer.train()


def test_where_the_head_stops_growing_the_run_s_own_micro_batch_is_predicted_exactly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TRL's head works in tiles of 4,096 tokens (here 160, so that a micro-batch of 8 fills one
    and 4 does not): a line through micro-batches 2 and 4 over-predicts 8. The Trainer's split
    never changes, so the callback profiles at its micro-batch."""
    from trl.kernels import chunked_logprob

    monkeypatch.setattr(chunked_logprob, "TOKEN_CHUNK_SIZE", 160)
    callback = AutotuneCallback(policy=None, progress=False)
    trainer = _trainer(tmp_path, callback, per_device_train_batch_size=8, bf16=False, gradient_checkpointing=False)
    trainer.model.resize_token_embeddings(4096)  # a vocabulary as wide as a tile: the head's bytes dominate
    trainer.train()
    gate = callback.loop.gate
    assert gate.profile is not None and gate.profile.micro_batch_sizes == (4, 8)
    config = TrainConfig(micro_batch_size=8)
    measured = measure(at_worst_case(gate.workload, 8), config, steps=1, warmup=1).memory
    assert measured is not None
    predicted = gate.predict(config)
    assert predicted is not None and abs(predicted[0] - measured.total) <= 0.01 * measured.total
    line = predict_memory(gate.workload, config, verify=False).total  # through micro-batches 2 and 4
    assert line > 1.2 * measured.total, (line, measured.total)
