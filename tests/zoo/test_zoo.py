"""Tests of the built-in workloads and the random-architecture generator."""

from __future__ import annotations

import copy
import math
import pickle
import re
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
import torch
from torch.utils.data import default_collate

from autotune.errors import WorkloadError
from autotune.resolve import load_workload
from autotune.workload import Workload
from autotune.zoo import BUILTINS, CORPUS, ZooEntry, random_workload, random_workload_from_ref
from autotune.zoo.random_arch import MAX_PARAMS, MAX_STEP_FLOPS, MIN_PARAMS, count_parameters, sample_spec

# name -> (stated parameter range, exact count today, number of blocks)
EXPECTED = {
    "gpt-tiny": ((1_000_000, 2_000_000), 1_263_616, 6),
    "gpt-small": ((10_000_000, 20_000_000), 10_893_312, 6),
    "resnet-tiny": ((150_000, 250_000), 175_258, 6),
    "mlp-digits": ((400_000, 700_000), 548_106, 4),
}
REFS = [*EXPECTED, "random:3"]


@cache
def cached(ref: str) -> Workload:
    """One build per reference for the read-only tests (training tests copy the model)."""
    return load_workload(ref)


def collate(wl: Workload, indices: range | list[int]) -> Any:
    return default_collate([wl.dataset[i] for i in indices])


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def assert_same_items(a: Workload, b: Workload, indices: list[int]) -> None:
    assert len(a.dataset) == len(b.dataset)
    for i in indices:
        x, y = a.dataset[i], b.dataset[i]
        pairs = zip(x, y, strict=True) if isinstance(x, tuple) else [(x, y)]
        for u, v in pairs:
            assert torch.equal(u, v), i


# --- the package --------------------------------------------------------------------------


def test_importing_zoo_does_not_import_torch_or_sklearn() -> None:
    code = "import sys, autotune.zoo; print('torch' in sys.modules, 'sklearn' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_builtins_have_exactly_the_documented_names() -> None:
    own = ["gpt-tiny", "gpt-small", "resnet-tiny", "mlp-digits"]
    assert list(BUILTINS) == own + list(CORPUS)  # the corpus has its own tests (test_corpus.py)
    for name, entry in BUILTINS.items():
        assert entry.name == name
        assert entry.description
        assert (entry.source == "autotune") == (name in own)


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"name": ""}, "ZooEntry.name must be a non-empty string, but got ''."),
        ({"description": ""}, "ZooEntry.description must be a non-empty string, but got ''."),
        ({"build": 3}, "ZooEntry.build must be callable, but got 3."),
        ({"source": ""}, "ZooEntry.source must be a non-empty string, but got ''."),
    ],
)
def test_zoo_entry_validates_each_field(kwargs: dict[str, Any], msg: str) -> None:
    fields: dict[str, Any] = {"name": "x", "description": "d", "build": BUILTINS["gpt-tiny"].build}
    with pytest.raises(WorkloadError, match=f"^{re.escape(msg)}$"):
        ZooEntry(**(fields | kwargs))


# --- every built-in (and one random workload) ---------------------------------------------


@pytest.mark.parametrize("name", list(EXPECTED))
def test_parameter_count_is_in_the_stated_range(name: str) -> None:
    (low, high), exact, _ = EXPECTED[name]
    n = cached(name).num_parameters
    assert low <= n <= high
    assert n == exact  # a change here changes every cached measurement of the workload


@pytest.mark.parametrize("ref", REFS)
def test_building_twice_is_bit_identical_and_leaves_the_global_rng_alone(ref: str) -> None:
    rng_before = torch.get_rng_state()
    a, b = load_workload(ref), load_workload(ref)
    assert torch.equal(torch.get_rng_state(), rng_before)
    assert a.name == b.name
    assert_same_state(a.model, b.model)
    assert_same_items(a, b, [0, 1, len(a.dataset) - 1])


@pytest.mark.parametrize("ref", REFS)
def test_blocks_resolve_to_same_typed_submodules(ref: str) -> None:
    wl = cached(ref)
    names = wl.block_names()
    assert len(names) == EXPECTED[ref][2] if ref in EXPECTED else len(names) >= 1
    modules = [wl.model.get_submodule(n) for n in names]
    assert len({type(m) for m in modules}) == 1
    assert all(sum(p.numel() for p in m.parameters()) > 0 for m in modules)


def test_block_names_are_the_documented_ones() -> None:
    assert cached("gpt-tiny").block_names() == tuple(f"blocks.{i}" for i in range(6))
    assert cached("resnet-tiny").block_names() == (
        "layer1.0",
        "layer1.1",
        "layer2.0",
        "layer2.1",
        "layer3.0",
        "layer3.1",
    )
    assert cached("mlp-digits").block_names() == tuple(f"blocks.{i}" for i in range(4))


