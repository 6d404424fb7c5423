"""Timing that holds when re-measured: warm-up until steps settle, medians with their spread, and
configurations re-timed side by side.

On a shared 2-core machine one stint of steps can time 10-20% off the next (and, with another
process spinning OpenMP threads, a step 10x slower), more than the differences worth deciding
on; a configuration's first steps also pay one-time costs (oneDNN compiles kernels per new
shape and dtype on the CPU; cuDNN autotuning and allocator growth on a GPU). So:

* :func:`warm_up` runs untimed steps until two successive step times agree within
  :data:`SETTLED` (at least ``minimum``, at most ``cap``);
* :class:`Timing` is a median with its spread (the median absolute deviation);
* :func:`retime` times several configurations in one process, round by round, each round every
  configuration's steps in turn (the order rotating), so all see the same machine; it adds
  rounds (bounded) while the leader is not ahead of the runner-up round by round
  (:func:`separated_by_rounds`: a paired test, since the machine's drift over tens of seconds
  moves every configuration alike, and two medians with their own spreads count it as noise);
  :func:`separated`, the unpaired rule, decides where steps are not in rounds (the adaptive
  run's side-by-side trials);
* what *other* processes used of the cores while timing
  (:class:`autotune.measurement.busy.CoreLoad`) goes with the result, so the output can say
  when the machine was too busy to be sure (:func:`busy_note`).

The study's finalists, ``tune``'s best steps and an adaptive run's trials all go through this
module: one implementation of "re-time these configurations side by side".
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.measurement.busy import CoreLoad

if TYPE_CHECKING:
    from autotune.config import TrainConfig
    from autotune.workload import Workload

__all__ = [
    "SETTLED",
    "Retimed",
    "Timing",
    "busy_note",
    "paired_ratio",
    "retime",
    "retime_configs",
    "round_values",
    "separated",
    "separated_by_rounds",
    "settled",
    "verdict_words",
    "warm_up",
]

#: Two successive step times within 10% of each other: the configuration's one-time costs are paid.
SETTLED = 0.10


@dataclass(frozen=True, kw_only=True)
class Timing:
    """Samples/s of a configuration's timed steps: the median and its spread.

    ``mad``: the median absolute deviation from the median (robust to the one step another
    process stalled). ``relative_spread``: ``mad / median``.
    """

    rates: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    @property
    def mad(self) -> float:
        if len(self.rates) < 2:
            return 0.0
        m = self.median
        return statistics.median(abs(r - m) for r in self.rates)

    @property
    def relative_spread(self) -> float:
        return self.mad / self.median if self.median > 0 else 0.0


def separated(a: Timing, b: Timing, *, scale_a: float = 1.0, scale_b: float = 1.0, margin: float = 0.0) -> bool:
    """Whether ``a`` measures better than ``b`` beyond the noise: its median value (samples/s
    times ``scale_a``, e.g. 1 / GiB of its peak) is more than ``margin`` above ``b``'s, and the
    gap is larger than their spreads together (each a median absolute deviation, in value)."""
    va, vb = a.median * scale_a, b.median * scale_b
    return va > (1.0 + margin) * vb and va - vb > a.mad * scale_a + b.mad * scale_b


#: One-sided 95% quantiles of Student's t for 1-30 degrees of freedom (beyond: the normal's
#: 1.645). Side-by-side rounds are few (3-6 where t's tails are far from the normal's).
_T95 = (
    6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812,
    1.796, 1.782, 1.771, 1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725,
    1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697,
)  # fmt: skip


def round_values(t: Timing, rounds: int) -> tuple[float, ...]:
    """Each round's median of ``t``'s rates: ``rounds`` rounds of equally many steps, in order.

    Raises:
        ValueError: the rates are not ``rounds`` rounds of equally many steps.
    """
    n = len(t.rates)
    if rounds < 1 or n == 0 or n % rounds != 0:
        raise ValueError(f"round_values: {rounds} rounds of equally many steps, but got {n} rates.")
    per = n // rounds
    return tuple(statistics.median(t.rates[k * per : (k + 1) * per]) for k in range(rounds))


def _log_ratios(a: Timing, b: Timing, rounds: int, scale_a: float, scale_b: float) -> list[float] | None:
    """Round k's log(a's value / b's value) for every round; None where a value is not positive."""
    va, vb = round_values(a, rounds), round_values(b, rounds)
    if min(va) * scale_a <= 0 or min(vb) * scale_b <= 0:
        return None
    return [math.log(x * scale_a / (y * scale_b)) for x, y in zip(va, vb, strict=True)]


