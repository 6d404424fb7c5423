from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from autotune import Workload, WorkloadError, load_workload
from autotune.workload import find_blocks

DATA = Path(__file__).parent / "data"
USER = DATA / "my_workload.py"


def _raises(msg: str) -> pytest.RaisesContext[WorkloadError]:
    return pytest.raises(WorkloadError, match=f"^{re.escape(msg)}$")


def test_user_file_reference() -> None:
    wl = load_workload(f"{USER}:build")
    assert wl.name == "my-net"
    assert wl.block_names() == ("layers.0", "layers.1", "layers.2")  # auto-detected
    assert wl.num_parameters == 3 * (32 * 32 + 32) + 32 * 2 + 2


def test_module_reference() -> None:
    assert load_workload("tests.data.my_workload:build").name == "my-net"


@pytest.mark.parametrize(
    ("ref", "msg"),
    [
        ("nope.py:build", "workload 'nope.py:build': file 'nope.py' does not exist"),
        (f"{USER}:missing", f"workload '{USER}:missing': '{USER}' has no attribute 'missing'"),
        (f"{USER}:NOT_CALLABLE", f"workload '{USER}:NOT_CALLABLE': 'NOT_CALLABLE' is a int, expected a function"),
        (
            f"{USER}:not_a_workload",
            f"workload '{USER}:not_a_workload': not_a_workload() returned int, expected autotune.Workload",
        ),
        (f"{USER}:explodes", f"workload '{USER}:explodes': explodes() raised ValueError: bad hyperparameter"),
        (f"{USER}:", f"workload '{USER}:': '' after ':' is not a Python function name"),
        ("no_such_pkg.mod:build", "workload 'no_such_pkg.mod:build': no module named 'no_such_pkg.mod'"),
    ],
)
def test_bad_references(ref: str, msg: str) -> None:
    with _raises(msg):
        load_workload(ref)


def test_unknown_name_lists_the_builtins() -> None:
    from autotune.zoo import BUILTINS

    names = ", ".join(sorted(BUILTINS))
    with _raises(
        f"unknown workload 'gpt-huge': expected a built-in name ({names}), 'random:SEED', "
        "'path/to/file.py:build' or 'package.module:build'"
    ):
        load_workload("gpt-huge")


def test_syntax_error_in_user_file_is_one_line() -> None:
    with pytest.raises(
        WorkloadError,
        match=r"^workload '.*broken_syntax.py:build': importing '.*broken_syntax.py' "
        r"raised SyntaxError: ",
    ):
        load_workload(f"{DATA / 'broken_syntax.py'}:build")


def test_find_blocks_picks_the_largest_same_typed_container() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Linear(4, 4), nn.ReLU())  # mixed types: not blocks
            self.small = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))
            self.trunk = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    assert find_blocks(Net()) == ("trunk.0", "trunk.1", "trunk.2")


def test_find_blocks_without_candidates() -> None:
    with _raises(
        "Workload 'w': cannot auto-detect blocks (no nn.ModuleList or nn.Sequential of two or more "
        "same-typed modules with parameters); pass blocks=[...] to Workload."
    ):
        find_blocks(nn.Linear(3, 3), workload="w")


def test_declared_blocks_are_checked() -> None:
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 3))
    with _raises("Workload 'w': blocks names 'layer9', which is not a submodule of the model."):
        Workload(name="w", model=nn.Linear(3, 3), dataset=ds, loss_fn=lambda m, b: m(b[0]).sum(), blocks=["layer9"])


def test_workload_fields_are_validated() -> None:
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 3))
    with _raises("Workload.model must be a torch.nn.Module, but got str."):
        Workload(name="w", model="resnet", dataset=ds, loss_fn=lambda m, b: b)  # type: ignore[arg-type]
    with _raises("Workload.batch_size must be an int >= 1, but got 0."):
        Workload(name="w", model=nn.Linear(3, 3), dataset=ds, loss_fn=lambda m, b: b, batch_size=0)


def test_loaded_workloads_remember_their_source() -> None:
    assert load_workload("gpt-tiny").source == "gpt-tiny"
    assert load_workload("random:3").source == "random:3"
    assert load_workload("tests.data.my_workload:build").source == "tests.data.my_workload:build"
    relative = USER.relative_to(Path.cwd())
    assert load_workload(f"{relative}:build").source == f"{USER}:build"
