"""The tuning constants, in one place: how sure a measurement must be before autotune acts on it.

Every searcher reads them from :data:`TUNING` (the study, the environments, the policy and the
adaptive controller), so changing how a decision is made is one edit here. They are tuned for
2-core CPU machines, where a step's time spreads 10-20% between stints; a quieter machine
(a GPU) would decide sooner with smaller values, never more wrongly.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from autotune.errors import ConfigError

__all__ = ["TUNING", "Tuning"]


@dataclass(frozen=True, kw_only=True)
class Tuning:
    """The constants of measurement-driven decisions.

    Args:
        margin: How much better (objective per GiB) a measured configuration must be to be
            returned to, and how much worse one must be to be left: about the spread of a
            median of a few timed steps on a busy 2-core CPU.
        trusted_steps: Timed steps (a median of) before a measurement may overrule the decision
            source.
        paired_steps: Timed steps of each side of a side-by-side trial (steps alternating
            between the candidate and the configuration it replaced)...
        max_paired_steps: ...up to this many each while the two medians are within their spreads.
        noise_steps: Steps before each decision whose gradients feed the gradient noise estimate.
        observed_losses: Recent losses an observation carries (the loss trend the policy sees).
        local_headroom: The gate's margin on a prediction in one process: the memory model's
            verified error on the corpus is under 1e-6, the 2% covers allocator rounding and
            kernels' workspaces it does not see.
        ranks_headroom: The same on DeepSpeed ranks, where the model's error on configurations
            it was not checked on is a few percent (the benchmarks page has the runs).
        profile_micro_batch: The micro-batch of the per-block profile a decision source reads
            (two samples: batch-dependent bytes separate from the constant ones).
        horizon: Decisions in one episode of the environments (and the policy's observation of
            how far into it a run is).
        finalists: Distinct configurations re-timed side by side before a recommendation (the
            study's and ``tune``'s): three cover a lucky stint's winner and its two runners-up,
            at three configurations' worth of steps (seconds to a minute on the corpus).
    """

    margin: float = 0.03
    trusted_steps: int = 3
    paired_steps: int = 4
    max_paired_steps: int = 8
    noise_steps: int = 4
    observed_losses: int = 16
    local_headroom: float = 0.02
    ranks_headroom: float = 0.05
    profile_micro_batch: int = 2
    horizon: int = 16
    finalists: int = 3

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not 0.0 <= value < 1.0:
                raise ConfigError(f"Tuning.{f.name} must be in [0, 1), but got {value!r}.")
            if isinstance(value, int) and (isinstance(value, bool) or value < 1):
                raise ConfigError(f"Tuning.{f.name} must be an int >= 1, but got {value!r}.")
        if self.max_paired_steps < self.paired_steps:
            raise ConfigError(
                f"Tuning.max_paired_steps must be >= paired_steps ({self.paired_steps}), "
                f"but got {self.max_paired_steps!r}."
            )


#: The constants every searcher uses.
TUNING = Tuning()
