"""What the real and the simulated environment share: spaces, observation, reward, episode loop.

Template method (as SB3's ``OnPolicyAlgorithm`` owns the loop and PPO adds ``train``): this
base class owns ``reset``/``step``, the observation and the reward; a subclass says how an
interval of training under some knobs goes (really, or simulated) via three hooks.
"""

from __future__ import annotations

import dataclasses
import math
from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import gymnasium as gym
import numpy as np
from autotune.envs._codec import (
    ACCUM_LEVELS,
    FRACTION_LEVELS,
    MICRO_LEVELS,
    ZERO_STAGES,
    Levels,
    apply_action,
    knobs_to_config,
    levels_near,
)
from gymnasium import spaces

from autotune.errors import ConfigError, NonFiniteLossError
from autotune.knobs import Knobs, smallest_micro_batch
from autotune.measurement.objective import score
from autotune.measurement.trend import loss_slope
from autotune.memory.gate import Verdict, admission
from autotune.memory.start import first_within, start_candidates

if TYPE_CHECKING:
    from collections.abc import Sequence

    import torch

    from autotune.config import TrainConfig

__all__ = [
    "Interval",
    "MachineDescriptor",
    "ModelDescriptor",
    "TuningEnv",
    "OBSERVATION_SIZE",
    "model_state_bytes",
    "observation_vector",
    "OVER_BUDGET_PENALTY",
    "DIVERGENCE_PENALTY",
]

OBSERVATION_SIZE = 22
OVER_BUDGET_PENALTY = 1.0
DIVERGENCE_PENALTY = 2.0
RECONFIG_WEIGHT = 1.0


@dataclass(frozen=True, kw_only=True)
class ModelDescriptor:
    """What a policy knows of the model, independent of its architecture.

    Attributes:
        num_parameters: The model's parameter count.
        activation_bytes_per_sample: Activation bytes saved for backward per sample, whole model
            (fp32, nothing recomputed).
        num_blocks: How many blocks the model has.
        top_quarter_share: The share of the blocks' activation bytes in the hungriest quarter of
            blocks.

    Example:
        >>> from autotune.envs import ModelDescriptor
        >>> model = ModelDescriptor.describe(num_parameters=1_000_000, block_bytes=[300.0, 100.0, 100.0, 100.0])
        >>> model.num_blocks, model.activation_bytes_per_sample, model.top_quarter_share
        (4, 600.0, 0.5)
    """

    num_parameters: int
    activation_bytes_per_sample: float
    num_blocks: int
    top_quarter_share: float

    @classmethod
    def describe(
        cls, *, num_parameters: int, block_bytes: Sequence[float], samples: float = 1.0, other_bytes: float = 0.0
    ) -> ModelDescriptor:
        """The one description of a model, wherever its figures come from: ``block_bytes``, each
        block's activation bytes saved for backward (fp32, no recompute) over ``samples`` samples,
        and ``other_bytes``, activations outside the blocks over as many. A real loop and a
        policy on a user's run pass a :class:`~autotune.memory.blocks.BlockProfile`'s
        ``saved_bytes`` and ``micro_batch_size``; the simulator its profile's per-sample bytes."""
        saved = sorted(block_bytes, reverse=True)
        quarter = max(1, round(len(saved) / 4))
        return cls(
            num_parameters=num_parameters,
            activation_bytes_per_sample=(other_bytes + sum(saved)) / samples,
            num_blocks=len(saved),
            top_quarter_share=sum(saved[:quarter]) / max(sum(saved), 1e-12),
        )


def model_state_bytes(model: torch.nn.Module) -> int:
    """The model-state bytes an observation's budget ratio (:attr:`MachineDescriptor.budget_ratio`)
    divides by: parameters, gradients and Adam's two moments, 4x the parameter bytes. One estimate
    for the training environment and a policy on a user's run, which knows it before any step is
    tracked; the simulator's profiles measured the same sum on fp32 Adam (plus Adam's step counters)."""
    return 4 * sum(p.numel() * p.element_size() for p in model.parameters())


