"""What the machine makes of a model: reduced precision's speed and recompute's cost, measured.

The two numbers a policy needs to know the machine rather than assume it (bf16 is 10-50x
*slower* than fp32 on an AVX2 CPU without bf16 units, 2-3x faster on an AMX CPU or an Ampere
GPU; recomputing every block costs about one more forward pass, more on memory-bound models).
One definition serves the real environment at reset, the simulator's descriptor and a policy on
the user's own run: whole optimizer steps of the same loop, every block in reduced precision
(resp. recomputed) against plain fp32, best of ``steps`` each.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from autotune.config import REDUCED_PRECISIONS, Precision, TrainConfig
from autotune.errors import one_line
from autotune.measurement.oom import is_out_of_memory

if TYPE_CHECKING:
    from autotune.workload import Workload

__all__ = [
    "MachineSpeeds",
    "PrecisionSpeeds",
    "ProbeLoop",
    "probe_precisions",
    "probe_speeds",
    "probe_workload",
    "reduced_precisions",
]


class _Timed(Protocol):
    @property
    def seconds(self) -> float: ...


class ProbeLoop(Protocol):
    """A training loop whose configuration changes in place: the local Trainer, a RankSession."""

    def reconfigure(self, config: TrainConfig) -> object: ...

    def step(self) -> _Timed: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class MachineSpeeds:
    """``reduced_speed``: plain step time / all-reduced step time (> 1: reduced is faster; 0: the
    model cannot run in reduced precision here, ``reduced_failure`` says why).
    ``recompute_cost``: all-recomputed step time / plain step time - 1."""

    reduced_speed: float
    recompute_cost: float
    reduced_failure: str | None = None


def probe_speeds(
    loop: ProbeLoop,
    base: TrainConfig,
    *,
    reduced: Precision = "bf16",
    steps: int = 2,
    recover: Callable[[], None] | None = None,
    probe_reduced: bool = True,
) -> MachineSpeeds:
    """Time ``steps`` optimizer steps of ``loop`` under ``base`` with every block in fp32, then in
    ``reduced``, then recomputed; leave the loop on ``base``. Costs 3 x ``steps`` training steps
    (with DeepSpeed ranks, engine rebuilds too: all blocks bf16 is a bf16 engine).

    A reduced-precision step that raises (oneDNN has no bf16 LSTM primitive on AVX2 CPUs) reads as
    speed 0 when ``recover`` can clean up after it (drop its partial gradients); without
    ``recover``, and for an out-of-memory error or a failing fp32 step, the error propagates.
    ``probe_reduced=False``: reduced precision is already known not to run (speed 0, no step)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, but got {steps}.")
    plain = dataclasses.replace(base, precision="fp32", checkpoint=False)
    probes = {"plain": plain, "recompute": dataclasses.replace(plain, checkpoint=True)}
    if probe_reduced:
        probes["reduced"] = dataclasses.replace(plain, precision=reduced)
    seconds, failures = _time_probes(loop, probes, steps=steps, fallible={"reduced"}, recover=recover)
    loop.reconfigure(base)
    recompute = seconds["recompute"] / seconds["plain"] - 1.0
    return MachineSpeeds(
        reduced_speed=seconds["plain"] / seconds.get("reduced", math.inf),
        recompute_cost=recompute,
        reduced_failure=failures.get("reduced"),
    )


