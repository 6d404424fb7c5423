from __future__ import annotations

import dataclasses
import pickle
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from autotune import Workload, WorkloadError, load_workload
from autotune.resolve import source_of

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


def test_declared_blocks_are_checked() -> None:
    ds = torch.utils.data.TensorDataset(torch.zeros(32, 3))
    with _raises("Workload 'w': blocks names 'layer9', which is not a submodule of the model."):
        Workload(name="w", model=nn.Linear(3, 3), dataset=ds, loss_fn=lambda m, b: m(b[0]).sum(), blocks=["layer9"])


def test_workload_fields_are_validated() -> None:
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 3))
    with _raises("Workload.model must be a torch.nn.Module, but got str."):
        Workload(name="w", model="resnet", dataset=ds, loss_fn=lambda m, b: b)  # type: ignore[arg-type]
    with _raises("Workload.batch_size must be an int >= 1, but got 0."):
        Workload(name="w", model=nn.Linear(3, 3), dataset=ds, loss_fn=lambda m, b: b, batch_size=0)


def test_a_map_style_dataset_must_hold_a_batch() -> None:
    empty = torch.utils.data.TensorDataset(torch.zeros(0, 3))
    with _raises("Workload.dataset must hold at least one sample, but got an empty TensorDataset."):
        Workload(name="w", model=nn.Linear(3, 3), dataset=empty, loss_fn=lambda m, b: b)
    small = torch.utils.data.TensorDataset(torch.zeros(100, 3))
    with _raises("Workload.batch_size must be at most the dataset's 100 samples, but got 512."):
        Workload(name="w", model=nn.Linear(3, 3), dataset=small, loss_fn=lambda m, b: b, batch_size=512)
    whole = Workload(name="w", model=nn.Linear(3, 3), dataset=small, loss_fn=lambda m, b: b, batch_size=100)
    assert whole.batch_size == 100


def test_an_empty_iterable_dataset_yields_no_batch_in_one_line() -> None:
    class Empty(torch.utils.data.IterableDataset[torch.Tensor]):
        def __iter__(self) -> Iterator[torch.Tensor]:
            return iter(())

    wl = Workload(name="w", model=nn.Linear(3, 3), dataset=Empty(), loss_fn=lambda m, b: b)
    with _raises("Workload 'w': the dataset yielded no sample; it must yield at least one."):
        wl.first_batch(4)


def test_a_dataset_must_be_map_style_or_iterable_and_a_collate_callable() -> None:
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 3))
    with _raises(
        "Workload.dataset must be a map-style Dataset (with __getitem__ and __len__) or an IterableDataset, "
        "but got generator."
    ):
        Workload(name="w", model=nn.Linear(3, 3), dataset=(x for x in ds), loss_fn=lambda m, b: b)  # type: ignore[arg-type]
    with _raises("Workload.collate_fn must be callable or None, but got 'pad'."):
        Workload(name="w", model=nn.Linear(3, 3), dataset=ds, loss_fn=lambda m, b: b, collate_fn="pad")  # type: ignore[arg-type]


def test_an_iterable_dataset_has_no_size_and_its_first_batch_uses_the_collate() -> None:
    wl = load_workload(f"{DATA / 'padded_workload.py'}:build")
    assert (wl.iterable, wl.dataset_size) == (True, None)
    first = list(iter(wl.dataset))[:3]
    batch = wl.first_batch(3)
    assert batch.keys() == {"input_ids"}
    assert batch["input_ids"].shape == (3, max(len(s) for s in first))
    for row, seq in zip(batch["input_ids"], first, strict=True):
        assert torch.equal(row[: len(seq)], seq) and not row[len(seq) :].any()  # right-padded with 0
    mapped = load_workload(f"{DATA / 'padded_workload.py'}:build_map_style")
    assert (mapped.iterable, mapped.dataset_size) == (False, 64)
    assert torch.equal(mapped.first_batch(3)["input_ids"], batch["input_ids"])


def test_loaded_workloads_remember_their_source_which_is_known_before_loading() -> None:
    relative = USER.relative_to(Path.cwd())
    expected = {
        "gpt-tiny": "gpt-tiny",
        "random:3": "random:3",
        "tests.data.my_workload:build": "tests.data.my_workload:build",
        f"{relative}:build": f"{USER}:build",
    }
    assert {ref: load_workload(ref).source for ref in expected} == expected
    # What a study's measuring child is launched with, before this process loads the workload.
    assert {ref: source_of(ref) for ref in expected} == expected


