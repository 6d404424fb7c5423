"""Random architectures with learnable generated data, for tuners and policies to train on.

``random_workload(seed)`` draws an architecture (block type, depth, width, sequence length, ...)
from ``seed``, builds it and labels random inputs with a random *teacher* function, so that many
distinct but learnable workloads exist without any data on disk. The same seed always gives the
same architecture, initial weights and data.

Every architecture has the same skeleton: a linear embedding of each of the ``seq_len`` input
vectors, ``depth`` residual blocks of one type on the ``(B, seq_len, width)`` stream, mean
pooling over the sequence, LayerNorm and a linear classifier. Block types:

=========== ===========================================================================
mlp         per-position ``x + W2 GELU(W1 LN(x))`` with a 2x hidden width
attention   a pre-LN transformer block (bidirectional attention + 4x GELU MLP)
conv        ``x + Conv1d(GELU(Conv1d(LN(x))))`` over the sequence, kernel 3
=========== ===========================================================================

Draws are rejected until the model has 0.05M-3M parameters and a training step at the drawn
batch size costs at most about ``MAX_STEP_FLOPS`` (a few tenths of a second on 2 CPU cores).

Versions: ``random:SEED`` (``version=1``) is the chain above, unchanged since the simulator's
shipped profiles (``envs/profiles/random-10.json`` ..) and the transfer check's held-out seeds
(``random:3``, ``random:7``) were measured on it. ``random2:SEED`` (``version=2``) draws the same
fields and then the structures users write beyond a chain: a module shared by two block
positions, a tied head, UNet- or DenseNet-like skips, BatchNorm and running state of its own,
dropout, dict batches with a mask, two outputs (see :mod:`autotune.zoo.random_structure`;
``RandomArchSpec.features`` says which were drawn).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, TypedDict, get_args

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from autotune.errors import WorkloadError
from autotune.workload import Workload
from autotune.zoo.data import TensorDict, classification_loss, seeded_init
from autotune.zoo.gpt import Block as TransformerBlock
from autotune.zoo.mlp import ResidualMLPBlock
from autotune.zoo.random_structure import Structure, StructuredNet, draw_structure, structured_loss

if TYPE_CHECKING:
    from typing import Unpack  # Python 3.11+; only needed for the annotation

__all__ = [
    "BlockType",
    "RandomArchSpec",
    "RandomOverrides",
    "RandomNet",
    "ConvBlock",
    "build_model",
    "count_parameters",
    "sample_spec",
    "teacher_data",
    "random_workload",
    "MAX_SEED",
    "MIN_PARAMS",
    "MAX_PARAMS",
    "MAX_STEP_FLOPS",
    "MAX_TRIES",
]

BlockType = Literal["mlp", "attention", "conv"]

#: torch.Generator.manual_seed takes at most 64 bits; 2**63 keeps the bound easy to state.
MAX_SEED = 2**63
MIN_PARAMS = 50_000
MAX_PARAMS = 3_000_000
#: Budget of one forward+backward pass (see ``RandomArchSpec.step_flops``): small enough that a
#: generated model's fp32 step stays in the tens of milliseconds on a 2-core CPU, so the tests and
#: the policy's training episodes run many of them.
MAX_STEP_FLOPS = 6e9
NUM_SAMPLES = 2048
#: Draws before giving up; unconstrained seeds need 1-11 (2 on average) over seeds 0-299.
MAX_TRIES = 200
TEACHER_FEATURES = 16

_WIDTHS = (32, 64, 96, 128, 192, 256, 384, 512)
_SEQ_LENS = (8, 16, 32, 64)
_IN_FEATURES = (8, 16, 32)
_BATCH_SIZES = (16, 32, 64, 128)


class RandomOverrides(TypedDict, total=False):
    """Fields of :class:`RandomArchSpec` that ``random_workload`` lets a caller fix."""

    block_type: BlockType
    depth: int
    width: int
    seq_len: int
    in_features: int
    num_classes: int
    batch_size: int


@dataclass(frozen=True, kw_only=True)
class RandomArchSpec:
    """One random architecture and its data shape."""

    block_type: BlockType
    depth: int
    width: int
    seq_len: int
    in_features: int
    num_classes: int
    batch_size: int
    #: Version 2's structure beyond the chain; None for version 1.
    structure: Structure | None = None

    def __post_init__(self) -> None:
        if self.block_type not in get_args(BlockType):
            raise WorkloadError(
                f"RandomArchSpec.block_type must be one of {list(get_args(BlockType))}, but got {self.block_type!r}."
            )
        for name, low in (
            ("depth", 1),
            ("width", 1),
            ("seq_len", 1),
            ("in_features", 1),
            ("num_classes", 2),
            ("batch_size", 1),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise WorkloadError(f"RandomArchSpec.{name} must be an int >= {low}, but got {value!r}.")
        if self.structure is not None:
            self.structure.check_depth(self.depth)

    @property
    def version(self) -> int:
        return 1 if self.structure is None else 2

    @property
    def features(self) -> frozenset[str]:
        """The structural features drawn (empty for version 1); see :data:`random_structure.FEATURES`."""
        return frozenset() if self.structure is None else self.structure.features

    @property
    def num_heads(self) -> int:
        """Heads of dimension 32 where the width allows it, else a single head."""
        return self.width // 32 if self.width % 32 == 0 else 1

    def step_flops(self, num_params: int) -> float:
        """Approximate FLOPs of one forward+backward pass at ``batch_size``: 6 per parameter per
        position (Kaplan et al. 2020), plus the attention score and value products."""
        flops = 6.0 * num_params * self.batch_size * self.seq_len
        if self.block_type == "attention":
            flops += 12.0 * self.depth * self.batch_size * self.seq_len**2 * self.width
        return flops


class ConvBlock(nn.Module):
    """``x + Conv1d(GELU(Conv1d(LayerNorm(x))))`` on a ``(B, L, C)`` stream, length-preserving."""

    def __init__(self, *, width: int, kernel_size: int = 3) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.conv1 = nn.Conv1d(width, width, kernel_size, padding=kernel_size // 2)
        self.conv2 = nn.Conv1d(width, width, kernel_size, padding=kernel_size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x).transpose(1, 2)  # Conv1d wants channels before length
        h = self.conv2(F.gelu(self.conv1(h)))
        out: torch.Tensor = x + h.transpose(1, 2)
        return out


class RandomNet(nn.Module):
    """Inputs ``(B, seq_len, in_features)`` -> logits ``(B, num_classes)``."""

    def __init__(self, spec: RandomArchSpec) -> None:
        super().__init__()
        self.embed = nn.Linear(spec.in_features, spec.width)
        self.blocks = nn.ModuleList(_make_block(spec) for _ in range(spec.depth))
        self.norm = nn.LayerNorm(spec.width)
        self.head = nn.Linear(spec.width, spec.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        logits: torch.Tensor = self.head(self.norm(h.mean(dim=1)))
        return logits


def _make_block(spec: RandomArchSpec) -> nn.Module:
    if spec.block_type == "mlp":
        return ResidualMLPBlock(width=spec.width, hidden=2 * spec.width)
    if spec.block_type == "attention":
        return TransformerBlock(d_model=spec.width, n_head=spec.num_heads, causal=False)
    return ConvBlock(width=spec.width)


def build_model(spec: RandomArchSpec) -> nn.Module:
    """The model of ``spec``: a :class:`RandomNet`, or version 2's :class:`StructuredNet`."""
    if spec.structure is None:
        return RandomNet(spec)
    return StructuredNet(
        spec.structure,
        make_block=lambda: _make_block(spec),
        depth=spec.depth,
        width=spec.width,
        in_features=spec.in_features,
        num_classes=spec.num_classes,
    )