def paired_ratio(a: Timing, b: Timing, *, rounds: int, scale_a: float = 1.0, scale_b: float = 1.0) -> float:
    """``a``'s value over ``b``'s round by round (both timed in the same ``rounds`` rounds, as
    :func:`retime` times them): the geometric mean of the rounds' ratios, which the machine's
    drift moves less than a ratio of two medians. 0.0 where a value is not positive."""
    ratios = _log_ratios(a, b, rounds, scale_a, scale_b)
    return math.exp(statistics.fmean(ratios)) if ratios is not None else 0.0


def separated_by_rounds(
    a: Timing, b: Timing, *, rounds: int, scale_a: float = 1.0, scale_b: float = 1.0, margin: float = 0.0
) -> bool:
    """Whether ``a`` measures better than ``b`` round by round: ``a.rates`` and ``b.rates`` are
    ``rounds`` rounds of equally many steps, timed side by side (round k of one beside round k
    of the other, as :func:`retime` times them).

    Each round's value is the median of its steps (times the scale); the log-ratios of ``a``'s
    to ``b``'s, one per round, must average above ``log(1 + margin)`` by more than a one-sided
    95% Student's t bound (a paired t-test; Student 1908). Pairing by round cancels what the
    machine did to both at once (a shared machine's speed drifts over tens of seconds, alike
    for every configuration), which unpaired spreads (:func:`separated`) count as noise twice;
    the results page's "Side-by-side verdicts" measures both rules on real rounds. Fewer than
    two rounds have no spread to pair: :func:`separated` decides.

    Raises:
        ValueError: the rates are not ``rounds`` rounds of equally many steps.
    """
    if rounds < 2:
        return separated(a, b, scale_a=scale_a, scale_b=scale_b, margin=margin)
    if len(a.rates) != len(b.rates):
        raise ValueError(
            f"separated_by_rounds: both timings must hold {rounds} rounds of equally many steps, "
            f"but got {len(a.rates)} and {len(b.rates)} rates."
        )
    ratios = _log_ratios(a, b, rounds, scale_a, scale_b)
    if ratios is None:
        return False
    gap = statistics.fmean(ratios) - math.log1p(margin)
    df = rounds - 1
    bound = _T95[df - 1] if df <= len(_T95) else 1.645
    return gap > 0 and gap > bound * statistics.stdev(ratios) / math.sqrt(rounds)


def warm_up(step: Callable[[], float], *, minimum: int = 1, cap: int = 6, tolerance: float = SETTLED) -> int:
    """Run ``step`` (returns its seconds) untimed until two successive steps are :func:`settled`,
    at least ``minimum`` and at most ``cap`` times; returns how many ran."""
    if not 1 <= minimum <= cap:
        raise ValueError(f"warm_up: 1 <= minimum <= cap must hold, but got minimum={minimum}, cap={cap}.")
    times: list[float] = []
    while len(times) < cap:
        times.append(step())
        if len(times) >= max(minimum, 2) and settled(times[-2], times[-1], tolerance=tolerance):
            break
    return len(times)


def settled(a: float, b: float, *, tolerance: float = SETTLED) -> bool:
    """Whether two successive step times agree within ``tolerance`` of the faster: the one-time
    costs of a configuration are paid (the rule :func:`warm_up` and ``measure()``'s warm-up share)."""
    return abs(a - b) <= tolerance * max(min(a, b), 1e-9)


