from __future__ import annotations

import torch

from autotune import TrainConfig, Workload, load_workload
from autotune.train import Trainer
from tests.conftest import make_resmlp
from tests.paths import PADDED_WORKLOAD


def _grads_of_first_step(wl: Workload, config: TrainConfig) -> list[torch.Tensor]:
    trainer = Trainer(wl, config)
    captured: list[torch.Tensor] = []
    trainer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: captured.extend(
            p.grad.clone() for p in trainer.model.parameters() if p.grad is not None
        )
    )
    trainer.step()
    trainer.close()
    return captured


def test_accumulation_keeps_the_full_batch_gradient() -> None:
    wl = make_resmlp()
    full = _grads_of_first_step(wl, TrainConfig(micro_batch_size=32, grad_accum_steps=1, grad_clip=None))
    for micro, accum in [(16, 2), (8, 4), (4, 8)]:
        acc = _grads_of_first_step(wl, TrainConfig(micro_batch_size=micro, grad_accum_steps=accum, grad_clip=None))
        assert len(acc) == len(full) > 0
        for a, b in zip(acc, full, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_trainer_leaves_the_workload_model_untouched() -> None:
    wl = make_resmlp()
    before = {k: v.clone() for k, v in wl.model.state_dict().items()}
    trainer = Trainer(wl, TrainConfig(micro_batch_size=8, checkpoint=True, precision="bf16"))
    trainer.step()
    trainer.close()
    after = wl.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all("forward" not in m.__dict__ for m in wl.model.modules())


def test_linear_lr_scaling_reaches_the_optimizer() -> None:
    wl = make_resmlp()  # batch_size 32, AdamW at lr 1e-3
    trainer = Trainer(wl, TrainConfig(micro_batch_size=16, grad_accum_steps=4, lr_warmup_steps=2))
    first, second, third = trainer.step(), trainer.step(), trainer.step()
    trainer.close()
    assert (first.lr, second.lr, third.lr) == (1e-3, 2e-3, 2e-3)  # 1e-3 * 64/32, half of it in warmup step 1


def test_an_iterable_dataset_is_read_in_its_own_order_with_the_workload_s_collate() -> None:
    wl = load_workload(f"{PADDED_WORKLOAD}:build")
    trainer = Trainer(wl, TrainConfig(micro_batch_size=4, grad_accum_steps=2))
    sequences = list(iter(wl.dataset))
    # 64 sequences in micro-batches of 4: the 17th micro-batch begins the second pass.
    drawn = [trainer.next_batches() for _ in range(9)]
    trainer.close()
    expected = [wl.collate(sequences[i % 64 : i % 64 + 4]) for i in range(0, 72, 4)]
    for got, want in zip([b for step in drawn for b in step], expected, strict=True):
        assert torch.equal(got["input_ids"], want["input_ids"])


# ---- torch.compile (issue 42) -----------------------------------------------------------------------


def test_a_change_that_leaves_the_block_knobs_keeps_their_wrappers() -> None:
    # New wrapper functions are a new forward to Dynamo: a compiled model would recompile.
    wl = make_resmlp(depth=2, d=32, n=64)
    trainer = Trainer(wl, TrainConfig(micro_batch_size=8, checkpoint=(True, False)))
    block = trainer.model.get_submodule(trainer.block_names[0])
    wrapper = block.__dict__["forward"]
    trainer.reconfigure(TrainConfig(micro_batch_size=4, grad_accum_steps=2, checkpoint=(True, False)))
    assert block.__dict__["forward"] is wrapper
    trainer.reconfigure(TrainConfig(micro_batch_size=4, checkpoint=(False, True)))
    assert block.__dict__.get("forward") is None  # the knobs changed: rewrapped
    trainer.close()


def test_the_step_calls_the_model_or_its_compile_made_once_per_mode() -> None:
    wl = make_resmlp(depth=2, d=32, n=64)
    trainer = Trainer(wl, TrainConfig(micro_batch_size=8))
    assert trainer.forward_model is trainer.model
    trainer.reconfigure(TrainConfig(micro_batch_size=8, compile="default"))
    compiled = trainer.forward_model  # made, not yet compiled: Dynamo compiles at the first call
    assert isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert compiled._orig_mod is trainer.model and trainer.forward_model is compiled
    trainer.reconfigure(TrainConfig(micro_batch_size=8))
    assert trainer.forward_model is trainer.model
    trainer.reconfigure(TrainConfig(micro_batch_size=8, compile="default"))
    assert trainer.forward_model is compiled  # back to the mode: its compiled code is reused
    trainer.close()


def test_reconfigure_moves_blocks_between_the_three_recompute_levels_in_place() -> None:
    # The wrappers follow the level (selective and full blocks wrapped, plain ones not) and the
    # step's loss is the plain step's bit for bit at every level: recompute never changes the math.
    workload = make_resmlp(depth=4, n=64)
    trainer = Trainer(workload, TrainConfig(micro_batch_size=8))
    names = workload.block_names()
    losses = []
    for checkpoint in (False, ("selective", True, False, "selective"), "selective", False):
        trainer.reconfigure(TrainConfig(micro_batch_size=8, checkpoint=checkpoint))  # type: ignore[arg-type]
        wrapped = ["forward" in trainer.model.get_submodule(n).__dict__ for n in names]
        assert wrapped == [c != "none" for c in trainer.config.checkpoint_levels(4)]
        with torch.no_grad():
            batch = next(iter(workload.loader(8)))
        trainer.model.zero_grad()
        losses.append(workload.loss_fn(trainer.model, batch))
        losses[-1].backward()
    trainer.close()
    assert all(torch.equal(loss, losses[0]) for loss in losses)


def test_a_drawn_batch_encoding_goes_to_the_device() -> None:
    # Hugging Face collates return a BatchEncoding (a UserDict, no pytree node): a pytree map left
    # its tensors where the collate made them. The meta device stands in for a GPU.
    from types import SimpleNamespace

    from transformers import BatchEncoding

    from autotune.train.local import Trainer as LocalTrainer

    where = SimpleNamespace(device=torch.device("meta"))
    moved = LocalTrainer._to_device(where, BatchEncoding({"input_ids": torch.ones(2, 3, dtype=torch.long)}))  # type: ignore[arg-type]
    assert isinstance(moved, BatchEncoding) and moved["input_ids"].device.type == "meta"
