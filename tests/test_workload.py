from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from autotune import Workload, WorkloadError, load_workload
from autotune.block_detection import BlockChoice, detect_blocks, find_blocks

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


def test_find_blocks_pools_same_class_container_children_holding_the_most_parameters() -> None:
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Linear(4, 4), nn.ReLU())  # ReLU: no parameters
            self.small = nn.ModuleList(nn.Conv1d(4, 4, 1) for _ in range(2))
            self.trunk = nn.ModuleList(nn.Linear(4, 4) for _ in range(3))

    assert find_blocks(Net()) == ("stem.0", "trunk.0", "trunk.1", "trunk.2")


class Bottleneck(nn.Module):
    """torchvision's ResNet bottleneck: 1x1, 3x3, 1x1 conv-BN, a projection shortcut when the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        mid = cout // 4
        self.conv1, self.bn1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv2, self.bn2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
        self.conv3, self.bn3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


class TorchvisionStyleResNet(nn.Module):
    """ResNet-50's layout (3, 4, 6, 3 bottlenecks in four nn.Sequential stages) at 1/16 of its width."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1, self.relu = nn.Conv2d(3, 4, 7, 2, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU()
        cin = 4
        for i, (depth, cout) in enumerate(zip((3, 4, 6, 3), (16, 32, 64, 128), strict=True)):
            stage = [Bottleneck(cin if j == 0 else cout, cout, 2 if i and j == 0 else 1) for j in range(depth)]
            setattr(self, f"layer{i + 1}", nn.Sequential(*stage))
            cin = cout
        self.fc = nn.Linear(128, 10)


def test_find_blocks_finds_every_bottleneck_of_a_torchvision_style_resnet_in_order() -> None:
    expected = tuple(f"layer{i + 1}.{j}" for i, depth in enumerate((3, 4, 6, 3)) for j in range(depth))
    assert find_blocks(TorchvisionStyleResNet()) == expected  # 16 blocks over four stages, not one stage


def _plain_mlp() -> nn.Sequential:
    units = (nn.Sequential(nn.Linear(64, 2048), nn.GELU(), nn.Linear(2048, 64)) for _ in range(4))
    return nn.Sequential(*units, nn.Linear(64, 10))


def test_find_blocks_takes_repeated_units_over_the_layers_inside_them_and_the_head() -> None:
    # The nine Linear layers (the head among them) hold the most parameters; the four units hold
    # every parameter of the eight inside them, and are repeats of one unit.
    choice = detect_blocks(_plain_mlp())
    assert choice == BlockChoice(("0", "1", "2", "3"), "4 repeated Sequential(Linear, GELU, Linear)")
    assert choice.describe() == "blocks: 0..3 (4 repeated Sequential(Linear, GELU, Linear))"
    assert find_blocks(_plain_mlp()) == choice.names


def test_the_block_choice_says_which_rule_found_the_blocks() -> None:
    resnet = detect_blocks(TorchvisionStyleResNet())  # pooled over four stages, not alike
    assert resnet.describe() == "blocks: layer1.0, layer1.1, layer1.2, ..., layer4.2 (16 Bottleneck)"
    assert detect_blocks(Declared()).reason == "3 repeated Layer(Linear), declared in _no_split_modules"
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 64))
    wl = Workload(name="w", model=_plain_mlp(), dataset=ds, loss_fn=lambda m, b: b, blocks=["0", "2"], batch_size=4)
    assert wl.block_choice().describe() == "blocks: 0, 2 (2 declared in Workload.blocks)"


def test_find_blocks_ties_go_to_the_coarser_class() -> None:
    # Each block's parameters are exactly its two Linears: same total, the 3 blocks beat the 6 Linears.
    net = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4)) for _ in range(3))
    assert find_blocks(net) == ("0", "1", "2")
    # Same count (one Linear per block): the outer modules, met first, win.
    net = nn.Sequential(*(nn.Sequential(nn.Linear(4, 4), nn.Tanh()) for _ in range(3)))
    assert find_blocks(net) == ("0", "1", "2")


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)


class Stage(nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(depth))


class Declared(nn.Module):
    """A Hugging Face-style model: it declares its block classes in ``_no_split_modules``."""

    _no_split_modules = ("Embed", "Stage", "Layer")

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.embed.__class__ = type("Embed", (nn.Embedding,), {})  # one declared instance: not a block
        self.stages = nn.ModuleList([Stage(2), Stage(1)])
        self.head = nn.Linear(4, 100)  # the most parameters, but not declared


def test_find_blocks_takes_the_innermost_repeated_declared_class() -> None:
    assert find_blocks(Declared()) == ("stages.0.layers.0", "stages.0.layers.1", "stages.1.layers.0")


def test_find_blocks_reads_declarations_of_a_wrapped_model() -> None:
    wrapper = nn.Sequential(Declared(), nn.Linear(100, 2))
    assert find_blocks(wrapper) == ("0.stages.0.layers.0", "0.stages.0.layers.1", "0.stages.1.layers.0")


def test_find_blocks_with_a_single_declared_instance_takes_it() -> None:
    class One(nn.Module):
        _no_split_modules = ("Stage",)

        def __init__(self) -> None:
            super().__init__()
            self.body = Stage(3)

    assert find_blocks(One()) == ("body",)


def test_find_blocks_ignores_declared_classes_that_are_absent() -> None:
    class Stale(nn.Module):
        _no_split_modules = ("NoSuchBlock",)

        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Layer() for _ in range(2))

    assert find_blocks(Stale()) == ("blocks.0", "blocks.1")


def test_find_blocks_without_candidates() -> None:
    with _raises(
        "Workload 'w': cannot auto-detect blocks (no class of model._no_split_modules is present, and no "
        "two or more same-class modules with parameters sit in an nn.ModuleList, nn.Sequential or "
        "nn.ModuleDict); pass blocks=[...] to Workload."
    ):
        find_blocks(nn.Linear(3, 3), workload="w")


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


def test_loaded_workloads_remember_their_source() -> None:
    assert load_workload("gpt-tiny").source == "gpt-tiny"
    assert load_workload("random:3").source == "random:3"
    assert load_workload("tests.data.my_workload:build").source == "tests.data.my_workload:build"
    relative = USER.relative_to(Path.cwd())
    assert load_workload(f"{relative}:build").source == f"{USER}:build"


def test_declared_units_in_parallel_branches_give_way_to_the_module_that_holds_them() -> None:
    """Hugging Face's ResNet declares its conv layers and the shortcut beside them: not a chain of
    blocks (the residual add is in neither), so the repeated bottleneck holding them is the block."""

    class ConvLayer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(4, 4, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.conv(x).relu()

    class Bottleneck(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shortcut = ConvLayer()
            self.layer = nn.Sequential(ConvLayer(), ConvLayer())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(x) + self.shortcut(x)

    class Net(nn.Module):
        _no_split_modules = ("ConvLayer",)

        def __init__(self) -> None:
            super().__init__()
            self.stem = ConvLayer()
            self.stages = nn.ModuleList(nn.Sequential(Bottleneck(), Bottleneck()) for _ in range(2))

    assert find_blocks(Net()) == ("stages.0.0", "stages.0.1", "stages.1.0", "stages.1.1")


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