@pytest.mark.parametrize(("name", "length", "batch_size"), [("gpt-tiny", 65, 32), ("gpt-small", 129, 16)])
def test_gpt_items_are_token_sequences_one_longer_than_the_context(name: str, length: int, batch_size: int) -> None:
    wl = cached(name)
    item = wl.dataset[0]
    assert item.dtype == torch.long and item.shape == (length,)
    assert int(item.min()) >= 0 and int(item.max()) < 512
    assert wl.batch_size == batch_size


def test_image_and_digit_items_are_feature_label_pairs() -> None:
    image, label = cached("resnet-tiny").dataset[0]
    assert image.dtype == torch.float32 and image.shape == (3, 32, 32)
    assert label.dtype == torch.long and 0 <= int(label) < 10
    digits = cached("mlp-digits")
    features, label = digits.dataset[0]
    assert features.dtype == torch.float32 and features.shape == (64,)
    assert len(digits.dataset) == 1797 and int(label) == 0  # scikit-learn's first digit is a 0


@pytest.mark.parametrize(
    ("ref", "num_classes"),
    [("gpt-tiny", 512), ("gpt-small", 512), ("resnet-tiny", 10), ("mlp-digits", 10)],
)
def test_initial_loss_is_a_finite_fp32_scalar_near_chance(ref: str, num_classes: int) -> None:
    wl = cached(ref)
    with torch.no_grad():
        loss = wl.loss_fn(copy.deepcopy(wl.model), collate(wl, range(8)))
    assert loss.dtype == torch.float32 and loss.shape == ()
    # Chance level is log(classes); a badly scaled init would be far above it.
    assert abs(float(loss) - math.log(num_classes)) < 0.5


@pytest.mark.parametrize("ref", REFS)
def test_blocks_under_bf16_autocast_returning_fp32_give_the_same_loss(ref: str) -> None:
    """What the runner does to a block (autocast inside, output cast back to fp32) must keep the
    model working: same loss to bf16 precision, finite gradients everywhere."""
    wl = cached(ref)
    batch = collate(wl, range(4))
    if ref.startswith("gpt"):
        batch = batch[:, :17]  # bf16 matmuls are slow on CPUs without bf16 units
    model = copy.deepcopy(wl.model)
    with torch.no_grad():
        reference = float(wl.loss_fn(model, batch))
    for name in wl.block_names():
        block = model.get_submodule(name)
        block.forward = _autocast_bf16(block.forward)  # type: ignore[method-assign]
    loss = wl.loss_fn(model, batch)
    loss.backward()
    assert loss.dtype == torch.float32
    assert float(loss.detach()) == pytest.approx(reference, abs=0.02)
    for p in model.parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all())


