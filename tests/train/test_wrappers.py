from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

from autotune import TrainConfig, Workload
from autotune.config import Checkpoint, Precision, RecomputeLevel
from autotune.search.export import python_snippet
from autotune.train.wrappers import apply_block_knobs, apply_outer_precision, effective_block_knobs, outer_autocast
from tests.conftest import make_resmlp, trained_step


def _hooks(model: torch.nn.Module) -> list[int]:
    return [len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks) for m in model.modules()]


def test_apply_then_remove_restores_the_model_exactly() -> None:
    model = make_resmlp().model
    names = [f"blocks.{i}" for i in range(4)]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hooks = _hooks(model)
    x = torch.randn(2, 32, 16)
    reference = model(x)
    wrappers = apply_block_knobs(
        model, names, ["bf16", "fp16", "fp32", "fp32"], ["full", "none", "full", "none"], device_type="cpu"
    )
    assert sum("forward" in model.get_submodule(n).__dict__ for n in names) == 3  # fp32 + no ckpt: untouched
    wrapped = model(x)
    assert wrapped.dtype == torch.float32  # blocks hand fp32 back to the fp32 rest of the model
    assert not torch.equal(wrapped, reference)  # low precision really ran
    wrappers.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert _hooks(model) == hooks
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert torch.equal(model(x), reference)