@dataclass(frozen=True, kw_only=True)
class MachineDescriptor:
    """What a policy knows of the machine: measured, never assumed.

    On this project's machines bf16 was ~20x slower than fp32 on an AVX2 CPU with no bf16 units,
    and faster on an Ampere GPU.

    Attributes:
        reduced_speed: Throughput of a reduced-precision step relative to fp32.
        budget_ratio: The memory budget over the model-state bytes (parameters, gradients and
            optimizer state).
        recompute_cost: Step time with every block recomputed over the plain step time, minus 1.

    Example:
        >>> from autotune.envs import MachineDescriptor
        >>> machine = MachineDescriptor(reduced_speed=0.05, budget_ratio=2.0)  # bf16 20x slower: an AVX2 CPU
        >>> machine.recompute_cost
        0.0
    """

    reduced_speed: float
    budget_ratio: float
    recompute_cost: float = 0.0


class Interval(NamedTuple):
    """One env step's worth of training under fixed knobs.

    Example:
        >>> from autotune.envs import Interval
        >>> done = Interval(batch=32, throughput=640.0, peak_bytes=90_000_000, b_noise=None, loss=0.69,
        ...                 train_seconds=0.2, reconfig_seconds=0.0)
        >>> done.batch / done.throughput  # seconds per optimizer step
        0.05
    """

    batch: int  # effective batch size trained with
    throughput: float  # samples/s
    peak_bytes: int
    b_noise: float | None  # gradient noise scale (samples), None when not yet estimated
    loss: float
    train_seconds: float
    reconfig_seconds: float


