"""The suite's shared fake-tensor profiles (tests/profile_memo.py) are shared only between identical inputs."""

from __future__ import annotations

import contextlib
import dataclasses

import torch

from autotune.resolve import load_workload
from tests.conftest import make_resmlp
from tests.profile_memo import ProfileMemo, workload_key


def test_two_builds_of_one_workload_share_a_key() -> None:
    assert workload_key(load_workload("gpt-tiny"), (2, 4)) == workload_key(load_workload("gpt-tiny"), (2, 4))
    assert workload_key(make_resmlp(), (2,)) == workload_key(make_resmlp(), (2,))


def test_whatever_can_change_a_fake_run_changes_the_key() -> None:
    base = workload_key(make_resmlp(), (2,))
    frozen = make_resmlp()
    frozen.model.inp.weight.requires_grad_(False)
    half = make_resmlp()
    half.model.out.to(torch.bfloat16)
    flagged = make_resmlp()
    flagged.model.blocks[1].gradient_checkpointing = True  # an attribute the forward reads, not in repr
    hooked = make_resmlp()
    hooked.model.blocks[0].register_forward_hook(lambda module, args, out: out * 2)
    evaluating = make_resmlp()
    evaluating.model.blocks[2].eval()
    deeper = make_resmlp(depth=5)
    longer = make_resmlp(seq=33)
    other_blocks = dataclasses.replace(make_resmlp(), blocks=["blocks.0", "blocks.1"])
    keys = [workload_key(w, (2,)) for w in (frozen, half, flagged, hooked, evaluating, deeper, longer, other_blocks)]
    assert base not in keys and len(set(keys)) == len(keys)
    assert workload_key(make_resmlp(), (4,)) != base  # another batch


def test_a_result_is_shared_and_a_raise_is_not_stored() -> None:
    memo, calls = ProfileMemo(), []

    def profile(x: int) -> int:
        calls.append(x)
        if x < 0:
            raise ValueError(x)
        return 2 * x

    shared = memo.wrap(profile, lambda x: (x,))
    assert [shared(3), shared(3), shared(4)] == [6, 6, 8]
    for _ in range(2):
        with contextlib.suppress(ValueError):
            shared(-1)
    assert (calls, memo.hits) == ([3, 4, -1, -1], 1)