@pytest.mark.parametrize("level", ["full", "selective"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_checkpointing_gives_identical_loss_and_gradients(level: RecomputeLevel, precision: Precision) -> None:
    # Bit for bit: the recompute runs the same kernels on the same inputs (a selective one takes
    # the kept matmul outputs as they were), in the block's autocast precision too.
    model = make_resmlp().model
    names = [f"blocks.{i}" for i in range(4)]
    x = torch.randn(4, 32, 16)
    plain_wrappers = apply_block_knobs(model, names, [precision] * 4, ["none"] * 4, device_type="cpu")
    expected = model(x).square().mean()
    expected.backward()
    plain_wrappers.remove()
    plain = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    wrappers = apply_block_knobs(model, names, [precision] * 4, [level] * 4, device_type="cpu")
    loss = model(x).square().mean()
    loss.backward()
    wrappers.remove()
    recomputed = [p.grad for p in model.parameters() if p.grad is not None]
    assert torch.equal(loss, expected)
    assert len(recomputed) == len(plain) == len(list(model.parameters()))  # every parameter got its gradient
    assert all(torch.equal(a, b) for a, b in zip(plain, recomputed, strict=True))


# ---- running state under recompute (issue 19) ---------------------------------------------------


class _RunningMean(nn.Module):
    """Running state of a user's own: an EMA of its activations that the output depends on (so
    the recompute must see the value the forward saw) and a step counter, both updated in forward."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.drop = nn.Dropout(0.2)
        self.register_buffer("ema", torch.zeros(d))
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.lin(x))
        out = self.drop(h * (1 + self.ema))
        if self.training:
            self.ema.mul_(0.9).add_(h.detach().mean(0), alpha=0.1)
            self.steps += 1
        return out


def _stateful_blocks(kind: str) -> nn.Sequential:
    torch.manual_seed(0)
    if kind == "bn1d":
        blocks = [nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.2)) for _ in range(3)]
    elif kind == "bn2d":
        blocks = [
            nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout2d(0.2))
            for _ in range(3)
        ]
    else:
        blocks = [_RunningMean(8) for _ in range(3)]
    return nn.Sequential(*blocks)


def _inputs(kind: str) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    shape = (6, 4, 5, 5) if kind == "bn2d" else (6, 8)
    return [torch.randn(shape, generator=generator) for _ in range(2)]


def _accumulate(model: nn.Module, micro_batches: list[torch.Tensor]) -> list[torch.Tensor]:
    """One accumulated step (no optimizer): the micro-batch losses, dropout drawn from seed 0."""
    torch.manual_seed(0)
    losses = []
    for x in micro_batches:
        loss = model(x).square().mean() / len(micro_batches)
        loss.backward()
        losses.append(loss.detach())
    return losses


def _same_state(a: nn.Module, b: nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    grads = [(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters(), strict=True)]
    return (
        sa.keys() == sb.keys()
        and all(torch.equal(sa[k], sb[k]) for k in sa)
        and all(g is not None and h is not None and torch.equal(g, h) for g, h in grads)
    )


@pytest.mark.parametrize("level", ["full", "selective"])
@pytest.mark.parametrize("kind", ["bn1d", "bn2d", "running-mean"])
@pytest.mark.parametrize("micro_batches", [1, 2])
def test_recompute_updates_running_state_once(kind: str, micro_batches: int, level: RecomputeLevel) -> None:
    plain, recomputed = _stateful_blocks(kind), _stateful_blocks(kind)
    xs = _inputs(kind)[:micro_batches]
    expected = _accumulate(plain, xs)
    names = ["0", "1", "2"]
    wrappers = apply_block_knobs(recomputed, names, ["fp32"] * 3, [level] * 3, device_type="cpu")
    losses = _accumulate(recomputed, xs)
    wrappers.remove()
    assert all(torch.equal(a, b) for a, b in zip(losses, expected, strict=True))
    assert _same_state(plain, recomputed)  # running means, counters, EMAs and gradients, bit for bit
    counters = [v for k, v in recomputed.state_dict().items() if k.endswith(("num_batches_tracked", "steps"))]
    assert [int(c) for c in counters] == [micro_batches] * 3  # once per forward, not twice


def _stateful_workload(kind: str) -> Workload:
    model = _stateful_blocks(kind)
    model.append(nn.Sequential(nn.Flatten(), nn.Linear(100 if kind == "bn2d" else 8, 3)))
    generator = torch.Generator().manual_seed(2)
    shape = (32, 4, 5, 5) if kind == "bn2d" else (32, 8)
    data = TensorDataset(torch.randn(shape, generator=generator), torch.randint(0, 3, (32,), generator=generator))

    def loss_fn(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(m(batch[0]), batch[1])

    return Workload(name=kind, model=model, dataset=data, loss_fn=loss_fn, blocks=["0", "1", "2"], batch_size=8)


@pytest.mark.parametrize("checkpoint", [True, "selective"])
@pytest.mark.parametrize(
    ("kind", "precision"), [("bn1d", "fp32"), ("bn2d", "fp32"), ("running-mean", "fp32"), ("bn2d", "bf16")]
)
def test_the_local_trainer_recomputes_running_state_exactly(kind: str, precision: str, checkpoint: Checkpoint) -> None:
    workload = _stateful_workload(kind)
    plain_loss, plain = trained_step(workload, precision=precision)
    loss, state = trained_step(workload, precision=precision, checkpoint=checkpoint)
    assert loss == plain_loss
    assert plain.keys() == state.keys() and all(torch.equal(plain[k], state[k]) for k in plain)
    counter = "0.steps" if kind == "running-mean" else "0.1.num_batches_tracked"
    assert int(state[counter]) == 2  # two micro-batches, one update each


@pytest.mark.parametrize("checkpoint", [True, "selective"])
def test_the_exported_apply_recomputes_batchnorm_exactly(checkpoint: Checkpoint) -> None:
    config = TrainConfig(micro_batch_size=6, checkpoint=checkpoint)
    code = python_snippet(config, block_names=("0", "1", "2"), workload="bn2d")
    namespace: dict[str, Any] = {}
    exec(compile(code, "snippet.py", "exec"), namespace)
    plain, recomputed = _stateful_blocks("bn2d"), _stateful_blocks("bn2d")
    expected = _accumulate(plain, _inputs("bn2d"))
    handle = namespace["apply"](recomputed)
    losses = _accumulate(recomputed, _inputs("bn2d"))
    handle.remove()
    assert all(torch.equal(a, b) for a, b in zip(losses, expected, strict=True))
    assert _same_state(plain, recomputed)


# ---- one module at two block positions (shared weights) -----------------------------------------


def _shared_model() -> nn.Sequential:
    """Four block positions, three modules: position 3 is position 0's module (ALBERT-style)."""
    torch.manual_seed(0)
    layers = [nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Tanh()) for _ in range(3)]
    return nn.Sequential(*layers, layers[0])


SHARED = ["0", "1", "2", "3"]


def test_effective_knobs_merge_the_positions_of_one_module() -> None:
    model = _shared_model()
    blocks = [model.get_submodule(n) for n in SHARED]
    assert blocks[3] is blocks[0]
    merged = effective_block_knobs(blocks, ["fp32", "bf16", "fp32", "fp16"], ["none", "none", "none", "full"])
    assert merged == (("fp16", "bf16", "fp32", "fp16"), ("full", "none", "none", "full"))
    first = effective_block_knobs(blocks, ["bf16", "fp32", "fp32", "fp16"], ["full", "none", "none", "none"])
    assert first == (("bf16", "fp32", "fp32", "bf16"), ("full", "none", "none", "full"))
    assert effective_block_knobs(blocks, ["fp32"] * 4, ["none"] * 4) == (("fp32",) * 4, ("none",) * 4)


def test_a_shared_module_is_wrapped_once_and_removed_exactly() -> None:
    model = _shared_model()
    dicts = [dict(m.__dict__) for m in model.modules()]
    hooks = _hooks(model)
    wrappers = apply_block_knobs(
        model, SHARED, ["bf16", "fp32", "fp32", "fp16"], ["none", "full", "none", "full"], device_type="cpu"
    )
    assert wrappers.modules == (model[0], model[1])
    model(torch.randn(4, 8)).sum().backward()
    wrappers.remove()
    assert [dict(m.__dict__) for m in model.modules()] == dicts
    assert _hooks(model) == hooks


def test_a_shared_module_recomputed_at_one_position_keeps_its_state_exact() -> None:
    plain, recomputed = _shared_model(), _shared_model()
    xs = [x[:, :8] for x in _inputs("bn1d")]
    expected = _accumulate(plain, xs)
    wrappers = apply_block_knobs(recomputed, SHARED, ["fp32"] * 4, ["none", "none", "none", "full"], device_type="cpu")
    losses = _accumulate(recomputed, xs)
    wrappers.remove()
    assert all(torch.equal(a, b) for a, b in zip(losses, expected, strict=True))
    assert _same_state(plain, recomputed)
    assert int(recomputed.state_dict()["0.1.num_batches_tracked"]) == 4  # two positions, two micro-batches


# ---- the outer precision (issue 40) ------------------------------------------------------------------


def _dtypes(model: nn.Module, names: list[str]) -> tuple[dict[str, torch.dtype], list[Any]]:
    """The output dtype of each named module's last forward, by forward hooks."""
    seen: dict[str, torch.dtype] = {}

    def hook(name: str) -> Any:
        return lambda module, args, output: seen.__setitem__(name, output.dtype)

    return seen, [model.get_submodule(n).register_forward_hook(hook(n)) for n in names]


def test_under_outer_bf16_the_head_runs_in_bf16_and_an_fp32_block_in_fp32() -> None:
    from autotune import load_workload
    from autotune.train import Trainer

    wl = load_workload("gpt-tiny")
    probes = ["lm_head", "blocks.0.mlp.fc", "blocks.1.mlp.fc", "blocks.1.ln1"]
    for outer, head in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        config = TrainConfig(micro_batch_size=2, precision=("fp32", "bf16", "fp32", "fp32", "fp32", "fp32"))
        trainer = Trainer(wl, dataclasses.replace(config, outer_precision=outer), device="cpu")
        seen, handles = _dtypes(trainer.model, probes)
        result = trainer.step()
        for h in handles:
            h.remove()
        trainer.close()
        assert math.isfinite(result.loss)
        assert seen == {
            "lm_head": head,  # the head's matmul: in the outer precision
            "blocks.0.mlp.fc": torch.float32,  # an fp32 block computes in fp32 under either
            "blocks.1.mlp.fc": torch.bfloat16,  # a bf16 block in bf16 under either
            "blocks.1.ln1": torch.float32,  # autocast's fp32 ops stay fp32 inside it
        }


def test_an_fp32_block_under_outer_bf16_takes_fp32_inputs_and_nothing_is_cast_back() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(8, 8)) for _ in range(3)))
    names = ["0", "1", "2"]
    seen: dict[str, torch.dtype] = {}
    handles = [
        model.get_submodule(f"{n}.0").register_forward_pre_hook(
            lambda module, args, n=n: seen.__setitem__(f"{n} in", args[0].dtype)
        )
        for n in names
    ]
    wrappers = apply_block_knobs(
        model, names, ["bf16", "fp32", "bf16"], ["none", "full", "none"], device_type="cpu", outer="bf16"
    )
    assert [("forward" in model.get_submodule(n).__dict__) for n in names] == [False, True, False]
    with outer_autocast("bf16", "cpu"):
        out = model(torch.randn(2, 8, requires_grad=True))
    out.float().sum().backward()
    assert out.dtype == torch.bfloat16  # the last block's output is not cast back
    assert seen == {"0 in": torch.float32, "1 in": torch.float32, "2 in": torch.float32}
    wrappers.remove()
    for h in handles:
        h.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())


