"""Regenerate the simulator profiles autotune ships (``envs/profiles/*.json``), as they were made.

Each profile is ``autotune.envs.calibration.calibrate`` of one workload on this machine with one
torch thread (the ``machine`` field of the shipped files says ``x1 threads``), written by
``save_profile``: the built-in gpt-tiny, resnet-tiny and mlp-digits and the generated
``random:10`` .. ``random:14`` at their own batch with a 60-step loss curve; the corpus models
hf-gpt2, hf-bert, hf-resnet and lstm-lm at their tiny preset, batch 16, with a 40-step curve
(docs/policy.md, "The shipped policy"). A regenerated profile holds the tables the shipped ones
predate (the selective-recompute figures, ``outer_peak_table``, ``outer_selective_peak_table``).

It times real steps: run it on a quiet machine, nothing else running (tens of seconds to a few
minutes a profile on 2 cores)::

    make profiles                                   # or: python scripts/regenerate_profiles.py
    python scripts/regenerate_profiles.py --only mlp-digits --out /tmp/profiles   # one, elsewhere

One line per profile, with its seconds. ``--memory-only`` redoes only the memory tables of the
files already there (the memory model's predictions under fake tensors, nothing timed: any machine,
any load, seconds a profile), their timed terms kept as they were measured::

    python scripts/regenerate_profiles.py --memory-only
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "envs" / "profiles"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shipped:
    """One shipped profile: its file, the workload reference it records, and how it was made."""

    file: str
    workload: str
    curve_steps: int
    corpus_batch: int | None = None  # a corpus model's tiny preset at this batch

    def build(self) -> Workload:
        """The workload, built as it was for the shipped file (``workload`` is its ``source``)."""
        from autotune.resolve import load_workload
        from autotune.zoo import CORPUS

        if self.corpus_batch is None:
            return load_workload(self.workload)
        entry = CORPUS[self.workload.removesuffix(":tiny")]
        wl = entry.build(**(dict(entry.tiny) | {"batch_size": self.corpus_batch}))
        return dataclasses.replace(wl, source=self.workload)


#: Every file in envs/profiles/, in the order it is regenerated (tests/test_regenerate_profiles.py).
SHIPPED: tuple[Shipped, ...] = (
    Shipped(file="gpt-tiny.json", workload="gpt-tiny", curve_steps=60),
    Shipped(file="resnet-tiny.json", workload="resnet-tiny", curve_steps=60),
    Shipped(file="mlp-digits.json", workload="mlp-digits", curve_steps=60),
    *(Shipped(file=f"random-{s}.json", workload=f"random:{s}", curve_steps=60) for s in range(10, 15)),
    *(
        Shipped(file=f"{name}-tiny.json", workload=f"{name}:tiny", curve_steps=40, corpus_batch=16)
        for name in ("hf-gpt2", "hf-bert", "hf-resnet", "lstm-lm")
    ),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PROFILES, help="directory to write to (default envs/profiles)")
    parser.add_argument("--only", help="comma list of profile names (file names without .json) to regenerate")
    parser.add_argument(
        "--memory-only",
        action="store_true",
        help="redo only the memory tables of the profiles in --out (fake tensors, nothing timed)",
    )
    args = parser.parse_args(argv)
    chosen = SHIPPED
    if args.only:
        names = args.only.split(",")
        unknown = [n for n in names if n + ".json" not in {s.file for s in SHIPPED}]
        if unknown:
            known = ", ".join(s.file.removesuffix(".json") for s in SHIPPED)
            print(f"regenerate_profiles: --only must name shipped profiles ({known}), but got {unknown[0]!r}")
            return 2
        chosen = tuple(s for s in SHIPPED if s.file.removesuffix(".json") in names)
    if not args.out.is_dir():
        print(f"regenerate_profiles: --out {str(args.out)!r} is not a directory")
        return 2

    import torch
    from autotune.envs.calibration import calibrate, load_profile, save_profile, with_memory_tables

    from autotune.measurement.progress import phase_line

    torch.set_num_threads(1)  # as the shipped profiles were timed
    total = time.perf_counter()
    for shipped in chosen:
        start = time.perf_counter()
        if args.memory_only:
            profile = with_memory_tables(load_profile(args.out / shipped.file), shipped.build())
        else:
            profile = calibrate(shipped.build(), curve_steps=shipped.curve_steps)
        save_profile(profile, args.out / shipped.file)
        print(phase_line(f"{args.out / shipped.file}: {profile.workload}, batch {profile.batch_size}", start))
        sys.stdout.flush()
    what = "memory tables redone" if args.memory_only else "profiles regenerated"
    print(phase_line(f"{len(chosen)} profiles' {what}" if args.memory_only else f"{len(chosen)} {what}", total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