def count_parameters(spec: RandomArchSpec) -> int:
    """Exact parameter count (a shared module's once), from a model built on the meta device."""
    with torch.device("meta"):
        return sum(p.numel() for p in build_model(spec).parameters())


def sample_spec(seed: int, overrides: RandomOverrides | None = None, *, version: int = 1) -> RandomArchSpec:
    """Draw specs from ``seed`` until one fits the parameter and step-cost bounds.

    ``overrides`` replace the drawn fields before the bounds are checked, so the draws adapt the
    free fields to them (e.g. a fixed large width gets a small depth). ``version`` 2 also draws a
    structure, from a stream of its own: version 1's draws stay as they were.

    Raises:
        WorkloadError: if ``version`` is not 1 or 2, an override is unknown or no draw fits within
            ``MAX_TRIES`` tries.
    """
    if version not in (1, 2):
        raise WorkloadError(f"random_workload: version must be 1 or 2, but got {version!r}.")
    fixed: RandomOverrides = overrides or {}
    unknown = sorted(set(fixed) - set(RandomOverrides.__annotations__))
    if unknown:
        raise WorkloadError(
            f"random_workload: unknown override(s) {unknown}; "
            f"expected some of {sorted(RandomOverrides.__annotations__)}."
        )
    rng = random.Random(seed)  # stdlib Mersenne Twister: identical draws on every platform
    structure_rng = random.Random(f"random2:{seed}")  # str seeds hash with SHA-512: portable too
    for _ in range(MAX_TRIES):
        drawn = RandomArchSpec(
            block_type=rng.choice(get_args(BlockType)),
            depth=rng.randint(2, 8),
            width=rng.choice(_WIDTHS),
            seq_len=rng.choice(_SEQ_LENS),
            in_features=rng.choice(_IN_FEATURES),
            num_classes=rng.randint(2, 10),
            batch_size=rng.choice(_BATCH_SIZES),
        )
        spec = replace(drawn, **fixed)
        if version == 2:
            spec = replace(spec, structure=draw_structure(structure_rng, spec.depth))
        num_params = count_parameters(spec)
        if MIN_PARAMS <= num_params <= MAX_PARAMS and spec.step_flops(num_params) <= MAX_STEP_FLOPS:
            return spec
    raise WorkloadError(
        f"random_workload: no architecture with {MIN_PARAMS}-{MAX_PARAMS} parameters and at most "
        f"{MAX_STEP_FLOPS:.0e} FLOPs per step fits the overrides {fixed}."
    )


