"""Calibrating the simulator: a real, measured profile of one workload, saved as plain JSON.

``calibrate(workload)`` measures on the real training loop of this machine:
- exact model-state bytes and the activation/temporary peaks of the default configuration
  (MemTracker, via ``measure``);
- per-block bytes saved for backward, fp32 and reduced precision, at two micro-batch sizes (so
  the part that grows with the batch is separated from the fixed part: autocast weight copies),
  and each block's input bytes (what a checkpointed block keeps);
- per-block forward time (forward hooks; exact on CPU, where kernels run synchronously) and whole
  step times under seven configurations, interleaved, from which the fixed and per-sample costs,
  the reduced-precision speed of each and the recompute cost are solved (``calibrate``);
- loss and gradient-noise-scale curves of a real run of the default configuration;
- whether the model runs in reduced precision here at all (``reduced_failure``: oneDNN has no
  bf16 LSTM primitive on an AVX2 CPU, and the step raises; a model loaded in bf16 has no
  precision to change): a model that does not gets an fp32-only
  profile, and the simulator refuses its reduced-precision settings as the real environment does;
- the peak memory of every knob setting the environment can reach (``peak_table``), predicted by
  the memory model (:func:`autotune.predict_memory`, exact fake-tensor profile plus the runner's
  rules): a few hundred predictions from one profile, about a second. Profiles of synthetic
  models (domain randomization) have no table and fall back on the block-sum model of
  ``costmodel.py``;
- the selective recompute level (``TrainConfig.checkpoint`` ``"selective"``) from the memory
  model's selective runs: each block's bytes kept selectively per sample
  (``BlockCost.selective_per_sample``) and the peak of every setting with selective blocks
  (``selective_peak_table``); its time is modelled, not timed (``costmodel.py``). Profiles
  written before the level have neither and read the same;
- the outer precision (``TrainConfig.outer_precision``: embeddings, final norm, head and loss in
  ``reduced`` too) from the memory model's ``fp32@bf16`` and ``bf16@bf16`` modes (the blocks
  in fp32 or ``reduced`` under a ``reduced`` outer autocast): the peak of every setting with the
  outer parts reduced (``outer_peak_table``, ``outer_selective_peak_table``); its time is
  modelled from the blocks' measured reduced speed (``costmodel.py``). A profile without them
  (written before the knob) keeps the outer parts fp32; a synthetic one (no table at all) models
  them from its blocks' bytes (``costmodel.py``'s block-sum model).

``autotune profile WORKLOAD`` runs it and writes the JSON the simulator loads (no pickle).
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from autotune.envs.memory_tables import memory_table, peak_table_index, selective_table_index, with_memory_tables
from autotune.envs.workload_profile import (
    INFEASIBLE_PEAK,
    PROFILE_VERSION,
    BlockCost,
    WorkloadProfile,
    load_profile,
    save_profile,
)

from autotune.batches import map_tensors
from autotune.config import Precision, TrainConfig
from autotune.errors import ConfigError, NonFiniteLossError, TrainingError, one_line
from autotune.measurement.oom import is_out_of_memory
from autotune.measurement.record import Measurement
from autotune.memory.blocks import profile_blocks
from autotune.memory.profile_record import MemoryProfile
from autotune.procs.measure import measure
from autotune.train import Trainer
from autotune.train.local import resolve_device
from autotune.workload import Workload
from autotune.worst_case import at_worst_case, profile_batch

__all__ = [
    "INFEASIBLE_PEAK",
    "BlockCost",
    "WorkloadProfile",
    "calibrate",
    "load_profile",
    "interleaved_step_seconds",
    "memory_table",
    "peak_table_index",
    "relative_nnls",
    "selective_table_index",
    "with_memory_tables",
    "save_profile",
]

Progress = Callable[[str], None]


def calibrate(
    workload: Workload,
    *,
    reduced: Precision = "bf16",
    curve_steps: int = 60,
    timing_rounds: int = 8,
    progress: Progress | None = None,
    selective: bool = True,
    outer: bool = True,
    reuse: MemoryProfile | None = None,
    micro_batch: int | None = None,
    one_at_a_time: bool = False,
) -> WorkloadProfile:
    """Measure ``workload`` on this machine (tens of seconds for the built-in workloads).

    Args:
        workload: The workload to measure.
        reduced: The reduced precision to measure beside fp32.
        curve_steps: Optimizer steps of the loss and gradient-noise curve.
        timing_rounds: Interleaved steps per timed configuration (their median is used); fewer is
            faster and noisier (gpt-tiny, 1 thread: 8 rounds took 21 s of a 45 s calibration).
        progress: Called with a line as each phase starts (None: silent).
        selective: Whether the memory table holds the selective recompute level; ``False`` leaves
            it out (two fake runs per mode and 800 predictions fewer): for a profile only the
            shipped policy acts on, which never moves the level.
        outer: Whether the memory table holds the reduced outer precision; ``False`` leaves it out
            (the reduced outer modes' fake runs and their predictions), and the profile then keeps
            the outer parts fp32.
        reuse: A memory profile of ``workload`` made before (a study's): the memory tables'
            fake runs it holds are not made again.
        micro_batch: The largest micro-batch a real step runs at, a divisor of the workload's
            batch (None: the whole batch). At real size the whole batch in one fp32 micro-batch
            (the default) does not fit on the device: the default's memory is then measured at
            this micro-batch and the step times taken at it and below it (the linear time and
            activation terms are per sample and per micro-batch, so the simulator still reaches
            every split); the loss curve accumulates to the whole batch.
        one_at_a_time: Time the seven configurations one after the other (one copy of the model
            alive) instead of side by side (seven copies at once), where those do not fit.

    Returns:
        The workload's profile on this machine.

    Raises:
        ConfigError: ``micro_batch`` does not divide the workload's batch.

    Example:
        >>> from autotune import load_workload
        >>> from autotune.envs import SimulatedEnv, calibrate
        >>> profile = calibrate(load_workload("mlp-digits"))  # tens of seconds: the model timed on this machine
        >>> SimulatedEnv(profiles=[profile]).profiles[0].workload
        'mlp-digits'
    """
    say = progress or (lambda _: None)
    b0 = workload.batch_size
    # m: the micro-batch of the real steps (the whole batch unless it does not fit where they run).
    m = b0 if micro_batch is None else micro_batch
    if not isinstance(m, int) or m < 1 or b0 % m:
        raise ConfigError(f"micro_batch must be a divisor of the batch ({b0}), but got {micro_batch!r}.")
    b_small = max(1, m // 4)
    say("memory of the default configuration" + ("" if m == b0 else f" at micro-batch {m}"))
    default = _default_measured(workload, m)
    assert default.memory is not None and default.category_peaks is not None
    say("per-block activation bytes")
    blocks, failure = _block_bytes(workload, reduced, b_small, m)
    if failure is not None:
        say(f"no {reduced} here ({failure}): an fp32-only profile")
    block_acts = sum(b.fp32_fixed + m * b.fp32_per_sample for b in blocks)
    say("per-block forward time")
    shares, block_fraction = _block_forward_shares(workload, m)
    tiny_accum = min(4, b_small)  # several micro-batches of one sample: their cost dominates the step
    configs = _timed_configs(reduced, m, b_small, tiny_accum, failure=failure)
    say(f"step times under {_WORDS[len(configs)]} configurations" + (", one at a time" if one_at_a_time else ""))
    times = interleaved_step_seconds(workload, configs, rounds=timing_rounds, side_by_side=not one_at_a_time)
    _check_finite(workload, "step time", {f"the {key!r} configuration": v for key, v in times.items()})
    step_fixed, micro_fixed, per_sample = _linear_time_terms(times, m, b_small, tiny_accum)
    slowdown, fixed_slowdown, recompute = _block_time_ratios(
        times,
        TimeTerms(micro_fixed=micro_fixed, per_sample=per_sample, micro=m, tiny_accum=tiny_accum),
        block_fraction,
        failure=failure,
    )
    say("loss and gradient-noise curves")
    samples, losses, noise = _curves(workload, m, curve_steps, accum=b0 // m)
    _check_finite(workload, "loss", {f"step {i} of the loss curve": v for i, v in enumerate(losses)})
    timed = WorkloadProfile(
        version=PROFILE_VERSION,
        workload=workload.source or workload.name,
        machine=_machine_name(),
        reduced=reduced,
        num_parameters=workload.num_parameters,
        batch_size=b0,
        parameters_bytes=default.memory.parameters,
        gradients_bytes=default.category_peaks.gradients,
        optimizer_state_bytes=default.category_peaks.optimizer_state,
        other_activation_per_sample=max(default.category_peaks.activations - block_acts, 0.0) / m,
        temporaries_per_sample=default.category_peaks.temporaries / m,
        blocks=tuple(dataclasses.replace(b, time_share=s) for b, s in zip(blocks, shares, strict=True)),
        step_fixed_seconds=step_fixed,
        micro_fixed_seconds=micro_fixed,
        micro_seconds_per_sample=per_sample,
        blocks_fraction=block_fraction,
        reduced_slowdown=slowdown,
        reduced_fixed_slowdown=fixed_slowdown,
        recompute_fraction=max(recompute, 0.0),
        curve_samples=samples,
        curve_loss=losses,
        curve_b_noise=noise,
        default_peak_bytes=default.memory.total,
        default_micro_batch=None if m == b0 else m,
        reduced_failure=failure,
    )
    return with_memory_tables(timed, workload, selective=selective, outer=outer, progress=progress, reuse=reuse)


def _default_measured(workload: Workload, micro: int) -> Measurement:
    """The default configuration (at ``micro`` samples in one micro-batch) measured once on the
    data's worst-case rows (its memory is the profile's: the peak a budget must hold, which the
    memory tables predict; a drawn batch of padded sequences is shorter, and measured 17% under
    the prediction on TRL's prompt-completion data).

    Raises:
        NonFiniteLossError: its loss is NaN or infinite.
        TrainingError: it failed (out of memory: no budget was given, so nothing else).
    """
    default = measure(at_worst_case(workload, micro), TrainConfig(micro_batch_size=micro), steps=1, warmup=1)
    if default.status == "diverged":
        raise NonFiniteLossError(f"{workload.name}: the default configuration's {default.reason}: nothing to calibrate")
    if not default.ok:  # out of memory: no budget was given, so nothing else
        raise TrainingError(f"{workload.name}: the default configuration failed: {default.reason}")
    return default


_WORDS = {5: "five", 6: "six", 7: "seven"}


def _timed_configs(
    reduced: Precision, micro: int, b_small: int, tiny_accum: int, *, failure: str | None
) -> dict[str, TrainConfig]:
    """:func:`calibrate`'s timed configurations: four fp32 splits (the linear time terms), the
    reduced precision at the largest micro-batch and at micro-batches of one (its speed on the
    per-sample and on the per-micro-batch part), and the recompute. Five where ``reduced`` cannot
    run; six where the micro-batch is one (the two reduced ones would be the same)."""
    configs = {
        "small": TrainConfig(micro_batch_size=b_small),
        "default": TrainConfig(micro_batch_size=micro),
        "reduced": TrainConfig(micro_batch_size=micro, precision=reduced),
        "checkpoint": TrainConfig(micro_batch_size=micro, checkpoint=True),
        "accum": TrainConfig(micro_batch_size=b_small, grad_accum_steps=2),
        "tiny": TrainConfig(micro_batch_size=1, grad_accum_steps=tiny_accum),
        "reduced_tiny": TrainConfig(micro_batch_size=1, grad_accum_steps=tiny_accum, precision=reduced),
    }
    if failure is not None:
        del configs["reduced"], configs["reduced_tiny"]
    elif micro == 1:
        del configs["reduced_tiny"]
    return configs


def _linear_time_terms(
    times: dict[str, float], micro: int, b_small: int, tiny_accum: int
) -> tuple[float, float, float]:
    """The step's fixed seconds, each micro-batch's fixed seconds and its seconds per sample, from
    :func:`_step_times`'s fp32 configurations."""
    # Solve the linear time terms t = t_fixed + k * (t_mf + b * t_ps) from the four fp32 step
    # times (one more micro-batch of b_small, ``accum``, separates the per-step fixed cost) by
    # non-negative least squares on relative errors. The micro-batch-of-one point is measured, not
    # extrapolated: from b_small and micro alone, noise set the per-micro-batch cost to 0 on a 4-block
    # GPT-2 (2 timing rounds), the simulator then read micro-batch 1 as free and the policy's plan
    # went to 1 x 32, measured far slower.
    fp32 = [(b_small, 1, "small"), (micro, 1, "default"), (b_small, 2, "accum"), (1, tiny_accum, "tiny")]
    rows = np.array([[1.0, k, k * b] for b, k, _ in fp32])
    step_fixed, micro_fixed, per_sample = (
        float(v) for v in relative_nnls(rows, np.array([times[key] for _, _, key in fp32]))
    )
    return step_fixed, micro_fixed, per_sample


@dataclass(frozen=True, kw_only=True)
class TimeTerms:
    """The fp32 linear time terms :func:`_block_time_ratios` reads the other configurations by,
    and the splits they were timed at."""

    micro_fixed: float  # seconds per micro-batch, independent of its size
    per_sample: float  # seconds per sample of a micro-batch
    micro: int  # the default's micro-batch (the "reduced" configuration's)
    tiny_accum: int  # micro-batches of one sample in the "tiny" configurations


#: Where a reduced precision's factor is taken to lie: no kernel is 20x faster in 16 bits, and a
#: factor past 100 (noise on a near-zero term) would make every reduced setting look infeasible.
SLOWDOWN_RANGE = (0.05, 100.0)


def _block_time_ratios(
    times: dict[str, float], terms: TimeTerms, block_fraction: float, *, failure: str | None
) -> tuple[float, float | None, float]:
    """The reduced precision's factor on the blocks' per-sample time and on their per-micro-batch
    fixed time (None: one factor for both, where they cannot be told apart), and the recompute's
    cost relative to the blocks' time (``block_fraction``: their share of a micro-batch's time).

    Precision and recompute change only block time. One factor on the whole micro-batch time (as
    before the fixed part had its own) fails on a GPU: the per-micro-batch part (kernel launches,
    Python, autocast's casts) barely changes in 16 bits while the per-sample part (the matmuls on
    tensor cores) runs several times faster. On an H200, GPT-2 small's bf16 step was 0.78x fp32's
    at 8 x 256 tokens and 0.25x at 32 x 1024; one factor, calibrated at the large micro-batch, read
    micro-batches of one as 4x faster in bf16 than they are, and the policy's proposal went to 1 x 32
    (measured at half the samples/s per GiB of 16 x 2). The two reduced configurations solve both:
    per micro-batch of b samples the difference to fp32 is ``phi * ((x_f - 1) t_mf + (x_ps - 1) b
    t_ps)``, at b = the default's micro-batch and at b = 1."""
    phi = max(block_fraction, 1e-9)
    micro_default = max(terms.micro_fixed + terms.micro * terms.per_sample, 1e-9)
    recompute = (times["checkpoint"] - times["default"]) / (phi * micro_default)
    if failure is not None:  # unused: every reduced setting is infeasible
        return 1.0, None, recompute
    lo, hi = SLOWDOWN_RANGE
    delta_m = times["reduced"] - times["default"]  # the step's fixed part cancels in each difference
    one = min(max(1.0 + delta_m / (phi * micro_default), lo), hi)
    fixed, per_sample = phi * terms.micro_fixed, phi * terms.per_sample
    if "reduced_tiny" not in times or terms.micro < 2 or fixed <= 1e-12 or per_sample <= 1e-12:
        return one, None, recompute
    delta_1 = (times["reduced_tiny"] - times["tiny"]) / terms.tiny_accum  # one micro-batch of one sample
    u_plus_v, u_plus_mv = delta_1, delta_m  # u = (x_f - 1) phi t_mf, v = (x_ps - 1) phi t_ps
    v = (u_plus_mv - u_plus_v) / (terms.micro - 1)
    x_ps = min(max(1.0 + v / per_sample, lo), hi)
    x_f = min(max(1.0 + (u_plus_v - v) / fixed, lo), hi)
    return x_ps, x_f, recompute


def _block_bytes(workload: Workload, reduced: Precision, b1: int, b2: int) -> tuple[list[BlockCost], str | None]:
    """Each block's bytes, and why the model does not run in ``reduced`` here (None: it does;
    otherwise the reduced bytes are fp32's): its parameters are 16-bit already
    (:attr:`Workload.held_in_16_bits`), or a reduced forward raises (not out of memory: that is the
    machine's size, not a missing kernel); the fp32 forward raising is the user's."""
    fp32 = _linear_fit(workload, "fp32", b1, b2)
    failure, low = workload.held_note, fp32  # a model held in 16 bits: no precision knob to time
    if failure is None:
        try:
            low = _linear_fit(workload, reduced, b1, b2)
        except Exception as e:
            if is_out_of_memory(e):
                raise
            failure = one_line(e)
    inputs = _block_input_bytes(workload, b2)
    blocks = [
        BlockCost(
            name=name,
            fp32_fixed=fp32[i][0],
            fp32_per_sample=fp32[i][1],
            reduced_fixed=low[i][0],
            reduced_per_sample=low[i][1],
            input_per_sample=inputs[i] / b2,
            time_share=0.0,
        )
        for i, name in enumerate(workload.block_names())
    ]
    return blocks, failure


def _linear_fit(workload: Workload, precision: Precision, b1: int, b2: int) -> list[tuple[float, float]]:
    """Per block (fixed bytes, bytes per sample) from saved bytes at micro-batches b1 < b2."""
    y1 = profile_blocks(workload, micro_batch_size=b1, precision=precision).saved_bytes
    y2 = profile_blocks(workload, micro_batch_size=b2, precision=precision).saved_bytes
    if b2 <= b1:
        return [(0.0, y / b2) for y in y2]
    slopes = [(b - a) / (b2 - b1) for a, b in zip(y1, y2, strict=True)]
    return [(max(a - s * b1, 0.0), s) for a, s in zip(y1, slopes, strict=True)]


def _on_device(workload: Workload, micro: int) -> tuple[torch.nn.Module, Any, torch.device]:
    """A copy of the model and a micro-batch of ``micro`` samples where the calibration's steps run
    (:func:`~autotune.train.local.resolve_device`: the GPU when there is one). Its forwards there
    measure the device the simulator stands for: on the host they timed the CPU's kernels for a
    GPU run, and at real size cost the host tens of seconds and gigabytes per forward."""
    device = resolve_device(None)
    batch = map_tensors(lambda t: t.to(device), profile_batch(workload, micro))
    return workload.model_copy(device), batch, device


def _sync(device: torch.device) -> None:
    """Wait for the device's queued kernels, so that a host clock reads their time (CUDA runs them
    asynchronously; the CPU and the meta device do not)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _block_input_bytes(workload: Workload, micro: int) -> list[int]:
    model, batch, _ = _on_device(workload, micro)
    names = workload.block_names()
    sizes = [0] * len(names)

    def hook(i: int) -> Any:
        def pre(module: torch.nn.Module, args: Any) -> None:
            sizes[i] = sum(a.untyped_storage().nbytes() for a in args if isinstance(a, torch.Tensor))

        return pre

    handles = [model.get_submodule(n).register_forward_pre_hook(hook(i)) for i, n in enumerate(names)]
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):  # a compiled model: its eager blocks
        workload.loss_fn(model, batch)
    for h in handles:
        h.remove()
    return sizes


def _block_forward_shares(workload: Workload, micro: int, repeats: int = 3) -> tuple[list[float], float]:
    """Each block's share of all blocks' forward time, and all blocks' share of the whole forward,
    on the calibration's device (each clock reading after the device's queued work)."""
    model, batch, device = _on_device(workload, micro)
    names = workload.block_names()
    spent = [0.0] * len(names)
    starts = [0.0] * len(names)

    def hooks(i: int) -> tuple[Any, Any]:
        def pre(module: torch.nn.Module, args: Any) -> None:
            _sync(device)
            starts[i] = time.perf_counter()

        def post(module: torch.nn.Module, args: Any, out: Any) -> None:
            _sync(device)
            spent[i] += time.perf_counter() - starts[i]

        return pre, post

    handles = []
    for i, n in enumerate(names):
        pre, post = hooks(i)
        handles += [
            model.get_submodule(n).register_forward_pre_hook(pre),
            model.get_submodule(n).register_forward_hook(post),
        ]
    total = 0.0
    # A compiled model runs eagerly here: per-block clocks are what is asked for, and Dynamo
    # tracing these hooks (a host clock, a list index per block) broke its graph at every block
    # and recompiled until its limit, with a warning each time.
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        workload.loss_fn(model, batch)  # warm-up
        spent[:] = [0.0] * len(names)
        for _ in range(repeats):
            _sync(device)
            t0 = time.perf_counter()
            workload.loss_fn(model, batch)
            _sync(device)
            total += time.perf_counter() - t0
    for h in handles:
        h.remove()
    blocks_total = sum(spent) or 1.0
    return [s / blocks_total for s in spent], min(sum(spent) / max(total, 1e-12), 1.0)


def relative_nnls(rows: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Non-negative ``theta`` minimizing sum(((rows @ theta) / seconds - 1) ** 2): the time terms
    that fit measured step times (``rows @ theta``: each row's predicted seconds) in relative
    error, so a short step weighs as much as a long one. Every active set of the (few) columns
    is tried: 2**n - 1 least-squares solves."""
    x = rows / seconds[:, None]
    y = np.ones(len(seconds))
    n = rows.shape[1]
    best: tuple[float, np.ndarray] | None = None
    for active in itertools.chain.from_iterable(itertools.combinations(range(n), r) for r in range(1, n + 1)):
        cols = list(active)
        solution, *_ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if np.any(solution < 0):
            continue
        theta = np.zeros(n)
        theta[cols] = solution
        residual = float(np.sum((x @ theta - y) ** 2))
        if best is None or residual < best[0]:
            best = (residual, theta)
    assert best is not None, "a single column with positive entries always has a non-negative solution"
    return best[1]


def interleaved_step_seconds(
    workload: Workload, configs: dict[str, TrainConfig], rounds: int = 8, *, side_by_side: bool = True
) -> dict[str, float]:
    """Median step time of each config, steps interleaved round-robin so that drift in a shared
    machine's speed hits every config alike (the differences between them are what we solve for).

    That holds one copy of the model and its optimizer state per config at once.
    ``side_by_side=False`` times one config after the other instead (one copy alive), where they do
    not fit together (a 1B-parameter model's fp32 AdamW state is 16 GB per copy)."""
    if not side_by_side:
        return {key: _alone(workload, cfg, rounds) for key, cfg in configs.items()}
    trainers = {key: Trainer(workload, cfg, track_noise=False) for key, cfg in configs.items()}
    try:
        for t in trainers.values():
            t.step()  # warm-up: kernel selection, optimizer state
        times: dict[str, list[float]] = {key: [] for key in trainers}
        for _ in range(rounds):
            for key, t in trainers.items():
                times[key].append(t.step().seconds)
        return {key: statistics.median(v) for key, v in times.items()}
    finally:
        for t in trainers.values():
            t.close()


def _alone(workload: Workload, config: TrainConfig, rounds: int) -> float:
    """Median step time of ``config`` timed alone, after a warm-up step."""
    trainer = Trainer(workload, config, track_noise=False)
    try:
        trainer.step()  # warm-up: kernel selection, optimizer state
        return statistics.median(trainer.step().seconds for _ in range(rounds))
    finally:
        trainer.close()


def _curves(
    workload: Workload, micro: int, steps: int, *, accum: int = 1
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[float, ...]]:
    trainer = Trainer(workload, TrainConfig(micro_batch_size=micro, grad_accum_steps=accum), gns_decay=0.9)
    samples, losses, noise = [], [], []
    seen = 0
    try:
        for _ in range(steps):
            r = trainer.step(split=trainer.noise_split)
            seen += r.samples
            b = trainer.gns.estimate().b_simple
            samples.append(float(seen))
            losses.append(r.loss)
            noise.append(float(b) if b is not None and b > 0 else float("nan"))
    finally:
        trainer.close()
    valid = [x for x in noise if x == x]
    fill = valid[0] if valid else float(micro)
    noise = [x if x == x else fill for x in noise]
    return tuple(samples), tuple(losses), tuple(noise)


def _check_finite(workload: Workload, what: str, values: dict[str, float]) -> None:
    """A simulator calibrated on a NaN or infinite loss or time would hand a policy NaN observations."""
    bad = next(((key, v) for key, v in values.items() if not np.isfinite(v)), None)
    if bad is None:
        return
    message = f"{workload.name}: the {what} is {bad[1]} at {bad[0]}: nothing to calibrate"
    if what == "loss":
        raise NonFiniteLossError(message)
    raise TrainingError(message)


def _machine_name() -> str:
    import platform

    threads = torch.get_num_threads()
    return f"{platform.machine()} {platform.processor() or 'cpu'} x{threads} threads, torch {torch.__version__}"