class TuningEnv(gym.Env[np.ndarray, np.ndarray]):
    """Shared spec of ``autotune/Training-v0`` and ``autotune/Simulated-v0``.

    The user's effective batch B_0 (micro-batch x accumulation x ranks at reset) is the training
    maths the user chose (learning rate, schedule): by default no action changes it, and the
    objective is throughput per GiB of peak memory at that batch. With ``adapt_batch`` the batch
    may grow, never below B_0, and the objective becomes goodput per GiB (Pollux, Qiao et al.
    OSDI'21): a larger batch only pays if the gradient noise scale supports it.

    ## Action Space
    ``MultiDiscrete([3, 3, 3, 3, 4, 3, 3])``:

    | index | knob | values |
    |---|---|---|
    | 0 | split: micro-batch (1-128) x accumulation (1-128) | 0 micro x2 and accum /2, 1 keep, 2 micro /2 and accum x2 |
    | 1 | effective batch (only with ``adapt_batch``; otherwise ignored) | 0 halve (never below B_0), 1 keep, 2 double |
    | 2 | blocks in reduced precision: level l puts round(l/4 L) blocks, hungriest first | 0 down, 1 keep, 2 up |
    | 3 | blocks checkpointed (recomputed), same levels and order | 0 down, 1 keep, 2 up |
    | 4 | ZeRO stage 0-3 | min(stage, max_zero_stage): 0 with one rank (where stages 1-2 only add memory) |
    | 5 | blocks recomputed selectively after the checkpointed ones (both together at most all) | 0 down, 1 keep, 2 up |
    | 6 | outer precision: embeddings, final norm, head and loss | 0 fp32, 1 keep, 2 the blocks' reduced precision |

    A move the tables cannot take keeps that knob, so every action is valid (no action masking).
    A checkpoint level up where the checkpointed and selective blocks already cover every block
    turns a selective quarter into a full one. Where the simulator's profile has no figures for a
    knob (no selective peaks, no outer-precision tables) the move changes the configuration but
    not the simulated cost (:mod:`autotune.envs.costmodel`): harmless, never preferred.

    ## Observation Space
    ``Box(-1, 1, (22,), float32)``, each entry normalized and clipped:

    | index | observation | encoding |
    |---|---|---|
    | 0 | gradient noise scale vs effective batch | log2(B_noise / B) / 5 (0 when unknown) |
    | 1 | memory pressure | peak / budget - 1 |
    | 2 | loss trend | 10 x slope per step of the loss / loss |
    | 3 | smoothed loss relative to the episode start | loss / loss_0 - 1 |
    | 4 | throughput relative to the episode's first config | log2(thr / thr_0) / 4 |
    | 5 | fraction of the episode's training budget used | 2 t / T - 1 |
    | 6-9 | knobs: accumulation, micro-batch, precision, checkpoint levels | 2 level / (n - 1) - 1 |
    | 10 | ZeRO stage | 2 stage / 3 - 1 |
    | 11 | model: log10 parameters | log10(P) / 5 - 1 |
    | 12 | model: log10 activation bytes per sample | log10(A) / 5 - 1 |
    | 13 | model: number of blocks | log2(L) / 3 - 1 |
    | 14 | model: activation share of the hungriest quarter of blocks | 2 s - 1 |
    | 15 | machine: reduced-precision speed vs fp32 (measured at reset) | log2(r) / 5 |
    | 16 | machine: memory budget vs model-state bytes | log2(b) / 4 |
    | 17 | machine: data-parallel ranks R (ZeRO divides model states by R) | log2(R) / 3 |
    | 18 | machine: cost of recomputing every block (measured at reset) | 2 c - 1, c = t_ckpt / t - 1 |
    | 19 | batch adaptation: -1 when off, else the batch vs the user's | log2(B / B_0) / 4 |
    | 20 | knobs: selective recompute level | 2 level / 4 - 1 |
    | 21 | knobs: outer precision reduced | 1 if reduced, else -1 |

    ## Rewards
    With G = throughput / peak GiB at the fixed batch, or, with ``adapt_batch``, goodput / peak
    GiB, goodput = throughput x (B_noise + B_0) / (B_noise + B) (Pollux; B_noise the gradient noise
    scale of McCandlish et al. 2018; the efficiency is <= 1 since B >= B_0),

        r_t = log G_t - log G_0 - w * reconfig_seconds / train_seconds

    G_0 is the episode's starting configuration, so staying on it earns 0 per step and the return
    rewards reaching a better configuration quickly and staying there; a reconfiguration pays the
    training time it costs (w = 1). A configuration whose peak would exceed the budget is not
    run (on a GPU it would run out of memory): r = -1 and the knobs stay (the training
    environment judges on the memory model's verified prediction, and measures one tracked step of
    a configuration it has no verified prediction for, as an adaptive run does), so staying on an
    over-budget configuration keeps costing. A non-finite loss ends the episode with r = -2.

    ## Starting State
    The PyTorch default (the batch in one fp32 micro-batch per rank, nothing recomputed). With
    ``start_within_budget`` (the training environment's), an episode whose default is over the
    budget starts where an adaptive run does (:meth:`autotune.adapt.Controller.start`): the first
    of smaller micro-batches (down to the workload's floor,
    :attr:`autotune.Workload.micro_batch_floor`), then the same with every block recomputed,
    within the budget; without it, or if none is, at the default. Where the split is closed (a
    model with BatchNorm keeps its batch) no single action reaches a tight budget from the
    default, and an episode that starts over it only collects refusals. The starting
    configuration is always run once, as the reference G_0, even if it is over budget.

    ## Episode End
    Terminated on divergence; truncated by the registration's ``max_episode_steps``.

    ## Arguments
    - ``horizon``: episode length used to encode the fraction of the training budget used.
    - ``max_zero_stage``: the highest ZeRO stage the ZeRO action reaches (0: one rank, or no ZeRO
      runner).
    - ``adapt_batch``: let the batch action grow the batch (never below B_0), with goodput in the
      reward; off by default: the batch is the user's.

    ## Example
        >>> from autotune.envs import SimulatedEnv
        >>> env = SimulatedEnv(horizon=16)
        >>> env.action_space, env.observation_space.shape
        (MultiDiscrete([3 3 3 3 4 3 3]), (22,))
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 (gymnasium's convention)

    def __init__(self, *, horizon: int, max_zero_stage: int = 0, adapt_batch: bool = False) -> None:
        self.action_space = spaces.MultiDiscrete([3, 3, 3, 3, ZERO_STAGES, 3, 3])
        self.observation_space = spaces.Box(-1.0, 1.0, (OBSERVATION_SIZE,), dtype=np.float32)
        self.horizon = horizon
        self.max_zero_stage = max_zero_stage
        if not isinstance(adapt_batch, bool):
            raise ConfigError(f"adapt_batch must be a bool, but got {adapt_batch!r}.")
        self.adapt_batch = adapt_batch
        self.ranks = 1  # data-parallel ranks the episode trains on (ZeRO needs more than one)
        # The codec's cursor: the level the episode is on. Public state is :attr:`knobs`; the
        # cursor is kept beside it because on fewer than four blocks two levels cover the same
        # count of blocks, and an action moves from the level, as the policy was trained.
        self._cursor = Levels()
        self._t = 0
        self._first: Interval | None = None
        self._last: Interval | None = None
        self._batch0 = 1  # global (all ranks)
        self._levels_batch0 = 1  # one rank's: micro-batch x accumulation
        #: The episode's smallest micro-batch (:func:`autotune.knobs.smallest_micro_batch`; None:
        #: no accumulation, a BatchNorm model's); a subclass sets it per episode.
        self.micro_floor: int | None = 1
        #: Start an episode whose default is over the budget where an adaptive run would
        #: (see Starting State); a subclass sets it.
        self.start_within_budget = False
        self._losses: list[float] = []
        self._model: ModelDescriptor | None = None
        self._machine: MachineDescriptor | None = None
        self._budget = 1

    # ---- what a subclass provides ---------------------------------------------------------------

    @abstractmethod
    def _begin_episode(self) -> tuple[Levels, ModelDescriptor, MachineDescriptor, int]:
        """Pick the episode's model (with ``self.np_random``); return start knobs, descriptors, budget."""

    @abstractmethod
    def _peak_bytes(self, knobs: Levels) -> int:
        """Peak memory of ``knobs`` (measured once and cached, or predicted) before training on it."""

    @abstractmethod
    def _train(self, knobs: Levels) -> Interval:
        """Switch to ``knobs`` (if they changed) and train one interval."""

    # ---- the Gymnasium API --------------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self._cursor, self._model, self._machine, self._budget = self._begin_episode()
        if self.start_within_budget:
            self._cursor = self._start(self._cursor)
        self._t = 0
        self._losses = []
        self._batch0 = self._global_batch(self._cursor)
        self._levels_batch0 = self._cursor.effective_batch_size
        first = self._train(self._cursor)
        if not math.isfinite(first.loss):  # no episode from a diverged start: every reward would be NaN
            raise NonFiniteLossError(
                f"the loss is {first.loss} at the episode's start ({self.knobs.describe()}): "
                "a policy cannot act on a diverged run"
            )
        self._first = self._last = first
        self._losses.append(first.loss)
        return self._observation(first), self._info(first, reward_terms=None)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        assert self._first is not None and self._last is not None, "call reset() before step()"
        self._t += 1
        new = self._next_levels(action)
        if not self._verdict(new).admitted:  # also when staying on an over-budget config
            return (
                self._observation(self._last),
                -OVER_BUDGET_PENALTY,
                False,
                False,
                self._info(self._last, reward_terms={"over_budget": 1.0}),
            )
        result = self._train(new)
        self._cursor = new
        if not math.isfinite(result.loss):
            return (
                self._observation(self._last),
                -DIVERGENCE_PENALTY,
                True,
                False,
                self._info(result, reward_terms={"diverged": 1.0}),
            )
        self._last = result
        self._losses.append(result.loss)
        score, score0 = self.score(result), self.score(self._first)
        reconfig = RECONFIG_WEIGHT * result.reconfig_seconds / max(result.train_seconds, 1e-9)
        reward = score - score0 - reconfig
        terms = {"score": score, "score0": score0, "reconfig": reconfig}
        return self._observation(result), float(reward), False, False, self._info(result, reward_terms=terms)

    def _start(self, default: Levels) -> Levels:
        """Where an episode whose ``default`` is over the budget starts (see Starting State):
        THE search of :mod:`autotune.memory.start`, through the level tables."""
        if self._verdict(default).admitted:
            return default
        config = knobs_to_config(default, tuple(range(self.num_blocks)), ranks=self.ranks)
        candidates = start_candidates(
            config, min_micro_batch=self.micro_floor, stages=(config.zero_stage,), max_accum=ACCUM_LEVELS[-1]
        )
        found, _ = first_within(candidates, lambda c: self._verdict(self._levels_at(default, c)))
        return default if found is None else self._levels_at(default, found[0])

    def _levels_at(self, levels: Levels, config: TrainConfig) -> Levels:
        """``levels`` at ``config``'s split (in the tables) and uniform recompute."""
        everywhere = all(config.block_checkpoints(self.num_blocks))
        return dataclasses.replace(
            levels,
            micro=MICRO_LEVELS.index(config.micro_batch_size),
            accum=ACCUM_LEVELS.index(config.grad_accum_steps),
            checkpoint=FRACTION_LEVELS - 1 if everywhere else 0,
        )

    # ---- what a driver may ask (a policy's episode, its climb) --------------------------------------

    def next_knobs(self, action: np.ndarray | tuple[int, ...]) -> Knobs:
        """The knobs ``action`` moves to from the current ones (before the budget is checked)."""
        return self._knobs_of(self._next_levels(action))

    def admits(self, knobs: Knobs) -> bool:
        """Whether :meth:`step` would train on ``knobs`` rather than refuse them as over the budget
        (a real environment may measure the peak of ``knobs`` once to say so; it is cached)."""
        return self.verdict(knobs).admitted

    def verdict(self, knobs: Knobs) -> Verdict:
        """The admission rule (:func:`autotune.memory.gate.admission`) on the peak of ``knobs``
        (:meth:`_peak_bytes`: one measured, or the simulator's exact one), with the figures."""
        return self._verdict(self._levels_near(knobs))

    # ---- the codec's side: levels, private to the environments and their climb ---------------------

    def _next_levels(self, action: np.ndarray | tuple[int, ...]) -> Levels:
        """The level ``action`` moves the cursor to (:func:`~autotune.envs._codec.apply_action`)."""
        return apply_action(
            self._cursor,
            tuple(int(a) for a in action),
            max_zero_stage=self.max_zero_stage,
            adapt_batch=self.adapt_batch,
            min_batch=self._levels_batch0,
            min_micro=smallest_micro_batch(self._levels_batch0, self.micro_floor),
        )

    def _verdict(self, levels: Levels) -> Verdict:
        return admission(budget=self._budget, headroom=0.0, measured=self._peak_bytes(levels))

    def _levels_near(self, knobs: Knobs) -> Levels:
        """``knobs`` as levels, the cursor's where two levels cover the same blocks."""
        return levels_near(knobs, self._cursor, self.num_blocks)

    def _knobs_of(self, levels: Levels) -> Knobs:
        return levels.knobs(self.num_blocks, ranks=self.ranks)

    # ---- shared pieces ------------------------------------------------------------------------------

    def _global_batch(self, levels: Levels) -> int:
        """Samples per optimizer step over all ranks (what gradient noise and Pollux compare with)."""
        return levels.effective_batch_size * self.ranks

    @property
    def machine(self) -> MachineDescriptor | None:
        """What this episode measured of the machine at reset (None before the first reset)."""
        return self._machine

    @property
    def num_blocks(self) -> int:
        """The blocks of this episode's model, which the precision and recompute levels divide."""
        assert self._model is not None, "call reset() first"
        return self._model.num_blocks

    @property
    def knobs(self) -> Knobs:
        """The current configuration in the encoding the Optuna study shares (:mod:`autotune.knobs`):
        ``SearchSpace.params(env.knobs)`` enqueues it in a study."""
        return self._knobs_of(self._cursor)

    def score(self, r: Interval) -> float:
        """log(throughput per GiB of peak) at the user's batch; log(goodput per GiB) with
        ``adapt_batch`` (the batch is then >= B_0, so the Pollux efficiency is <= 1): the
        objective every searcher shares (:func:`autotune.measurement.objective.score`)."""
        measured = score(
            throughput=r.throughput,
            peak_bytes=r.peak_bytes,
            batch_size=r.batch,
            base_batch_size=self._batch0,
            noise_scale=r.b_noise,
            batch_is_knob=self.adapt_batch,
        )
        return measured.log_per_gib

    def _observation(self, r: Interval) -> np.ndarray:
        assert self._first is not None and self._model is not None and self._machine is not None
        return observation_vector(
            r,
            first=self._first,
            losses=self._losses,
            t=self._t,
            horizon=self.horizon,
            levels=self._cursor,
            model=self._model,
            machine=self._machine,
            budget=self._budget,
            batch=self._global_batch(self._cursor),
            batch0=self._batch0,
            ranks=self.ranks,
            adapt_batch=self.adapt_batch,
        )

    def _info(self, r: Interval, *, reward_terms: dict[str, float] | None) -> dict[str, Any]:
        return {
            "knobs": self.knobs,
            "batch": self._global_batch(self._cursor),
            "throughput": r.throughput,
            "peak_bytes": r.peak_bytes,
            "b_noise": r.b_noise,
            "loss": r.loss,
            "budget_bytes": self._budget,
            "reward_terms": reward_terms or {},
        }


