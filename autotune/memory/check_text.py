"""The memory checks in words: the progress lines and warnings a check (:mod:`autotune.memory.check`) says.

What a check ran (:func:`describe_check`), one line per check step or per trial that checked the
model (:func:`check_line`, :func:`trial_line`), why a prediction is unverified
(:func:`unchecked_reason`, :func:`unverified_message`) and the one warning for blocks that are not
a chain (:func:`not_chain_message`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from autotune.config import REDUCED_PRECISIONS, Precision

if TYPE_CHECKING:
    from autotune.memory.check import Verification
    from autotune.memory.profile_record import MemoryProfile

__all__ = [
    "check_line",
    "describe_check",
    "not_chain_message",
    "trial_line",
    "unchecked_reason",
    "unverified_message",
]


def not_chain_message(workload: str, profile: MemoryProfile) -> str | None:
    """The one warning for a profile whose blocks are not a chain (said once per profile, whether
    its kinds are checked by check steps or by a study's trials), or None for a chain."""
    structure = profile.structure
    if structure is None or structure.chain:
        return None
    return (
        f"workload {workload!r}: {structure.describe()}: configurations that treat blocks "
        "differently are predicted unverified (measured, never admitted on the prediction)."
    )


def check_line(v: Verification) -> str:
    """One line for a progress display, e.g. ``memory check fp32 on cuda (micro-batch 4, fp32):
    predicted 1.2 GiB, measured 1.2 GiB (+0.4%), verified (0.3 s)``."""
    from autotune.units import format_bytes

    head = f"memory check {_KINDS.get(v.kind, v.kind)} on {v.device} ({describe_check(v)})"
    if v.measured is None:
        return f"{head}: {v.reason} ({v.seconds:.1f} s)"
    assert v.relative_error is not None  # set whenever measured is
    verdict = "verified" if v.verified else "UNVERIFIED"
    return (
        f"{head}: predicted {format_bytes(v.predicted)}, measured {format_bytes(v.measured)} "
        f"({v.relative_error:+.1%}), {verdict} ({v.seconds:.1f} s)"
    )


def unchecked_reason(kind: str, device: str, elsewhere: Sequence[str] = ()) -> str:
    """Why a prediction using ``kind`` is unverified on ``device``: no real step there checked
    it (``elsewhere``: the device types whose checks of it stand for those only)."""
    where = f" (checked on {', '.join(elsewhere)} only)" if elsewhere else ""
    return f"no real step on {device} checked {_KINDS[kind]} configurations{where}"


def trial_line(checks: Sequence[Verification]) -> str:
    """One line for a progress display: the kinds a trial (or an adaptive run's measured step)
    checked, e.g. ``memory model checked by trial 0 (fp32 on cpu, micro-batch 8): predicted 1.2
    GiB, measured 1.2 GiB (+0.1%), verified``."""
    from autotune.units import format_bytes

    v = checks[0]
    assert v.measured is not None and v.relative_error is not None  # a trial's check has both
    kinds = ", ".join(_KINDS.get(c.kind, c.kind) for c in checks)
    verdict = "verified" if v.verified else f"UNVERIFIED: {v.reason}"
    by = "a measured step" if v.trial is None else f"trial {v.trial}"
    return (
        f"memory model checked by {by} ({kinds} on {v.device}, micro-batch {v.config.micro_batch_size}): "
        f"predicted {format_bytes(v.predicted)}, measured {format_bytes(v.measured)} "
        f"({v.relative_error:+.1%}), {verdict}"
    )


_KINDS = {
    "default": "fp32",
    "recompute": "recomputed",
    "selective": "selectively recomputed",
    "bf16": "bf16",
    "fp16": "fp16",
    "outer-bf16": "outer bf16",
    "outer-fp16": "outer fp16",
}


def describe_check(v: Verification) -> str:
    """What the check ran, e.g. ``"micro-batch 2, blocks 0, 2 recomputed, local"``."""
    c = v.config
    if v.kind.startswith("outer-"):
        what = f"outer {c.outer_precision}, {_blocks_in(c.precision, c.outer_precision)}"
        if c.checkpoint is True:
            what += ", every block recomputed"
        elif isinstance(c.checkpoint, tuple):
            what += f", blocks {_which(tuple(x is True for x in c.checkpoint))} recomputed"
    elif v.kind == "recompute" and isinstance(c.checkpoint, tuple):
        what = f"blocks {_which(tuple(x is True for x in c.checkpoint))} recomputed"
    elif v.kind == "selective" and isinstance(c.checkpoint, tuple):
        what = f"blocks {_which(tuple(x == 'selective' for x in c.checkpoint))} recomputed selectively"
    elif v.kind in REDUCED_PRECISIONS and isinstance(c.precision, tuple):
        what = f"{v.kind} on blocks {_which(tuple(p != 'fp32' for p in c.precision))}"
    else:
        what = "fp32"
    return f"micro-batch {c.micro_batch_size}, {what}, local on {v.device}"


def _blocks_in(precision: Precision | tuple[Precision, ...], outer: Precision) -> str:
    if isinstance(precision, tuple):
        return f"{outer} on blocks {_which(tuple(p != 'fp32' for p in precision))}"
    return f"every block {precision}"


def _which(flags: tuple[bool, ...]) -> str:
    return ", ".join(str(i) for i, f in enumerate(flags) if f)


def unverified_message(workload: str, v: Verification) -> str:
    """One line: the workload, both figures and the reason."""
    if v.kind in ("composition", "unchecked"):
        return (
            f"memory prediction for workload {workload!r} is unverified: predicted {v.predicted} bytes: "
            f"{v.reason}; the configuration will be measured, not admitted on the prediction."
        )
    measured = "the real step failed" if v.measured is None else f"measured {v.measured} bytes"
    return (
        f"memory prediction for workload {workload!r} is unverified: predicted {v.predicted} bytes, "
        f"{measured} ({describe_check(v)}): {v.reason}; "
        "configurations will be measured, not pruned on the prediction."
    )
