"""Which reduced precisions a study searches on this machine.

Some machines cannot run, or cannot run fast, what a study's space offers: bf16 autocast around
``nn.LSTM`` raises on an AVX2 CPU (oneDNN has no primitive for it), and a CPU without bf16 units
makes a bf16 step many times slower than fp32. Trials landing there are lost (Optuna's samplers
learn nothing from a failed trial, and a slow one costs the study's time). So before its baselines
a study screens each reduced precision at one configuration (every block in it, the smallest
micro-batch, one rank), in its measuring child:

* one that fails where the same configuration in fp32 runs is left out;
* one that runs is timed side by side with fp32 there (:meth:`retime`: its warm-up, then one to
  three rounds of two steps each) and left out when its step takes :data:`DOMINATED_SLOWDOWN`
  times the fp32 step or more, beyond the noise;
* while other processes compete for the cores the ratio is not the machine's and moves either
  way, so a busy machine cannot tell near the threshold: the precision is kept, with a line
  saying so, unless its step takes :data:`BUSY_MARGIN` times the threshold or more.

The ratios measured on the corpus, quiet and beside another process, are on the benchmarks page
(docs/benchmark-log.md).

A model whose parameters are all 16-bit (loaded in bf16) searches no reduced precision: autocast
casts fp32 operands only, so every precision would run the same step.

The verdict is stored with the study (user attribute :data:`PRECISIONS_ATTR`): a resumed study and
its workers search the space it started with, whatever the machine's load when they start. A
verdict reached on a quiet machine is also kept in the measurement cache (machine, workload and
autotune's code in its key), so another study of the same model on the same machine searches the
same space.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from autotune.measurement.busy import OTHER_LOAD

if TYPE_CHECKING:
    import optuna

    from autotune.config import Precision, TrainConfig
    from autotune.search.cache import MeasurementCache
    from autotune.search.study import Prepared

__all__ = ["BUSY_MARGIN", "DOMINATED_SLOWDOWN", "PRECISIONS_ATTR", "screen_precisions"]

#: A reduced precision whose step takes this many times the fp32 step or more is left out of a
#: study's space: no point in it can win on throughput per GiB. Autocast keeps fp32 weights,
#: gradients and optimizer states, and halves at most the activations a block saves, so it cuts
#: the peak by at most 2x; a 2x slower step then loses at least as much throughput as it gains per
#: GiB, and recomputing the block (which frees all its saved activations for about one more
#: forward, a third of its step) reaches the memory for less time.
DOMINATED_SLOWDOWN = 2.0

#: On a busy machine a reduced precision is left out only when its step takes this many times
#: :data:`DOMINATED_SLOWDOWN` or more: another process on the cores moves the measured ratio
#: either way, by more than 2x (the runs are on the benchmarks page).
BUSY_MARGIN = 3.0

#: Study user attribute: ``{"kept": [...], "notes": [...]}``, the reduced precisions searched and
#: the lines that said why any was left out.
PRECISIONS_ATTR = "precisions"


def screen_precisions(
    prepared: Prepared,
    measurer: Any,
    *,
    study: optuna.Study,
    cache: MeasurementCache,
    machine: str,
    note: Callable[[str], None],
) -> Prepared:
    """``prepared`` with the reduced precisions ``study`` searches here: the study's stored
    verdict if it has one, else each precision's (from ``cache`` or screened with ``measurer``,
    the study's measuring child), stored on the study. Each precision left out is said through
    ``note``."""
    space = prepared.space
    if not space.low_precisions:
        return prepared
    held = prepared.workload.held_note
    if held is not None:
        # Autocast casts fp32 operands only: over 16-bit weights every precision is the same step.
        left = " and ".join(space.low_precisions)
        note(f"{left} left out of the search: {held}")
        return dataclasses.replace(prepared, space=dataclasses.replace(space, low_precisions=()))
    if 1 not in space.ranks:
        return prepared
    stored = _stored(study)
    if stored is None:
        verdicts = [_verdict(prepared, measurer, p, cache=cache, machine=machine) for p in space.low_precisions]
        fresh = {
            "kept": [v["precision"] for v in verdicts if v["kept"]],
            "notes": [v["note"] for v in verdicts if v["note"]],
        }
        # A worker that started beside this one may have stored its verdict meanwhile: one space per study.
        stored = _stored(study)
        if stored is None:
            study.set_user_attr(PRECISIONS_ATTR, fresh)
            stored = fresh
    for line in stored["notes"]:
        note(line)
    kept = tuple(p for p in space.low_precisions if p in stored["kept"])
    if kept == space.low_precisions:
        return prepared
    return dataclasses.replace(prepared, space=dataclasses.replace(space, low_precisions=kept))


def _stored(study: optuna.Study) -> dict[str, list[str]] | None:
    stored = study.user_attrs.get(PRECISIONS_ATTR)  # read from the storage: another worker's write is seen
    if not isinstance(stored, dict):
        return None
    return {"kept": list(stored.get("kept", [])), "notes": list(stored.get("notes", []))}


def _verdict(
    prepared: Prepared, measurer: Any, precision: Precision, *, cache: MeasurementCache, machine: str
) -> dict[str, Any]:
    """``{"precision", "kept", "note"}`` for one reduced precision, from the cache or screened."""
    from autotune.search.cache import verdict_key

    space = prepared.space
    batch = prepared.reference_batch if prepared.reference_batch in space.batch_sizes else space.batch_sizes[0]
    micro = space.micro_batch_choices(batch, 1)[0]
    key = verdict_key(
        workload=prepared.fingerprint, machine=machine, subject=f"precision {precision} at micro-batch {micro}"
    )
    cached = cache.get_verdict(key)
    if cached is not None:
        return cached
    verdict, settled = _screen(prepared, measurer, precision, micro)
    if settled:
        cache.put_verdict(key, verdict)
    return verdict


def _screen(prepared: Prepared, measurer: Any, precision: Precision, micro: int) -> tuple[dict[str, Any], bool]:
    """Run and time ``precision`` beside fp32 at ``micro``: (verdict, whether it holds on this
    machine whatever its load)."""
    from autotune.errors import MeasurementFailed

    name = prepared.workload.name
    timeout = prepared.spec.measure.trial_timeout

    def at(p: Precision) -> TrainConfig:
        return dataclasses.replace(prepared.space.base, micro_batch_size=micro, grad_accum_steps=1, precision=p)

    def fails(p: Precision) -> str | None:
        try:
            measurer.measure(at(p), steps=1, warmup=1, memory_budget=None, timeout=timeout)
        except MeasurementFailed as e:
            return e.reason
        return None

    def verdict(kept: bool, line: str | None = None) -> dict[str, Any]:
        return {"precision": precision, "kept": kept, "note": line}

    failure = fails(precision)
    if failure is not None:
        if fails("fp32") is not None:
            return verdict(True), False  # nothing runs: the trials will say what is wrong
        line = f"{precision} left out of the search: {name} cannot run in {precision} here ({failure})"
        return verdict(False, line), True
    try:
        # One round decides a 10x gap; up to three settle a closer one (each: two steps of each).
        pair = [at("fp32"), at(precision)]
        timed = measurer.retime(pair, scales=[1.0, 1.0], timeout=2 * timeout, rounds=1, max_rounds=3)
    except MeasurementFailed:
        return verdict(True), False
    fp32, reduced = (t.median for t in timed.timings)
    slower = fp32 / reduced if reduced > 0 else float("inf")
    if slower < DOMINATED_SLOWDOWN:
        # Kept whatever the load (keeping costs trials, never a pick); remembered only when quiet,
        # because load moves the ratio either way (BUSY_MARGIN).
        return verdict(True), timed.other_cores is None or timed.other_cores < OTHER_LOAD
    busy = timed.other_cores is not None and timed.other_cores >= OTHER_LOAD
    if busy and slower < DOMINATED_SLOWDOWN * BUSY_MARGIN:
        line = (
            f"{precision} kept in the search: its step measured {slower:.1f}x the fp32 step of {name}, but other "
            f"processes used {timed.other_cores:.1f} cores meanwhile; a busy machine cannot tell whether it is "
            "slow here"
        )
        return verdict(True, line), False
    if not timed.decided:
        return verdict(True), False
    line = (
        f"{precision} left out of the search: a step of {name} in {precision} takes {slower:.1f}x the fp32 step "
        f"here (side by side at micro-batch {micro}"
        + (f"; other processes used {timed.other_cores:.1f} cores meanwhile" if busy else "")
        + "): recomputing activations saves more memory for less time"
    )
    # A busy machine's verdict holds for this study only: the next one screens again.
    return verdict(False, line), not busy
