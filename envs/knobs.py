"""The environments' knob levels: :mod:`autotune.knobs`'s, re-exported where they were.

The configuration vocabulary (TrainConfig, Knobs, KnobLevels, the conversions and the named
moves) is one module, :mod:`autotune.knobs`, below every searcher; this one stays for
compatibility.
"""

from autotune.knobs import (
    ACCUM_LEVELS,
    FRACTION_LEVELS,
    MICRO_LEVELS,
    ZERO_STAGES,
    Action,
    KnobLevels,
    Move,
    apply_action,
    blocks_at_level,
    knobs_to_config,
    level_blocks,
    levels_of,
)

__all__ = [
    "ACCUM_LEVELS",
    "FRACTION_LEVELS",
    "MICRO_LEVELS",
    "ZERO_STAGES",
    "Action",
    "KnobLevels",
    "Move",
    "apply_action",
    "blocks_at_level",
    "knobs_to_config",
    "level_blocks",
    "levels_of",
]