class _Tied(torch.nn.Module):
    """An embedding tied to its output head, a frozen layer and a BatchNorm (buffers)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.frozen = torch.nn.Linear(4, 4)
        self.frozen.requires_grad_(False)
        self.norm = torch.nn.BatchNorm1d(4)
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight


def _tied_workload() -> Workload:
    model = _Tied().eval()
    model.embed.weight.grad = torch.ones_like(model.embed.weight)
    return Workload(
        name="tied",
        model=model,
        dataset=torch.utils.data.TensorDataset(torch.zeros(4, dtype=torch.long)),
        loss_fn=lambda m, batch: m.head(m.embed(batch[0])).sum(),
        batch_size=2,
        blocks=["frozen", "norm"],
    )


def test_a_model_copy_goes_straight_to_its_device_tied_frozen_and_without_gradients() -> None:
    """The meta device stands in for a GPU: a model a Trainer moved there is copied to the host
    for the memory analyses (and the other way round) without a copy on its own device first."""
    wl = _tied_workload()
    copy = wl.model_copy("meta")
    assert {t.device.type for t in (*copy.parameters(), *copy.buffers())} == {"meta"}
    assert {t.device.type for t in (*wl.model.parameters(), *wl.model.buffers())} == {"cpu"}  # untouched
    assert copy.head.weight is copy.embed.weight  # still tied
    assert [p.requires_grad for p in copy.parameters()] == [p.requires_grad for p in wl.model.parameters()]
    assert copy.embed.weight.grad is None and wl.model.embed.weight.grad is not None
    assert copy.training and not wl.model.training


def test_a_model_copy_on_the_same_device_shares_no_storage() -> None:
    wl = _tied_workload()
    copy = wl.model_copy()
    with torch.no_grad():
        copy.embed.weight.zero_()
        copy.norm.running_mean.fill_(7.0)
    assert wl.model.embed.weight.abs().sum() > 0
    assert torch.equal(wl.model.norm.running_mean, torch.zeros(4))


def test_a_fake_model_copy_of_a_model_elsewhere_is_on_the_host_and_allocates_nothing() -> None:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    wl = _tied_workload()
    elsewhere = dataclasses.replace(wl, model=wl.model_copy("meta"))
    fake = elsewhere.model_copy("cpu", fake=FakeTensorMode())
    tensors = [*fake.parameters(), *fake.buffers()]
    assert all(isinstance(t, FakeTensor) and t.device.type == "cpu" for t in tensors)
    assert fake.head.weight is fake.embed.weight


class _Unpicklable:
    """Accelerate's ``ConvertOutputsToFp32``: a callable wrapper around a forward that refuses
    to be pickled (which ``copy.copy`` asks)."""

    def __init__(self, forward: Any) -> None:
        self.forward = forward

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def __getstate__(self) -> None:
        raise pickle.PicklingError("cannot pickle a prepared model")


def _patched(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its forward patched as TRL's ``add_fused_lm_head`` does (a closure over the
    bound original), then wrapped as Accelerate's ``prepare_model`` does (a function of the
    patched function, through a callable object)."""
    original_forward = model.forward

    def fused(self: torch.nn.Module, x: torch.Tensor, *, doubled: bool = False) -> torch.Tensor:
        out: torch.Tensor = original_forward(x)
        return 2 * out if doubled else out

    model.forward = types.MethodType(fused, model)  # type: ignore[method-assign]
    wrapper = _Unpicklable(model.forward.__func__)

    def prepared(*args: Any, **kwargs: Any) -> Any:
        return wrapper(*args, **kwargs)

    model.forward = types.MethodType(prepared, model)  # type: ignore[method-assign]
    return model


def test_a_copy_of_a_model_whose_forward_a_library_patched_runs_its_own_weights() -> None:
    """TRL's fused LM head keeps the original's bound forward in a closure, which deepcopy shares:
    the copy ran the original's weights (and a fake copy failed on the first real one)."""
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    torch.manual_seed(0)
    model = _patched(torch.nn.Linear(3, 2))
    wl = Workload(name="w", model=model, dataset=[torch.ones(3)] * 2, loss_fn=lambda m, b: m(b).sum(), batch_size=2)
    copy = wl.model_copy()
    with torch.no_grad():
        copy.weight.zero_()
        copy.bias.fill_(1.0)
    assert copy(torch.ones(1, 3), doubled=True).tolist() == [[2.0, 2.0]]  # the copy's weights, the patch kept
    assert model(torch.ones(1, 3)).tolist() != [[1.0, 1.0]]
    mode = FakeTensorMode()
    fake = wl.model_copy(fake=mode)
    with mode:
        out = fake(torch.ones(1, 3), doubled=True)
    assert isinstance(out, FakeTensor) and out.shape == (1, 2)


def test_detected_blocks_are_found_once_per_module_tree() -> None:
    from unittest import mock

    from autotune import block_detection

    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()) for _ in range(3)))
    wl = Workload(name="w", model=model, dataset=[torch.zeros(4)] * 4, loss_fn=lambda m, b: m(b).sum(), batch_size=2)
    with mock.patch.object(block_detection, "_declared_blocks", wraps=block_detection._declared_blocks) as rule:
        assert [wl.block_names() for _ in range(3)] == [("0", "1", "2")] * 3
        assert rule.call_count == 1
        model.append(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))  # the tree changed
        assert wl.block_names() == ("0", "1", "2", "3") and rule.call_count == 2
