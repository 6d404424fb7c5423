"""Version 2 of the random architectures (``random2:SEED``): the structures users write (issue 19)."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from autotune.envs import shipped_profiles
from torch import nn

from autotune import Workload
from autotune.errors import WorkloadError
from autotune.resolve import load_workload
from autotune.zoo import random_workload, random_workload_from_ref
from autotune.zoo.random_arch import RandomArchSpec, count_parameters, sample_spec
from autotune.zoo.random_structure import FEATURES, RunningCenter, Structure, StructuredBlock
from tests.conftest import trained_step

#: Seeds 0-2 of version 2 draw every feature between them; 0-9 both ways a skip joins.
SEEDS = range(10)


def test_version_1_is_the_architecture_the_shipped_profiles_measured() -> None:
    profiles = {p.workload: p for p in shipped_profiles()}
    for seed in range(10, 15):
        spec = sample_spec(seed)
        assert spec.structure is None and spec.features == frozenset()
        assert count_parameters(spec) == profiles[f"random:{seed}"].num_parameters
    # The transfer check's held-out seeds, as they were drawn before version 2 existed.
    assert sample_spec(3) == RandomArchSpec(
        block_type="mlp", depth=6, width=96, seq_len=32, in_features=32, num_classes=9, batch_size=16
    )
    assert sample_spec(7) == RandomArchSpec(
        block_type="attention", depth=6, width=32, seq_len=16, in_features=8, num_classes=3, batch_size=128
    )


def test_version_2_draws_the_chain_of_version_1_where_it_fits_with_its_structure() -> None:
    redrawn = [
        seed for seed in SEEDS if dataclasses.replace(sample_spec(seed, version=2), structure=None) != sample_spec(seed)
    ]
    # Seed 2's chain (2 blocks, 76k parameters) with its drawn shared block has 39k: under
    # MIN_PARAMS, so version 2 draws on until a chain fits with the structure drawn for it.
    assert redrawn == [2]


def test_every_feature_is_drawn_over_the_first_seeds() -> None:
    drawn = [sample_spec(seed, version=2).features for seed in range(3)]
    assert frozenset().union(*drawn) == FEATURES
    structures = [sample_spec(seed, version=2).structure for seed in SEEDS]
    assert {s.merge for s in structures if s is not None and s.skips} == {"add", "concat"}


def _observed(workload: Workload) -> frozenset[str]:
    """The features of a built workload, read from its modules and data, not from its spec."""
    model = workload.model
    blocks = [model.get_submodule(n) for n in workload.block_names()]
    item = workload.dataset[0]
    out = model(*[t.unsqueeze(0) for t in ((item["x"], item["mask"]) if isinstance(item, dict) else item[:1])])
    flags = {
        "shared": len({id(b) for b in blocks}) < len(blocks),
        "tied": isinstance(out, dict) and model.recon is None,
        "skip": bool(model.sources),
        "batchnorm": any(isinstance(m, nn.BatchNorm1d) for m in model.modules()),
        "running": any(isinstance(m, RunningCenter) for m in model.modules()),
        "dropout": any(isinstance(m, nn.Dropout) for m in model.modules()),
        "dict_batch": isinstance(item, dict),
        "two_outputs": isinstance(out, dict),
    }
    assert all(isinstance(b, StructuredBlock) for b in blocks)
    return frozenset(name for name, on in flags.items() if on)


@pytest.mark.parametrize("seed", SEEDS)
def test_each_drawn_workload_has_its_features_and_trains_alike_recomputed(seed: int) -> None:
    workload = random_workload(seed, version=2)
    spec = sample_spec(seed, version=2)
    assert workload.name == f"random2-{seed}"
    assert workload.block_names() == tuple(f"blocks.{i}" for i in range(spec.depth))
    assert _observed(workload) == spec.features
    plain_loss, plain = trained_step(workload, checkpoint=False)
    loss, state = trained_step(workload, checkpoint=True)
    assert loss == plain_loss
    assert plain.keys() == state.keys() and all(torch.equal(plain[k], state[k]) for k in plain)


def test_a_shared_block_is_one_module_under_two_names() -> None:
    spec = sample_spec(2, version=2)
    assert spec.structure is not None and spec.structure.shared is not None
    j, i = spec.structure.shared
    model = random_workload(2, version=2).model
    assert model.get_submodule(f"blocks.{j}") is model.get_submodule(f"blocks.{i}")


def test_the_random2_reference_is_version_2() -> None:
    workload = load_workload("random2:5")
    assert (workload.name, workload.source) == ("random2-5", "random2:5")
    reference = random_workload(5, version=2).model.state_dict()
    assert all(torch.equal(v, reference[k]) for k, v in workload.model.state_dict().items())


@pytest.mark.parametrize("ref", ["random2:x", "random2:", "random2:+1"])
def test_a_bad_random2_reference_says_what_it_expects(ref: str) -> None:
    msg = f"workload {ref!r}: expected 'random2:SEED' with an integer SEED"
    with pytest.raises(WorkloadError, match=f"^{re.escape(msg)}$"):
        random_workload_from_ref(ref)


def test_an_unknown_version_is_refused() -> None:
    with pytest.raises(WorkloadError, match=f"^{re.escape('random_workload: version must be 1 or 2, but got 3.')}$"):
        random_workload(1, version=3)


@pytest.mark.parametrize(
    ("fields", "msg"),
    [
        ({"shared": (1, 1)}, "Structure.shared must be (j, i) with 0 <= i < j, but got (1, 1)."),
        ({"skips": ((0, 1),)}, "Structure.skips must be (i, j) pairs with 0 <= i < j - 1, but got [(0, 1)]."),
        ({"merge": "mul"}, "Structure.merge must be one of ['add', 'concat'], but got 'mul'."),
        ({"dropout": 1.0}, "Structure.dropout must be in [0, 1), but got 1.0."),
        ({"tied": True}, "Structure.tied needs two_outputs (the tied head is the second output's)."),
    ],
)
def test_structure_rules(fields: dict[str, object], msg: str) -> None:
    with pytest.raises(WorkloadError, match=f"^{re.escape(msg)}$"):
        Structure(**fields)  # type: ignore[arg-type]


def test_a_structure_must_fit_the_depth() -> None:
    structure = Structure(shared=(4, 0))
    msg = f"Structure positions must be < depth=4, but got {structure!r}."
    with pytest.raises(WorkloadError, match=f"^{re.escape(msg)}$"):
        RandomArchSpec(
            block_type="mlp",
            depth=4,
            width=32,
            seq_len=8,
            in_features=8,
            num_classes=2,
            batch_size=8,
            structure=structure,
        )