def probe_workload(workload: Workload, start: TrainConfig) -> MachineSpeeds:
    """The machine probes (:func:`probe_speeds`) on a copy of the user's model with a fresh
    optimizer of the user's class, in one local process: the user's objects are not touched.

    One micro-batch (at most 8 samples) per step keeps the copy's activations small; it holds a
    second set of parameters, gradients and optimizer state for these six steps. On ranks too the
    probes time one rank's compute, not its collectives.

    Args:
        workload: The user's workload (its model on the device the run trains on).
        start: The run's starting configuration; the probes run at its micro-batch (at most 8).

    Returns:
        The speeds; a model that cannot run in bf16 here (oneDNN has no bf16 LSTM on AVX2 CPUs),
        or whose parameters are 16-bit already (:attr:`Workload.held_in_16_bits`: no step), reads
        as speed 0 (``reduced_failure`` says why), so bf16 is never proposed.
    """
    import torch

    from autotune.train.local import Trainer

    device = next((p.device for p in workload.model.parameters()), torch.device("cpu"))
    # One local process even for a run on ranks: the probes time a rank's compute, not its collectives.
    probe = dataclasses.replace(
        start,
        micro_batch_size=min(start.micro_batch_size, 8),
        grad_accum_steps=1,
        precision="fp32",
        checkpoint=False,
        ranks=1,
        zero_stage=0,
    )
    held = workload.held_note  # loaded in 16 bits: no reduced precision to time
    trainer = Trainer(workload, probe, device=device, track_noise=False)
    try:
        speeds = probe_speeds(
            trainer, probe, recover=lambda: trainer.optimizer.zero_grad(set_to_none=True), probe_reduced=held is None
        )
    finally:
        trainer.close()
    return speeds if held is None else dataclasses.replace(speeds, reduced_failure=held)


def _time_probes(
    loop: ProbeLoop,
    probes: dict[str, TrainConfig],
    *,
    steps: int,
    fallible: set[str],
    recover: Callable[[], None] | None,
) -> tuple[dict[str, float], dict[str, str]]:
    """Best-of-``steps`` seconds of each probe, and why each ``fallible`` one that raised failed
    (only with ``recover``, and never for an out-of-memory error: those propagate)."""
    seconds: dict[str, float] = {}
    failures: dict[str, str] = {}
    for key, config in probes.items():
        loop.reconfigure(config)
        try:
            seconds[key] = min(loop.step().seconds for _ in range(steps))
        except Exception as e:
            if key not in fallible or recover is None or is_out_of_memory(e):
                raise
            recover()
            failures[key] = one_line(e)
    return seconds, failures


def reduced_precisions(device_type: str) -> tuple[Precision, ...]:
    """The reduced precisions worth probing on ``device_type``.

    On CUDA both: fp16 runs on the same tensor cores as bf16 (and is the only one before Ampere),
    with a loss scaler (:class:`torch.amp.GradScaler`, which the local trainer turns on for any
    fp16 block). On the CPU only bf16: DeepSpeed refuses fp16 there and without fp16 units (AVX2)
    autocast fp16 is emulated, ~50x slower than fp32.
    """
    return REDUCED_PRECISIONS if device_type == "cuda" else ("bf16",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrecisionSpeeds:
    """Whole-step speed of each precision against fp32: plain fp32 step time / that precision's
    (fp32 itself is 1.0; > 1: faster; 0: it cannot run here, ``failures`` says why)."""

    speeds: dict[str, float]
    failures: dict[str, str]


def probe_precisions(
    loop: ProbeLoop,
    base: TrainConfig,
    *,
    precisions: tuple[Precision, ...],
    steps: int = 2,
    recover: Callable[[], None] | None = None,
) -> PrecisionSpeeds:
    """Time ``steps`` optimizer steps of ``loop`` with every block in fp32, then in each of
    ``precisions`` (nothing recomputed), as :func:`probe_speeds` does for one; leave the loop on
    ``base``. A precision that raises reads as speed 0 under the same rule (``recover`` given,
    not out of memory)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, but got {steps}.")
    plain = dataclasses.replace(base, precision="fp32", checkpoint=False)
    probes = {"fp32": plain} | {p: dataclasses.replace(plain, precision=p) for p in precisions if p != "fp32"}
    seconds, failures = _time_probes(loop, probes, steps=steps, fallible=set(probes) - {"fp32"}, recover=recover)
    loop.reconfigure(base)
    speeds = {p: seconds["fp32"] / seconds.get(p, math.inf) for p in probes}
    return PrecisionSpeeds(speeds=speeds, failures=failures)