def test_apply_then_remove_with_an_outer_precision_restores_the_model_exactly() -> None:
    model = make_resmlp().model
    names = [f"blocks.{i}" for i in range(4)]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    hooks = _hooks(model)
    x = torch.randn(2, 32, 16)
    reference = model(x)
    outer = apply_outer_precision(model, "bf16", device_type="cpu")
    blocks = apply_block_knobs(
        model,
        names,
        ["bf16", "fp32", "fp32", "bf16"],
        ["full", "none", "full", "none"],
        device_type="cpu",
        outer="bf16",
    )
    wrapped = model(x)  # no outer_autocast here: the model's own forward opens it
    assert wrapped.dtype == torch.bfloat16  # the head ran in bf16
    blocks.remove()
    outer.remove()
    assert all("forward" not in m.__dict__ for m in model.modules())
    assert _hooks(model) == hooks
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert torch.equal(model(x), reference)
    assert apply_outer_precision(model, "fp32", device_type="cpu").modules == ()  # fp32: nothing to install


def test_outer_bf16_over_bf16_blocks_trains_as_whole_model_autocast() -> None:
    """Every block bf16 under a bf16 outer precision is HF's ``bf16=True``: no wrapper installed,
    and the loss of one autocast region around the whole loss."""
    from autotune.train import Trainer

    wl = make_resmlp()
    batch = next(iter(torch.utils.data.DataLoader(wl.dataset, batch_size=8)))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        direct = wl.loss_fn(wl.model, batch).item()
    plain = wl.loss_fn(wl.model, batch).item()
    config = TrainConfig(micro_batch_size=8, precision="bf16", outer_precision="bf16")
    trainer = Trainer(wl, config, device="cpu")
    assert trainer._wrappers is not None and trainer._wrappers.modules == ()
    trainer.feed(batch)
    loss = trainer.step().loss
    trainer.close()
    assert loss == pytest.approx(direct, rel=1e-6) and loss != pytest.approx(plain, rel=1e-6)


