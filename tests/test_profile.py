from __future__ import annotations

from autotune import load_workload
from autotune.profile import profile_blocks
from tests.conftest import make_resmlp


def test_block_saved_bytes_are_exact_and_scale_with_the_batch() -> None:
    wl = make_resmlp()  # 4 identical blocks, d=64, seq 32
    one, two = profile_blocks(wl, micro_batch_size=1), profile_blocks(wl, micro_batch_size=2)
    # Per block and sample: LayerNorm input, LN output + mean + rstd, up-proj output, GELU output:
    # 32 tokens x (64 + 64 + 1 + 1 + 256 + 256) fp32 values = 82,176 bytes.
    assert one.saved_bytes == (82_176,) * 4
    assert two.saved_bytes == (2 * 82_176,) * 4
    assert one.names == ("blocks.0", "blocks.1", "blocks.2", "blocks.3")


def test_bf16_blocks_save_fewer_bytes_per_sample() -> None:
    wl = load_workload("gpt-tiny")
    fp32 = profile_blocks(wl, micro_batch_size=4, precision="fp32")
    bf16_4 = profile_blocks(wl, micro_batch_size=4, precision="bf16")
    bf16_8 = profile_blocks(wl, micro_batch_size=8, precision="bf16")
    per_sample_bf16 = [(b - a) / 4 for a, b in zip(bf16_4.saved_bytes, bf16_8.saved_bytes, strict=True)]
    assert all(s < f / 4 for s, f in zip(per_sample_bf16, fp32.saved_bytes, strict=True))


def test_ranking_puts_hungriest_blocks_first() -> None:
    wl = load_workload("resnet-tiny")  # early stages run at higher resolution: more activations
    prof = profile_blocks(wl, micro_batch_size=2)
    order = prof.ranked()
    assert [prof.saved_bytes[i] for i in order] == sorted(prof.saved_bytes, reverse=True)
    assert prof.names[order[0]].startswith("layer1")
