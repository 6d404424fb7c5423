"""Block detection (autotune/block_detection.py): which modules are a model's blocks, and why."""

from __future__ import annotations

import re
from functools import partial

import pytest
import torch
from torch import nn

from autotune import Workload, WorkloadError
from autotune.block_detection import BlockChoice, detect_blocks, find_blocks


def _raises(msg: str) -> pytest.RaisesContext[WorkloadError]:
    return pytest.raises(WorkloadError, match=f"^{re.escape(msg)}$")


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


class NanoGPTLayout(nn.Module):
    """nanoGPT's layout: the token and position embeddings in the ModuleDict beside the blocks."""

    def __init__(self) -> None:
        super().__init__()
        block = partial(nn.TransformerEncoderLayer, 16, 2, 32, batch_first=True)
        self.transformer = nn.ModuleDict(
            {
                "wte": nn.Embedding(4096, 16),
                "wpe": nn.Embedding(64, 16),
                "h": nn.ModuleList(block() for _ in range(3)),
                "ln_f": nn.LayerNorm(16),
            }
        )


def test_embeddings_are_never_blocks_even_holding_the_most_parameters() -> None:
    net = NanoGPTLayout()
    embeddings = sum(p.numel() for name in ("wte", "wpe") for p in net.transformer[name].parameters())
    blocks = sum(p.numel() for p in net.transformer["h"].parameters())
    assert (embeddings, blocks) == (66_560, 6_672)  # the embeddings hold 10x the blocks' parameters
    choice = detect_blocks(net)
    assert choice.describe() == (
        "blocks: transformer.h.0..transformer.h.2 (3 repeated TransformerEncoderLayer"
        "(MultiheadAttention, Linear, Dropout, Linear, LayerNorm, LayerNorm, ...))"
    )


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


def test_a_hybrid_s_one_layer_of_another_declared_class_among_its_repeated_ones_is_a_block() -> None:
    """Jamba at three layers: Mamba, attention, Mamba, both classes declared, the attention layer
    alone of its class; it sits in the layers' own list, so it is a block (an embeddings module
    declared elsewhere is not)."""
    mamba = type("MambaLayer", (Layer,), {})
    attention = type("AttentionLayer", (Layer,), {})

    class Hybrid(nn.Module):
        _no_split_modules = ("Embed", "MambaLayer", "AttentionLayer")

        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.embed.__class__ = type("Embed", (nn.Embedding,), {})
            self.layers = nn.ModuleList([mamba(), attention(), mamba()])

    choice = detect_blocks(Hybrid())
    assert choice.names == ("layers.0", "layers.1", "layers.2")
    assert choice.reason == "3 of 2 classes (MambaLayer x2, AttentionLayer x1), declared in _no_split_modules"