def teacher_data(
    spec: RandomArchSpec, generator: torch.Generator, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``NUM_SAMPLES`` random input sequences labelled by a random teacher function.

    Each sequence is a per-sample latent vector plus per-position noise, so sequences differ in
    kind, not just in noise. The teacher is ``argmax(mean_t tanh(x_t A) B)`` with random ``A``
    and ``B``: a smooth, permutation-invariant function that every block type can represent
    (all end in mean pooling). Each logit is standardized over the data set before the argmax so
    that the classes are roughly balanced. With a ``(NUM_SAMPLES, seq_len)`` 0/1 ``mask`` the mean
    runs over the unmasked positions only, as the model's pooling does.
    """
    shape = (NUM_SAMPLES, spec.seq_len, spec.in_features)
    latent = torch.randn(NUM_SAMPLES, 1, spec.in_features, generator=generator)
    inputs = latent + 0.5 * torch.randn(shape, generator=generator)
    a = torch.randn(spec.in_features, TEACHER_FEATURES, generator=generator) / spec.in_features**0.5
    b = torch.randn(TEACHER_FEATURES, spec.num_classes, generator=generator)
    features = torch.tanh(inputs @ a)
    if mask is None:
        pooled = features.mean(dim=1)
    else:
        pooled = (features * mask.unsqueeze(-1)).sum(dim=1) / mask.sum(dim=1, keepdim=True)
    logits = pooled @ b
    logits = (logits - logits.mean(dim=0)) / logits.std(dim=0)
    return inputs, logits.argmax(dim=1)


def random_workload(seed: int, *, version: int = 1, **overrides: Unpack[RandomOverrides]) -> Workload:
    """The random workload of ``seed`` (see the module docstring), named ``random-SEED`` (version
    1) or ``random2-SEED`` (version 2).

    With ``overrides`` the fixed fields are appended to the name, e.g. ``random-3(depth=4)``, so
    that two different workloads never share a name.
    """
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < MAX_SEED:
        raise WorkloadError(f"random_workload: seed must be an int in [0, 2**63), but got {seed!r}.")
    spec = sample_spec(seed, overrides, version=version)
    generator = torch.Generator().manual_seed(seed)
    # Derive the init seed from the data stream so that weights and data are not drawn from the
    # same random numbers.
    init_seed = int(torch.randint(2**62, (1,), generator=generator))
    with seeded_init(init_seed):
        model = build_model(spec)
    name = f"random{'' if version == 1 else version}-{seed}"
    if overrides:
        name += "(" + ",".join(f"{k}={v}" for k, v in sorted(overrides.items())) + ")"
    if spec.structure is None:
        inputs, labels = teacher_data(spec, generator)
        dataset: Dataset[Any] = TensorDataset(inputs, labels)
    else:
        dataset = _structured_data(spec, spec.structure, generator)
    return Workload(
        name=name,
        model=model,
        dataset=dataset,
        loss_fn=classification_loss if spec.structure is None else structured_loss,
        # Explicit: auto-detection needs two or more blocks, and depth may be overridden to 1;
        # a shared module is listed once by named_modules but runs at two of these positions.
        blocks=[f"blocks.{i}" for i in range(spec.depth)],
        batch_size=spec.batch_size,
    )


def _structured_data(spec: RandomArchSpec, structure: Structure, generator: torch.Generator) -> Dataset[Any]:
    """Version 2's data: as version 1's, or dict batches whose sequences keep a random length of at
    least half the positions (the teacher pools over those only)."""
    if not structure.dict_batch:
        return TensorDataset(*teacher_data(spec, generator))
    lengths = torch.randint((spec.seq_len + 1) // 2, spec.seq_len + 1, (NUM_SAMPLES, 1), generator=generator)
    mask = (torch.arange(spec.seq_len) < lengths).float()
    inputs, labels = teacher_data(spec, generator, mask)
    return TensorDict(x=inputs, mask=mask, labels=labels)