def _autocast_bf16(forward: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    def wrapped(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = forward(x)
        return out.float()

    return wrapped


@pytest.mark.parametrize("ref", REFS)
def test_workload_survives_pickling(ref: str) -> None:
    """Runners may ship a workload to another process."""
    wl = cached(ref)
    clone = pickle.loads(pickle.dumps(wl))
    assert_same_state(wl.model, clone.model)
    assert_same_items(wl, clone, [0])
    assert clone.loss_fn is wl.loss_fn


# --- learnability -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ref", "steps", "max_ratio"),
    [
        # Measured ratios: gpt-tiny 0.65, mlp-digits 0.22, resnet-tiny 0.67, random:3 ~0.3.
        ("gpt-tiny", 30, 0.8),
        ("mlp-digits", 100, 0.4),
        ("resnet-tiny", 60, 0.8),
        ("random:3", 40, 0.7),
    ],
)
def test_short_adamw_run_lowers_held_out_loss(ref: str, steps: int, max_ratio: float) -> None:
    """AdamW at the default rate, batch 32, on all but the last 256 items; the loss is measured
    on those 256 held-out items before and after."""
    wl = cached(ref)
    model = copy.deepcopy(wl.model)
    n = len(wl.dataset)
    held_out = collate(wl, range(n - 256, n))
    g = torch.Generator().manual_seed(0)

    def held_out_loss() -> float:
        with torch.no_grad():  # train mode: no dropout anywhere; BatchNorm uses batch statistics
            return float(wl.loss_fn(model, held_out))

    initial = held_out_loss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        loss = wl.loss_fn(model, collate(wl, torch.randint(n - 256, (32,), generator=g).tolist()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert held_out_loss() < max_ratio * initial


def test_gpt_language_is_far_below_uniform_entropy() -> None:
    """The Markov language's own next-token entropy, estimated from bigram counts of the corpus
    (an upper bound on the per-topic entropy), is far below log(512): the loss has room to fall."""
    tokens = cached("gpt-tiny").dataset.tokens  # type: ignore[attr-defined]
    pairs = tokens[:, :-1] * 512 + tokens[:, 1:]
    counts = torch.bincount(pairs.flatten(), minlength=512 * 512).view(512, 512).double()
    p_next = counts / counts.sum(dim=1, keepdim=True).clamp(min=1)
    cond_entropy = -(counts * torch.log(p_next.clamp(min=1e-30))).sum() / counts.sum()
    assert float(cond_entropy) < 0.6 * math.log(512)


# --- random workloads ---------------------------------------------------------------------


def test_random_workload_same_seed_is_identical() -> None:
    a, b = random_workload(7), random_workload(7)
    assert a.name == b.name == "random-7"
    assert a.batch_size == b.batch_size
    assert_same_state(a.model, b.model)
    assert_same_items(a, b, list(range(len(a.dataset))))


def test_random_workload_different_seeds_differ() -> None:
    a, b = random_workload(7), random_workload(8)
    assert a.name != b.name
    assert sample_spec(7) != sample_spec(8)
    assert not torch.equal(a.dataset[0][0].flatten()[:8], b.dataset[0][0].flatten()[:8])


def test_random_ref_equals_random_workload() -> None:
    wl = load_workload("random:3")
    assert wl.name == "random-3"
    assert_same_state(wl.model, random_workload(3).model)


def test_random_specs_respect_the_size_and_cost_bounds_and_cover_every_block_type() -> None:
    kinds = set()
    for seed in range(60):
        spec = sample_spec(seed)
        n = count_parameters(spec)
        assert MIN_PARAMS <= n <= MAX_PARAMS, (seed, n)
        assert spec.step_flops(n) <= MAX_STEP_FLOPS, seed
        kinds.add(spec.block_type)
    assert kinds == {"mlp", "attention", "conv"}


def test_random_overrides_fix_fields_and_mark_the_name() -> None:
    wl = random_workload(3, block_type="conv", depth=1)
    assert wl.name == "random-3(block_type=conv,depth=1)"
    assert wl.block_names() == ("blocks.0",)
    assert type(wl.model.get_submodule("blocks.0")).__name__ == "ConvBlock"
    spec = sample_spec(3, {"block_type": "conv", "depth": 1})
    assert (spec.block_type, spec.depth) == ("conv", 1)


@pytest.mark.parametrize(
    ("seed", "overrides", "msg"),
    [
        (-1, {}, "random_workload: seed must be an int in [0, 2**63), but got -1."),
        (2**63, {}, f"random_workload: seed must be an int in [0, 2**63), but got {2**63}."),
        (True, {}, "random_workload: seed must be an int in [0, 2**63), but got True."),
        (0, {"depth": 0}, "RandomArchSpec.depth must be an int >= 1, but got 0."),
        (0, {"num_classes": 1}, "RandomArchSpec.num_classes must be an int >= 2, but got 1."),
        (
            0,
            {"block_type": "rnn"},
            "RandomArchSpec.block_type must be one of ['mlp', 'attention', 'conv'], but got 'rnn'.",
        ),
        (
            0,
            {"colour": 1},
            "random_workload: unknown override(s) ['colour']; expected some of "
            "['batch_size', 'block_type', 'depth', 'in_features', 'num_classes', 'seq_len', 'width'].",
        ),
        (
            0,
            {"width": 100_000},
            "random_workload: no architecture with 50000-3000000 parameters and at most 6e+09 FLOPs "
            "per step fits the overrides {'width': 100000}.",
        ),
    ],
)
def test_random_workload_rejects_bad_arguments(seed: Any, overrides: dict[str, Any], msg: str) -> None:
    with pytest.raises(WorkloadError, match=f"^{re.escape(msg)}$"):
        random_workload(seed, **overrides)


@pytest.mark.parametrize("ref", ["random:x", "random:", "random:1.5", "random:+1", "random: 1", "random:1_0"])
def test_bad_random_ref_gives_one_line(ref: str) -> None:
    msg = f"workload {ref!r}: expected 'random:SEED' with an integer SEED"
    with pytest.raises(WorkloadError, match=f"^{re.escape(msg)}$"):
        load_workload(ref)
    with pytest.raises(WorkloadError, match=f"^{re.escape(msg)}$"):
        random_workload_from_ref(ref)


@pytest.mark.parametrize("seed", ["-1", str(2**63)])
def test_random_ref_seed_out_of_range_says_so(seed: str) -> None:
    msg = f"workload 'random:{seed}': SEED must be in [0, 2**63), but got {seed}"
    with pytest.raises(WorkloadError, match=f"^{re.escape(msg)}$"):
        load_workload(f"random:{seed}")


def test_largest_random_seed_builds() -> None:
    assert random_workload(2**63 - 1).name == f"random-{2**63 - 1}"