def _hf_with_cache(arch: str) -> tuple[nn.Module, Any]:
    """A tiny Hugging Face model as ``from_pretrained`` builds one: ``use_cache=True`` (its config's
    default), in training; and its loss on a batch."""
    transformers = pytest.importorskip("transformers")
    if arch == "llama":
        config = transformers.LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4
        )
        model = transformers.LlamaForCausalLM(config)
    elif arch == "gpt2":  # its model passes the cache to its blocks positionally
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4))
    elif arch == "falcon":  # as ``layer_past``
        config = transformers.FalconConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4)
        model = transformers.FalconForCausalLM(config)
    else:
        config = transformers.T5Config(
            vocab_size=64, d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4, decoder_start_token_id=0
        )
        model = transformers.T5ForConditionalGeneration(config)
    assert model.config.use_cache
    tokens = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    labels = tokens[:, :6].contiguous() if arch == "t5" else tokens

    def loss() -> torch.Tensor:
        torch.manual_seed(0)  # the same dropout masks in every run
        return model(input_ids=tokens, labels=labels).loss

    return model.train(), loss


@pytest.mark.parametrize("arch", ["llama", "gpt2", "falcon", "t5"])
def test_recomputed_hf_blocks_write_no_cache_and_train_exactly(arch: str) -> None:
    # Before the blocks dropped their cache under recompute, every one of these raised in backward
    # under selective recompute (the recompute appended to the cache again: more slice operations
    # than the forward saved), and Falcon and T5 under a full recompute too.
    from autotune.block_detection import find_blocks

    model, loss = _hf_with_cache(arch)
    names = list(find_blocks(model))
    loss().backward()
    expected = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    for level in ("full", "selective"):
        model.zero_grad(set_to_none=True)
        wrappers = apply_block_knobs(model, names, ["fp32"] * len(names), [level] * len(names), device_type="cpu")
        loss().backward()
        wrappers.remove()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert len(grads) == len(expected)
        # Bit for bit on an Intel Xeon; on an AMD EPYC (AVX-512) GPT-2's and T5's recomputed
        # forward sums in another order in the last bits (gradients up to 7e-8 apart).
        torch.testing.assert_close(grads, expected, rtol=1e-5, atol=1e-6, msg=lambda m, level=level: f"{level}: {m}")


class _CacheReader(nn.Module):
    """A block that declares it only reads its cache, as transformers' layers may."""

    _can_checkpoint_with_cache = True

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.seen: list[tuple[Any, Any]] = []

    def forward(self, x: torch.Tensor, past_key_values: Any = None, use_cache: bool = False) -> torch.Tensor:
        self.seen.append((past_key_values, use_cache))
        return self.linear(x)


