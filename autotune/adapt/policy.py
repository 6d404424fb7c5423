"""A trained policy (the shipped pretrained PPO one, or a user's policy file) as a decision source.

The policy sees the observation vector of the tuning environments (:class:`autotune.envs.core.TuningEnv`'s
table: gradient noise, memory pressure, loss trend, throughput, knob levels, model and machine
descriptors) built from what the user's run measured, and answers with a ``MultiDiscrete`` action.
Its batch moves keep the user's effective batch: "more accumulation" and "smaller micro-batch"
both halve the micro-batch and double the accumulation (and the reverse), never changing their
product. Precision and checkpointing move by quarters of the blocks, hungriest first. The ZeRO
action is ignored here (one process).
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from autotune.adapt.sources import DecisionSource, Observation, Proposal, RunContext
from autotune.errors import MissingDependencyError
from autotune.knobs import Knobs
from autotune.measurement.trend import loss_slope
from autotune.train.wrappers import apply_block_knobs

if TYPE_CHECKING:
    import numpy as np

    from autotune.workload import Workload

__all__ = ["PolicySource"]

_LEVELS = 4  # precision / checkpoint levels: quarters of the blocks (FRACTION_LEVELS - 1)


def _load(directory: Path | None) -> Any:
    try:
        from autotune.policies.ppo import PRETRAINED_DIR, load_policy
    except ImportError as e:
        raise MissingDependencyError(
            f"a policy decision source needs stable-baselines3 and gymnasium: pip install 'autotune[rl]' ({e})."
        ) from None
    return load_policy(directory or PRETRAINED_DIR)


class PolicySource(DecisionSource):
    """Decisions from a policy file (default: the shipped pretrained policy).

    ``horizon``: decisions after which the observation's "fraction of the training budget used"
    reads 1 (the policy was trained on 16-step episodes).
    """

    name = "policy"
    needs_noise = True

    def __init__(self, directory: str | Path | None = None, *, horizon: int = 16) -> None:
        self.policy = _load(None if directory is None else Path(directory))
        self.horizon = horizon
        self._context: RunContext | None = None
        self._descriptor: tuple[float, ...] = ()
        self._decisions = 0
        self._first: Observation | None = None
        self._reduced_ok = True

    def start(self, context: RunContext) -> None:
        from autotune.memory.blocks import profile_blocks

        self._context = context
        profile = profile_blocks(context.workload, micro_batch_size=2)
        saved = sorted(profile.saved_bytes, reverse=True)
        quarter = max(1, round(len(saved) / 4))
        speed = _reduced_speed(context.workload, context.start.micro_batch_size, context.device_type)
        self._reduced_ok = speed > 0
        model = context.workload.model
        states = sum(p.numel() * p.element_size() for p in model.parameters()) * 4  # params, grads, Adam's two moments
        self._descriptor = (
            math.log10(max(sum(p.numel() for p in model.parameters()), 1)) / 5 - 1.0,
            math.log10(max(sum(profile.saved_bytes) / profile.micro_batch_size, 1.0)) / 5 - 1.0,
            math.log2(max(len(profile.names), 1)) / 3 - 1.0,
            2.0 * sum(saved[:quarter]) / max(sum(saved), 1) - 1.0,
            math.log2(max(speed, 1e-6)) / 5,
            math.log2(max(context.budget_bytes / states, 1e-6)) / 4,
            0.0,  # log2(ranks) / 3 with one rank
        )

    def observation(self, obs: Observation) -> np.ndarray:
        """The environments' observation vector (see ``TuningEnv``'s table) for ``obs``."""
        import numpy as np

        assert self._context is not None and self._first is not None, "start() and a first observation"
        c, n, first = obs.config, len(self._context.ranking), self._first
        batch = c.effective_batch_size
        b_noise = 0.0 if obs.b_noise is None or obs.b_noise <= 0 else math.log2(obs.b_noise / batch) / 5
        loss = obs.losses[-1] if obs.losses else 0.0
        loss0 = first.losses[-1] if first.losses and first.losses[-1] != 0 else 1.0
        low = sum(p != "fp32" for p in c.block_precisions(n))
        ckpt = sum(c.block_checkpoints(n))
        values = [
            b_noise,
            obs.peak_bytes / self._context.budget_bytes - 1.0,
            10.0 * (loss_slope(list(obs.losses[-4:])) or 0.0) / max(abs(loss), 1e-9),
            loss / loss0 - 1.0,
            math.log2(max(obs.throughput, 1e-12) / max(first.throughput, 1e-12)) / 4,
            2.0 * min(self._decisions, self.horizon) / self.horizon - 1.0,
            2.0 * min(math.log2(c.grad_accum_steps), 4) / 4 - 1.0,  # ACCUM_LEVELS 1..16
            2.0 * min(math.log2(c.micro_batch_size), 7) / 7 - 1.0,  # MICRO_LEVELS 1..128
            2.0 * round(low / n * _LEVELS) / _LEVELS - 1.0,
            2.0 * round(ckpt / n * _LEVELS) / _LEVELS - 1.0,
            -1.0,  # ZeRO stage 0
            *self._descriptor,
        ]
        return np.clip(np.asarray(values, dtype=np.float32), -1.0, 1.0)

    def propose(self, observation: Observation) -> Proposal | None:
        assert self._context is not None, "start() first"
        if self._first is None:
            self._first = observation
        action = [int(a) for a in self.policy.act(self.observation(observation))]
        self._decisions += 1
        config = self._apply(observation, action)
        if config == observation.config:
            return None
        return Proposal(config=config, reason=f"policy action {tuple(action)}")

    def _apply(self, obs: Observation, action: list[int]) -> Any:
        assert self._context is not None
        c, ranking = obs.config, self._context.ranking
        n = len(ranking)
        a_acc, a_micro, a_prec, a_ckpt = (a - 1 for a in action[:4])  # -1 down, 0 keep, +1 up
        batch, micro = c.effective_batch_size, c.micro_batch_size
        grow = a_micro - a_acc  # a larger micro-batch, or less accumulation: same direction
        if grow > 0 and micro * 2 <= batch and batch % (micro * 2) == 0:
            micro *= 2
        elif grow < 0 and micro % 2 == 0:
            micro //= 2
        low = round(sum(p != "fp32" for p in c.block_precisions(n)) / n * _LEVELS)
        ckpt = round(sum(c.block_checkpoints(n)) / n * _LEVELS)
        low = min(max(low + a_prec, 0), _LEVELS if self._reduced_ok else 0)
        ckpt = min(max(ckpt + a_ckpt, 0), _LEVELS)
        knobs = Knobs(
            batch_size=batch,
            micro_batch_size=micro,
            low_precision_blocks=round(low / _LEVELS * n),
            checkpoint_blocks=round(ckpt / _LEVELS * n),
        )
        return knobs.to_config(ranking, base=c)


def _reduced_speed(workload: Workload, micro_batch_size: int, device_type: str) -> float:
    """fp32 forward+backward time over all-bf16's, on a copy of the model (the user's is not
    touched): the environments' ``reduced_speed``, measured, as it reverses between CPUs. 0 when
    the model cannot run in bf16 here (oneDNN has no bf16 LSTM on AVX2 CPUs)."""
    from torch.utils._pytree import tree_map_only
    from torch.utils.data import DataLoader

    model = copy.deepcopy(workload.model).train()
    names = workload.block_names()
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    batch = next(iter(DataLoader(workload.dataset, batch_size=min(micro_batch_size, 8))))
    batch = tree_map_only(torch.Tensor, lambda t: t.to(device), batch)
    seconds: dict[str, float] = {}
    for precision in ("bf16", "fp32"):
        wrappers = apply_block_knobs(model, names, [precision] * len(names), [False] * len(names),
                                     device_type=device_type)  # fmt: skip
        try:
            times = []
            for _ in range(2):
                t0 = time.perf_counter()
                workload.loss_fn(model, batch).backward()
                times.append(time.perf_counter() - t0)
            seconds[precision] = min(times)
        except RuntimeError:
            # oneDNN refuses bf16 kernels it lacks ("could not create a primitive descriptor"):
            # a knob this machine cannot take, so never proposed.
            seconds[precision] = math.inf
        finally:
            wrappers.remove()
            model.zero_grad(set_to_none=True)
    return seconds["fp32"] / seconds["bf16"]
