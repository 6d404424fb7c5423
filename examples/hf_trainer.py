"""Adaptive training inside a Hugging Face ``transformers.Trainer``: add one callback.

``AutotuneCallback`` adapts, while the Trainer trains, what can change under it: per-block bf16
precision and per-block activation checkpointing of the model's transformer blocks (the micro-batch
and gradient accumulation stay the ``TrainingArguments``'). Every change it made, and why, is in
``callback.history``.

Run: ``python examples/hf_trainer.py`` (a tiny GPT-2 built from its config class with random
weights and generated token data: nothing is downloaded; seconds to a minute on a CPU).
Needs ``pip install "torch-autotune[hf]"``.
"""

from __future__ import annotations

import tempfile

import torch
import transformers

from autotune.integrations.hf import AutotuneCallback


class TokenData(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """Random token sequences; ``labels`` = ``input_ids``, so the model computes its own LM loss."""

    def __init__(self, n: int, length: int, vocab: int) -> None:
        self.ids = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    transformers.set_seed(0)
    config = transformers.GPT2Config(
        vocab_size=256, n_positions=32, n_embd=64, n_layer=4, n_head=4, bos_token_id=0, eos_token_id=0
    )
    model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # the loss GPT-2 computes (its class name matches no loss type)
    callback = AutotuneCallback(decide_every=4)  # the shipped pretrained policy, within the default's own peak
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out,
            per_device_train_batch_size=8,
            max_steps=12,
            logging_steps=4,
            save_strategy="no",
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
        )
        trainer = transformers.Trainer(
            model=model, args=args, train_dataset=TokenData(128, 32, config.vocab_size), callbacks=[callback]
        )
        result = trainer.train()
    print(f"training loss {result.training_loss:.3f} over {result.global_step} steps")
    for change in callback.history:
        print(
            f"step {change.step}: {change.source}: {'applied' if change.applied else 'refused'}: "
            f"{change.after.describe()}"
        )


if __name__ == "__main__":
    main()
