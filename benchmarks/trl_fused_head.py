"""The memory model against TRL's fused LM head (``SFTTrainer``'s loss), per micro-batch.

TRL's ``SFTTrainer`` patches a fused LM head onto the model (``trl.trainer.utils.add_fused_lm_head``)
and trains on per-token log-probabilities computed in tiles of at most 4,096 tokens by 32,768
vocabulary entries, never holding the logits. Its memory grows with the tokens up to one tile and
then stops. autotune's memory model is linear in the micro-batch between and beyond its two
profiled sizes (2 and 4 samples). For each micro-batch: the memory model's peak and the peak
measured on one real step (exact tensor bytes), fp32, the whole batch of 16 in micro-batches.

Model: a transformers ``Qwen2ForCausalLM`` (2 x 128, vocabulary 65,536, tied embeddings) with TRL's
head, on random token sequences of 1,024 with every label counted.

Run: python benchmarks/trl_fused_head.py [--result docs/results/trl-fused-head.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from autotune import TrainConfig, Workload, measure, predict_memory

BATCH, SEQUENCE, VOCAB = 16, 1024, 65536
COLUMNS = ("micro-batch", "label tokens", "predicted, MiB", "measured, MiB", "predicted / measured")


def workload() -> Workload:
    """The Qwen2 shape with TRL's fused head, and SFT's loss through it."""
    import transformers
    from trl.trainer.utils import add_fused_lm_head

    from autotune.integrations.hf import fused_head_loss, trainer_loss

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQUENCE,
        tie_word_embeddings=True,
    )
    model = transformers.Qwen2ForCausalLM(config)
    add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))  # what SFTTrainer asks for
    assert trainer_loss(model) is fused_head_loss
    ids = torch.randint(0, VOCAB, (64, SEQUENCE), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row, "labels": row} for row in ids]
    return Workload(name="qwen2-fused-head", model=model, dataset=data, loss_fn=fused_head_loss, batch_size=BATCH)  # type: ignore[arg-type]


def rows(wl: Workload) -> list[tuple[str, ...]]:
    out = []
    for micro in (1, 2, 4, 8, 16):
        config = TrainConfig(micro_batch_size=micro, grad_accum_steps=BATCH // micro)
        predicted = predict_memory(wl, config, verify=False).total
        measured = measure(wl, config, steps=1, warmup=1, device="cpu").peak_bytes
        assert measured is not None
        out.append(
            (
                str(micro),
                f"{micro * (SEQUENCE - 1):,}",
                f"{predicted / 2**20:,.1f}",
                f"{measured / 2**20:,.1f}",
                f"{predicted / measured:.2f}",
            )
        )
        print(" | ".join(out[-1]), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--result", type=Path, help="also write the results page's record here (docs/results/)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    print(" | ".join(COLUMNS))
    table = rows(workload())
    if args.result is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from results import command_line, cpu_machine, machine_fields, write_result

        write_result(
            args.result,
            title="The memory model against TRL's fused LM head",
            claim=(
                "TRL's `SFTTrainer` trains on per-token log-probabilities from a fused LM head that works in tiles "
                "of at most 4,096 tokens, so its memory stops growing there. autotune's memory model (linear in the "
                "micro-batch through 2 and 4 samples) against one real step's measured peak, fp32, a batch of 16 "
                f"sequences of {SEQUENCE:,} tokens, a Qwen2 shape (2 x 128) with a vocabulary of {VOCAB:,}."
            ),
            **machine_fields(cpu_machine()),
            command=command_line(__file__, argv),
            columns=COLUMNS,
            rows=table,
            note=(
                "Exact tensor bytes, not timings. Up to 4 samples (4,092 tokens, one tile) the prediction is the "
                "measurement; beyond, it keeps growing and the measurement does not. The error is on the safe side "
                "(a configuration admitted under the budget fits), but a budget gate refuses micro-batches that would "
                "fit. Where the split never changes (the Hugging Face callback), the profile runs at the run's own "
                "micro-batch and half of it, and the run's prediction is exact; a piecewise model for a split that "
                "moves is not built. On a GPU TRL scores only the label tokens, in a Triton kernel: the tile is the "
                "same, the temporaries fewer (not measured)."
            ),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