def observation_vector(
    r: Interval,
    *,
    first: Interval,
    losses: list[float],
    t: int,
    horizon: int,
    levels: Levels,
    model: ModelDescriptor,
    machine: MachineDescriptor,
    budget: int,
    batch: int,
    batch0: int,
    ranks: int,
    adapt_batch: bool,
) -> np.ndarray:
    """The observation (the table in :class:`TuningEnv`'s docstring), from what a run measured.

    One implementation for the environments and for a policy acting on a user's own run
    (:class:`autotune.adapt.policy_source.PolicySource`): a policy sees the same numbers wherever it acts.
    """
    # The guard every observation passes: a NaN reaches a policy's logits and PPO's distribution
    # as a ValueError deep in torch.distributions, or worse, an action picked from NaN.
    bad = next((v for v in (r.loss, first.loss, *losses[-4:]) if not math.isfinite(v)), None)
    if bad is not None:
        raise NonFiniteLossError(f"the loss is {bad}: a policy cannot act on a diverged run")
    k, m, mach = levels, model, machine
    b_noise = 0.0 if r.b_noise is None or r.b_noise <= 0 else math.log2(r.b_noise / batch) / 5
    loss0 = first.loss if first.loss != 0 else 1.0
    obs = [
        b_noise,
        r.peak_bytes / budget - 1.0,
        10.0 * (loss_slope(losses[-4:]) or 0.0) / max(abs(r.loss), 1e-9),
        r.loss / loss0 - 1.0,
        math.log2(max(r.throughput, 1e-12) / max(first.throughput, 1e-12)) / 4,
        2.0 * t / horizon - 1.0,
        2.0 * k.accum / (len(ACCUM_LEVELS) - 1) - 1.0,
        2.0 * k.micro / (len(MICRO_LEVELS) - 1) - 1.0,
        2.0 * k.precision / (FRACTION_LEVELS - 1) - 1.0,
        2.0 * k.checkpoint / (FRACTION_LEVELS - 1) - 1.0,
        2.0 * k.zero_stage / (ZERO_STAGES - 1) - 1.0,
        math.log10(max(m.num_parameters, 1)) / 5 - 1.0,
        math.log10(max(m.activation_bytes_per_sample, 1.0)) / 5 - 1.0,
        math.log2(max(m.num_blocks, 1)) / 3 - 1.0,
        2.0 * m.top_quarter_share - 1.0,
        math.log2(max(mach.reduced_speed, 1e-6)) / 5,
        math.log2(max(mach.budget_ratio, 1e-6)) / 4,
        math.log2(ranks) / 3,
        2.0 * mach.recompute_cost - 1.0,
        math.log2(batch / batch0) / 4 if adapt_batch else -1.0,
        2.0 * k.selective / (FRACTION_LEVELS - 1) - 1.0,
        1.0 if k.outer else -1.0,
    ]
    vector = np.clip(np.asarray(obs, dtype=np.float32), -1.0, 1.0)
    assert np.isfinite(vector).all(), f"a finite loss leaves only measured, finite values: {obs}"
    return vector
