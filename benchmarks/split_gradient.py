"""The gradient of a batch split into micro-batches, against the whole batch's, over padded sequences.

A token-mean loss over padded sequences (Hugging Face's ``labels`` with -100 on padding, or a
loss that ignores padded targets) averages over each micro-batch's tokens. Weighting the
micro-batches by their samples then trains another gradient than the batch does; weighting them
by their tokens (``Workload.loss_items``, :mod:`autotune.loss_items`) trains the batch's. For each
model: one SGD step (lr 1, so the update is the gradient) from the same weights on the same batch,
whole and split, and the split's relative error ``|g_split - g_whole| / |g_whole|``.

Models: the corpus' ``varlen-lm`` (16-128 token sequences padded per batch, its loss ignoring
padded targets) and a transformers ``GPT2LMHeadModel`` (4 x 128, no dropout) on 16 sequences of
8-256 tokens right-padded with ``labels`` -100 (``loss_items="auto"``: measured).

Run: python benchmarks/split_gradient.py [--result docs/results/split-gradient.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch

from autotune import TrainConfig, Workload
from autotune.train import Trainer
from autotune.zoo import CORPUS

BATCH = 16


def gpt2_padded() -> Workload:
    """A GPT-2 on padded sequences with Hugging Face labels (-100 on padding)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=4, n_embd=128, n_head=4, vocab_size=1000, n_positions=256, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0
    )
    model = GPT2LMHeadModel(config)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 1000, (BATCH, 256), generator=g)
    lengths = torch.randint(8, 257, (BATCH,), generator=g)
    mask = (torch.arange(256)[None] < lengths[:, None]).long()
    data = [
        {"input_ids": ids[i], "attention_mask": mask[i], "labels": ids[i].masked_fill(mask[i] == 0, -100)}
        for i in range(BATCH)
    ]
    return Workload(name="gpt2-padded", model=model, dataset=data, loss_fn=lambda m, b: m(**b).loss, batch_size=BATCH)  # type: ignore[arg-type]


def _update(workload: Workload, micro: int) -> torch.Tensor:
    """The parameters' change in one SGD step (lr 1) of the batch in micro-batches of ``micro``."""
    wl = dataclasses.replace(workload, optimizer=lambda p: torch.optim.SGD(p, lr=1.0), batch_size=BATCH)
    trainer = Trainer(wl, TrainConfig(micro_batch_size=micro, grad_accum_steps=BATCH // micro, lr_scaling="none"))
    before = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
    with torch.random.fork_rng():
        torch.manual_seed(0)
        trainer.step()
    after = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
    trainer.close()
    return after - before


COLUMNS = ("model", "micro-batches x samples", "by samples", "by counted items", "counted")


def rows(name: str, build: Any) -> list[tuple[str, ...]]:
    """One row per split of ``build()``'s batch: the split's error weighted by samples and by its rule."""
    counted = build()
    rule = counted.loss_weighting.name
    by_samples = dataclasses.replace(build(), loss_items="samples")
    whole = _update(counted, BATCH)
    out = []
    for micro in (8, 4, 2, 1):
        errors = [float((_update(w, micro) - whole).norm() / whole.norm()) for w in (by_samples, counted)]
        out.append((name, f"{BATCH // micro} x {micro}", f"{errors[0]:.2e}", f"{errors[1]:.2e}", rule))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--result", type=Path, help="also write the results page's record here (docs/results/)")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    entry = CORPUS["varlen-lm"]
    table = rows("varlen-lm (16-128 tokens)", lambda: dataclasses.replace(entry.build(), batch_size=BATCH))
    table += rows("GPT-2, transformers (8-256 tokens)", gpt2_padded)
    print("\n".join(" | ".join(row) for row in (COLUMNS, *table)))
    if args.result is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from results import command_line, cpu_machine, machine_fields, write_result

        write_result(
            args.result,
            title="A split batch's gradient",
            claim=(
                "One SGD step (lr 1: the update is the gradient) from the same weights on the same batch of 16 padded "
                "sequences, whole and split into micro-batches, the micro-batches' losses weighted by their samples "
                "(what every trainer did before) or by what the loss averages over (`Workload.loss_items`: "
                "varlen-lm's own count of real target tokens; for the GPT-2 with `labels` -100 on padding, "
                '`"auto"`, measured). The relative error of the split\'s update, `|g_split - g_whole| / |g_whole|`.'
            ),
            **machine_fields(cpu_machine()),
            command=command_line(__file__, argv),
            columns=COLUMNS,
            rows=table,
            note=(
                "The errors are arithmetic, not timings: beyond float rounding they do not depend on the machine. "
                "The baseline is the whole batch in one pass, the PyTorch default; the Hugging Face `Trainer` "
                "weighs its own accumulation by `num_items_in_batch` since transformers 4.46."
            ),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
