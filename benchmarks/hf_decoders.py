"""The memory model on Hugging Face decoder architectures nobody here wrote, trained without a cache.

Each model is built from its transformers config class with random weights (2 layers, width 64,
no download), ``use_cache=False`` as ``transformers.Trainer`` leaves it, and trained on random
tokens of 32 steps at micro-batch 8, with and without an all-ones ``attention_mask`` in the
batch. The memory model's prediction (fake-tensor profile, ``verify=False``) is compared with
one exactly tracked real step (after one that creates Adam's state).

``--without-fake-branches`` profiles without :class:`autotune.memory.fake_branches.RealBranches`
(transformers' causal-mask checks then see fake tensors and keep a 4-D mask the real step skips).

Run: python benchmarks/hf_decoders.py [--without-fake-branches] [--threads 2]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from autotune import TrainConfig, Workload, measure, predict_memory
from autotune.memory.fake_branches import RealBranches
from autotune.memory.predict import profile_memory
from autotune.zoo.transformers_models import hf_loss

_COMMON = {"vocab_size": 256, "hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": 64}
#: (config class, model class, extra config) by name: small, and as their configs spell sizes.
_MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "mistral": (
        "MistralConfig",
        "MistralForCausalLM",
        {"intermediate_size": 128, "num_hidden_layers": 2, "num_key_value_heads": 2},
    ),
    "phi": ("PhiConfig", "PhiForCausalLM", {"intermediate_size": 128, "num_hidden_layers": 2}),
    "gemma": (
        "GemmaConfig",
        "GemmaForCausalLM",
        {"intermediate_size": 128, "num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 16},
    ),
    "gpt-neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {"intermediate_size": 128, "num_hidden_layers": 2}),
    "falcon": ("FalconConfig", "FalconForCausalLM", {"num_hidden_layers": 2}),
    "opt": ("OPTConfig", "OPTForCausalLM", {"ffn_dim": 128, "num_hidden_layers": 2, "word_embed_proj_dim": 64}),
    "qwen3": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        {"intermediate_size": 128, "num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 16},
    ),
    "starcoder2": (
        "Starcoder2Config",
        "Starcoder2ForCausalLM",
        {
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "bos_token_id": 0,
            "eos_token_id": 0,
        },
    ),
}


class _Tokens(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, *, mask: bool, n: int = 64, seq: int = 32) -> None:
        self.x = torch.randint(0, _COMMON["vocab_size"], (n, seq), generator=torch.Generator().manual_seed(0))
        self.mask = mask

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = {"input_ids": self.x[i], "labels": self.x[i]}
        return {**item, "attention_mask": torch.ones_like(self.x[i])} if self.mask else item


def _error(name: str, *, mask: bool) -> tuple[int, int]:
    import transformers

    config_cls, model_cls, extra = _MODELS[name]
    config = getattr(transformers, config_cls)(**_COMMON, **extra)
    config.use_cache = False  # as transformers.Trainer leaves it
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config)
    workload = Workload(name=name, model=model, dataset=_Tokens(mask=mask), loss_fn=hf_loss, batch_size=8)
    config8 = TrainConfig(micro_batch_size=8, grad_clip=None)
    predicted = predict_memory(workload, config8, profile=profile_memory(workload, verify=False)).total
    measured = measure(workload, config8, steps=1, warmup=1).peak_bytes
    assert measured is not None
    return predicted, measured


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--without-fake-branches", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.without_fake_branches:
        RealBranches.__enter__ = lambda self: self  # type: ignore[method-assign]
    import transformers

    print(
        f"transformers {transformers.__version__}, torch {torch.__version__}, "
        f"fake branches {'off' if args.without_fake_branches else 'on'}"
    )
    print("| model | attention_mask | predicted B | measured B | error |\n|---|---|---:|---:|---:|")
    for name in _MODELS:
        for mask in (False, True):
            predicted, measured = _error(name, mask=mask)
            print(
                f"| {name} | {'all ones' if mask else 'none'} | {predicted} | {measured} | "
                f"{(predicted - measured) / measured:+.4%} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
