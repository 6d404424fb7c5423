"""transformers' data-dependent mask checks, answered from the real batch in the fake pass: a
decoder LM without a cache (what ``transformers.Trainer`` sets) is predicted exactly."""

from __future__ import annotations

from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from autotune import TrainConfig, Workload, measure, predict_memory
from autotune.memory.fake_branches import RealBranches
from autotune.memory.predict import profile_memory
from autotune.zoo import CORPUS

CONFIG = TrainConfig(micro_batch_size=8, grad_clip=None)


class _Masked(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    """The corpus samples with an ``attention_mask``: all ones, or the last ``pad`` tokens masked."""

    def __init__(self, base: Any, pad: int) -> None:
        self.base, self.pad = base, pad

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = dict(self.base[i])
        mask = torch.ones_like(item["input_ids"])
        if self.pad:
            mask[-self.pad :] = 0
        return {**item, "attention_mask": mask}


def _llama_without_cache(pad: int | None = None) -> Workload:
    entry = CORPUS["hf-llama"]
    wl = entry.build(**entry.tiny)
    wl.model.config.use_cache = False  # as transformers.Trainer leaves it
    if pad is None:
        return wl
    return Workload(
        name=wl.name,
        model=wl.model,
        dataset=_Masked(wl.dataset, pad),
        loss_fn=wl.loss_fn,
        blocks=wl.blocks,
        batch_size=wl.batch_size,
    )


def _error(wl: Workload) -> float:
    predicted = predict_memory(wl, CONFIG, profile=profile_memory(wl, verify=False)).total
    measured = measure(wl, CONFIG, steps=1, warmup=1).peak_bytes
    assert measured is not None
    return (predicted - measured) / measured


@pytest.mark.parametrize("pad", [None, 0, 3], ids=["no attention_mask", "all ones", "padded"])
def test_a_decoder_without_a_cache_is_predicted_as_it_runs(pad: int | None) -> None:
    # The padded batch materialises the causal mask in the real step too: both sides agree.
    assert abs(_error(_llama_without_cache(pad))) < 1e-4


@pytest.mark.parametrize(
    ("blind", "pad"),
    [("both checks", None), ("the padding-mask check", 0)],
)
def test_without_the_real_answers_the_fake_pass_materialises_a_mask_the_real_step_skips(
    monkeypatch: pytest.MonkeyPatch, blind: str, pad: int | None
) -> None:
    if blind == "both checks":
        monkeypatch.setattr(RealBranches, "__enter__", lambda self: self)
    else:
        monkeypatch.setattr(RealBranches, "_ignore", lambda self, original: original)
    assert _error(_llama_without_cache(pad)) > 0.01  # measured: +1.15% on this tiny model, +6% on a Mistral


def test_the_functions_are_transformers_own_again_after_the_pass() -> None:
    import transformers.masking_utils as masking

    before = (masking.find_packed_sequence_indices, masking._ignore_causal_mask_sdpa)
    with RealBranches({"input_ids": torch.zeros(2, 4, dtype=torch.long)}):
        assert masking.find_packed_sequence_indices is not before[0]
    assert (masking.find_packed_sequence_indices, masking._ignore_causal_mask_sdpa) == before