def test_a_recomputed_block_keeps_a_cache_it_only_reads_and_drops_use_cache() -> None:
    model = nn.Sequential(_CacheReader(), _CacheReader())
    cache = object()
    wrappers = apply_block_knobs(model, ["0", "1"], ["fp32", "fp32"], ["full", "none"], device_type="cpu")
    x = torch.randn(2, 4, requires_grad=True)
    model[1](model[0](x, cache, use_cache=True), past_key_values=cache, use_cache=True).sum().backward()
    wrappers.remove()
    assert model[0].seen == [(cache, False), (cache, False)]  # the forward and its recompute
    assert model[1].seen == [(cache, True)]  # not recomputed: its call as it was


# ---- models held in 16 bits, and adapters over them ------------------------------------------------


def _held_bf16_chain() -> tuple[nn.Sequential, list[str]]:
    """Three Linear + ReLU blocks and a head, loaded in bf16 (``torch_dtype=torch.bfloat16``)."""
    torch.manual_seed(0)
    blocks = [nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(3)]
    return nn.Sequential(*blocks, nn.Linear(8, 2)).to(torch.bfloat16), ["0", "1", "2"]


@pytest.mark.parametrize("outer", ["fp32", "bf16"])
def test_a_model_held_in_bf16_trains_under_any_block_precision_as_it_does_without(outer: Precision) -> None:
    # Before, a bf16 block cast its output back to fp32 and the next block's bf16 weights refused
    # it ("expected m1 and m2 to have the same dtype"), and an fp32 block under a bf16 outer
    # precision cast its inputs to fp32 with the same result: no precision knob ran on such a model.
    model, names = _held_bf16_chain()
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    model(x).float().square().sum().backward()
    expected = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    seen: list[torch.dtype] = []
    hook = model[3].register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    wrappers = apply_block_knobs(
        model, names, ["bf16", "fp32", "bf16"], ["none", "full", "selective"], device_type="cpu", outer=outer
    )
    with outer_autocast(outer, "cpu"):
        out = model(x)
    out.float().square().sum().backward()
    wrappers.remove()
    hook.remove()
    assert seen == [torch.bfloat16]  # the head got what its weights are held in
    assert all(torch.equal(p.grad, e) for p, e in zip(model.parameters(), expected, strict=True))


def test_own_dtype_is_what_most_parameter_elements_are_held_in() -> None:
    from autotune.train.wrappers import own_dtype

    lora = nn.ModuleDict({"base": nn.Linear(16, 16).to(torch.bfloat16), "a": nn.Linear(16, 2), "b": nn.Linear(2, 16)})
    assert own_dtype(lora) == torch.bfloat16  # 272 bf16 elements against 82 fp32
    assert own_dtype(nn.Linear(4, 4)) == torch.float32
    assert own_dtype(nn.GELU()) == torch.float32  # no parameters: fp32
    assert own_dtype(nn.Linear(4, 4).to(torch.float16)) == torch.float16


def test_peft_lora_on_a_bf16_base_trains_under_bf16_blocks_and_fp32_exceptions() -> None:
    # LoRA as PEFT builds it on a model loaded in bf16: the base frozen in bf16, the adapters in
    # fp32 (autocast_adapter_dtype), bf16 activations between the layers. Before, every
    # configuration with a reduced block raised on it (measure, a study's screen, tune, Adaptive).
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    from autotune.block_detection import find_blocks
    from autotune.train import Trainer

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4
    )
    base = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    with warnings.catch_warnings():  # PEFT asks for transformers' deprecated is_gradient_checkpointing
        warnings.simplefilter("ignore", FutureWarning)
        model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    assert {(p.dtype, p.requires_grad) for p in model.parameters()} == {
        (torch.bfloat16, False),
        (torch.float32, True),
    }
    tokens = torch.randint(0, 64, (8, 12), generator=torch.Generator().manual_seed(0))
    workload = Workload(
        name="peft-lora",
        model=model,
        dataset=[{"input_ids": t, "labels": t} for t in tokens],
        loss_fn=lambda m, b: m(**b).loss,
        batch_size=8,
    )
    names = list(find_blocks(model))
    assert len(names) == 3
    for knobs in (
        {"precision": ("bf16", "fp32", "bf16"), "checkpoint": (False, True, "selective")},
        {"precision": ("fp32", "bf16", "fp32"), "outer_precision": "bf16", "checkpoint": (True, False, False)},
    ):
        trainer = Trainer(workload, TrainConfig(micro_batch_size=4, grad_accum_steps=2, **knobs))
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        loss = trainer.step().loss
        moved = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
        trainer.close()
        assert math.isfinite(loss), knobs
        assert moved == {n for n, p in model.named_parameters() if p.requires_grad}, knobs  # the adapters only