@dataclass(frozen=True, kw_only=True)
class Retimed:
    """What :func:`retime` measured.

    ``timings[i]``: configuration i's timed steps over every round. ``ranking``: indices from the
    best value to the worst. ``decided``: the best is ahead of the runner-up round by round
    (:func:`separated_by_rounds`), or there is only one. ``rounds``: rounds run. ``warmup``:
    untimed steps each configuration ran first. ``other_cores``: cores other processes used on
    average while timing (None where unknown).
    """

    timings: tuple[Timing, ...]
    ranking: tuple[int, ...]
    decided: bool
    rounds: int
    warmup: tuple[int, ...]
    other_cores: float | None

    @property
    def winner(self) -> int:
        return self.ranking[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rates": [list(t.rates) for t in self.timings],
            "ranking": list(self.ranking),
            "decided": self.decided,
            "rounds": self.rounds,
            "warmup": list(self.warmup),
            "other_cores": self.other_cores,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Retimed:
        return cls(
            timings=tuple(Timing(rates=tuple(r)) for r in d["rates"]),
            ranking=tuple(d["ranking"]),
            decided=d["decided"],
            rounds=d["rounds"],
            warmup=tuple(d["warmup"]),
            other_cores=d["other_cores"],
        )


def retime(
    steps: Sequence[Callable[[], tuple[int, float]]],
    *,
    scales: Sequence[float] | None = None,
    rounds: int = 3,
    max_rounds: int = 6,
    steps_per_round: int = 2,
    warmup_cap: int = 6,
) -> Retimed:
    """Time configurations side by side: ``steps[i]()`` runs one training step of configuration
    i and returns (samples, seconds); ``scales[i]`` turns its samples/s into the value compared
    (1 / GiB of its measured peak for throughput per GiB; default 1).

    Each configuration is first warmed up (:func:`warm_up`); then ``rounds`` rounds, each running
    ``steps_per_round`` steps of every configuration in turn, the order rotating by one each
    round; more rounds, up to ``max_rounds``, while the best is not ahead of the runner-up round
    by round (:func:`separated_by_rounds`). Cost: (warm-up + rounds x steps_per_round) steps per configuration.
    """
    n = len(steps)
    if n < 1:
        raise ValueError("retime: at least one configuration to time, but got none.")
    if not 1 <= rounds <= max_rounds:
        raise ValueError(
            f"retime: 1 <= rounds <= max_rounds must hold, but got rounds={rounds}, max_rounds={max_rounds}."
        )
    values = list(scales) if scales is not None else [1.0] * n
    warmup = tuple(warm_up(lambda s=s: s()[1], cap=warmup_cap) for s in steps)  # type: ignore[misc]
    rates: list[list[float]] = [[] for _ in range(n)]
    load = CoreLoad.start()
    done = 0
    while True:
        order = [(done + i) % n for i in range(n)]
        for i in order:
            for _ in range(steps_per_round):
                samples, seconds = steps[i]()
                rates[i].append(samples / max(seconds, 1e-9))
        done += 1
        timings = tuple(Timing(rates=tuple(r)) for r in rates)
        ranking = tuple(sorted(range(n), key=lambda i: -timings[i].median * values[i]))
        decided = n == 1 or separated_by_rounds(
            timings[ranking[0]],
            timings[ranking[1]],
            rounds=done,
            scale_a=values[ranking[0]],
            scale_b=values[ranking[1]],
        )
        if done >= max_rounds or (done >= rounds and decided):
            break
    return Retimed(
        timings=timings, ranking=ranking, decided=decided, rounds=done, warmup=warmup, other_cores=load.other_cores()
    )


def retime_configs(
    workload: Workload,
    configs: Sequence[TrainConfig],
    *,
    scales: Sequence[float] | None = None,
    device: str | None = None,
    rounds: int = 3,
    max_rounds: int = 6,
    steps_per_round: int = 2,
) -> Retimed:
    """:func:`retime` local-runner ``configs`` of ``workload`` on one training loop of a private
    copy of its model, reconfigured between them (a swap of block wrappers and the micro-batch
    drawn: ~1 ms, not timed). One loop, not one per configuration: side by side costs no more
    memory than the largest finalist, which matters on a GPU near its budget."""
    from autotune.errors import ConfigError
    from autotune.train.local import Trainer

    ranked = [c for c in configs if c.on_deepspeed]
    if ranked:
        raise ConfigError(f"retime_configs: local-runner configurations only, but got {ranked[0].describe()}.")
    trainer = Trainer(workload, configs[0], device=device)

    def step(config: TrainConfig) -> tuple[int, float]:
        if trainer.config != config:
            trainer.reconfigure(config)
        r = trainer.step()
        return r.samples, r.seconds

    try:
        steps = [lambda c=c: step(c) for c in configs]
        return retime(steps, scales=scales, rounds=rounds, max_rounds=max_rounds, steps_per_round=steps_per_round)
    finally:
        trainer.close()


def verdict_words(decided: bool) -> str:
    """How a side-by-side verdict reads in a line: ``decided``, or too close to call."""
    return "decided" if decided else "too close to call: within each other's spread"


def busy_note(other_cores: float | None, *, threads: int, cores: int | None = None) -> str | None:
    """One line when other processes competed for the cores while timing, else None.

    Half a core used by others is enough to matter: with as many threads as cores, OpenMP
    threads spin-wait at every barrier for the one that was descheduled, and a step can take an
    order of magnitude longer.
    """
    cores = cores or os.cpu_count() or 1
    if other_cores is None or other_cores < 0.5:
        return None
    note = f"busy machine: other processes used {other_cores:.1f} of {cores} cores while timing"
    if threads > 1 and threads + other_cores > cores:  # one thread: nothing fewer to suggest
        note += f"; {threads} threads oversubscribe the cores (fewer threads, e.g. --threads 1, time steadier)"
    return note
