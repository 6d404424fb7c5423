"""Study specs: TOML in, validated dataclasses out, one exact message per broken rule."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.errors import SpecError
from autotune.search.spec import (
    BlockOverride,
    MeasureSpec,
    SpaceSpec,
    StudySpec,
    load_spec,
    parse_duration,
    shipped_spec,
    spec_from_dict,
    spec_to_dict,
)
from autotune.units import MemoryBudget

STUDIES = Path(__file__).parent.parent.parent / "studies"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "s.toml"
    path.write_text(text)
    return path


def test_a_full_spec_reads_every_section(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        """
workload = "gpt-tiny"
name = "mine"
trials = 7
memory_budget = "96MiB"
sampler = "nsga2"
seed = 3
timeout = "30m"
policy_proposal = false
[space]
batch_size = 32
batch_sizes = [16, 32]
precisions = ["fp32", "bf16"]
ranks = [1]
[space.blocks.0]
precision = "fp32"
checkpoint = false
[measure]
steps = 3
warmup = 2
trial_timeout = "90s"
threads = 1
""",
    )
    spec = load_spec(path)
    assert spec == StudySpec(
        workload="gpt-tiny",
        name="mine",
        trials=7,
        memory_budget=MemoryBudget(bytes=96 * 2**20),
        sampler="nsga2",
        seed=3,
        timeout=1800.0,
        policy_proposal=False,
        space=SpaceSpec(
            batch_size=32,
            batch_sizes=(16, 32),
            precisions=("fp32", "bf16"),
            ranks=(1,),
            blocks={0: BlockOverride(precision="fp32", checkpoint=False)},
        ),
        measure=MeasureSpec(steps=3, warmup=2, trial_timeout=90.0, threads=1),
    )
    assert spec_from_dict(spec_to_dict(spec)) == spec


@pytest.mark.parametrize("name", ["gpt-tiny", "gpt-small", "resnet-tiny", "mlp-digits"])
def test_the_shipped_specs_are_valid(name: str) -> None:
    assert load_spec(STUDIES / f"{name}.toml").workload == name


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'workload = "x"\ntrial = 3',
            "unknown key 'trial' (known keys: measure, memory_budget, name, objective, "
            "policy_proposal, retime, sampler, seed, space, timeout, trials, workload).",
        ),
        ('workload = "x"\npolicy_proposal = "no"', "policy_proposal must be true or false, but got 'no'."),
        (
            'workload = "x"\n[space]\nrank = [2]',
            "unknown key 'space.rank' (known keys: batch_size, batch_sizes, "
            "blocks, expandable_segments, min_micro_batch, precisions, ranks, selective, zero_stages).",
        ),
        (
            'workload = "x"\n[measure]\nstep = 2',
            "unknown key 'measure.step' (known keys: steps, threads, trial_timeout, warmup).",
        ),
        (
            'workload = "x"\n[space.blocks.1]\nprecison = "bf16"',
            "unknown key 'space.blocks.1.precison' (known keys: checkpoint, precision).",
        ),
        ('workload = "x"\ntrials = "many"', "trials must be an int, but got 'many'."),
        ('workload = "x"\ntrials = -1', "trials must be >= 1, but got -1."),
        ('workload = "x"\ntrials = 0', "trials must be >= 1, but got 0."),
        (
            'workload = "x"\nmemory_budget = 96',
            'memory_budget must be a string with a unit such as "96MiB" or a percentage such as "75%", but got 96.',
        ),
        (
            'workload = "x"\nmemory_budget = "96"',
            "memory_budget needs a unit: a size such as 96GiB or 96MiB, or a percentage such as 75%, but got '96'.",
        ),
        ('workload = "x"\nmemory_budget = "0%"', "memory_budget must be positive and finite, but got '0%'."),
        ("workload = 3", "workload must be a non-empty string, but got 3."),
        (
            'workload = "x"\nsampler = "cmaes"',
            "sampler must be one of ('tpe', 'nsga2', 'gp', 'random'), but got 'cmaes'.",
        ),
        (
            'workload = "x"\nmemory_budget = "lots"',
            "memory_budget must be a size with a unit (B, KB, MB, GB, TB, "
            "KiB, MiB, GiB, TiB) such as 2GiB, or a percentage of the default configuration's peak such as 75%, "
            "but got 'lots'.",
        ),
        ('workload = "x"\ntimeout = "soon"', "timeout must be a duration like 90, 90s, 30m or 2h, but got 'soon'."),
        ('workload = "x"\nspace = 3', "space must be a table, but got 3."),
        ('workload = "x"\n[space]\nranks = 2', "space.ranks must be a non-empty list of ints, but got 2."),
        ('workload = "x"\n[space]\nranks = [0]', "space.ranks entries must be >= 1, but got 0."),
        ('workload = "x"\n[space]\nbatch_sizes = [8, 8]', "space.batch_sizes must not repeat a value, but got [8, 8]."),
        (
            'workload = "x"\n[space]\nprecisions = ["fp8"]',
            "space.precisions entries must be one of ('fp32', 'bf16', 'fp16'), but got 'fp8'.",
        ),
        ('workload = "x"\n[space]\nzero_stages = [4]', "space.zero_stages entries must be in [0, 3], but got 4."),
        (
            'workload = "x"\n[space.blocks.a]\ncheckpoint = true',
            "space.blocks keys must be block indices, but got 'a'.",
        ),
        (
            'workload = "x"\n[space.blocks.0]\ncheckpoint = "yes"',
            "space.blocks.0.checkpoint must be a bool, but got 'yes'.",
        ),
        ('workload = "x"\n[measure]\nsteps = 0', "measure.steps must be >= 1, but got 0."),
        ('workload = "x"\n[measure]\nwarmup = 0', "measure.warmup must be >= 1, but got 0."),
        (
            'workload = "x"\n[measure]\ntrial_timeout = -5',
            "measure.trial_timeout must be a positive duration, but got -5.",
        ),
        ('workload = "x"\n[measure]\nthreads = 0', "measure.threads must be >= 1, but got 0."),
    ],
)
def test_a_malformed_spec_names_the_file_key_rule_and_value(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(SpecError, match=f"^{re.escape(f'{path}: {message}')}$"):
        load_spec(path)


def test_a_spec_that_is_not_toml_says_so(tmp_path: Path) -> None:
    path = _write(tmp_path, "workload = ")
    with pytest.raises(SpecError, match=f"^{re.escape(str(path))}: not valid TOML: "):
        load_spec(path)


def test_a_missing_spec_file_says_so(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(
        SpecError, match=f"^{re.escape(f'{path}: cannot read the study spec: No such file or directory.')}$"
    ):
        load_spec(path)


@pytest.mark.parametrize(("text", "seconds"), [("90", 90.0), ("90s", 90.0), ("1.5m", 90.0), ("2h", 7200.0), (30, 30.0)])
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration(text, name="t") == seconds


def test_a_zero_duration_is_refused() -> None:
    with pytest.raises(SpecError, match=f"^{re.escape('t must be a positive duration, but got 0.')}$"):
        parse_duration(0, name="t")


def test_study_name_defaults_to_the_workload_name() -> None:
    assert StudySpec(workload="gpt-tiny").study_name("gpt-tiny") == "gpt-tiny"
    assert StudySpec(workload="gpt-tiny", name="x").study_name("gpt-tiny") == "x"


def test_expandable_segments_is_a_space_option_stored_only_when_on(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path, 'workload = "gpt-tiny"\n[space]\nexpandable_segments = true\n'))
    assert spec.space == SpaceSpec(expandable_segments=True)
    assert spec_to_dict(spec)["space"]["expandable_segments"] is True
    assert spec_from_dict(spec_to_dict(spec)) == spec
    # Off (the default) is not stored: a study created before the option existed keeps its identity.
    assert "expandable_segments" not in spec_to_dict(StudySpec(workload="gpt-tiny"))["space"]
    with pytest.raises(SpecError, match=re.escape("space.expandable_segments must be true or false, but got 1.")):
        SpaceSpec(expandable_segments=1)  # type: ignore[arg-type]


def test_min_micro_batch_is_a_space_option_stored_only_when_given(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path, 'workload = "unet-tiny"\n[space]\nmin_micro_batch = 4\n'))
    assert spec.space == SpaceSpec(min_micro_batch=4)
    assert spec_to_dict(spec)["space"]["min_micro_batch"] == 4
    assert spec_from_dict(spec_to_dict(spec)) == spec
    # None (the workload's own rule) is not stored: a study created before the option keeps its identity.
    assert "min_micro_batch" not in spec_to_dict(StudySpec(workload="unet-tiny"))["space"]
    with pytest.raises(SpecError, match=re.escape("space.min_micro_batch must be >= 1, but got 0.")):
        SpaceSpec(min_micro_batch=0)


def test_the_objective_is_read_stored_only_when_not_the_default_and_checked(tmp_path: Path) -> None:
    spec = load_spec(_write(tmp_path, 'workload = "gpt-tiny"\nobjective = "throughput"\n'))
    assert spec == StudySpec(workload="gpt-tiny", objective="throughput")
    assert spec_to_dict(spec)["objective"] == "throughput"
    assert spec_from_dict(spec_to_dict(spec)) == spec
    # per-gib (the default) is not stored: a study created before the option keeps its identity.
    default = StudySpec(workload="gpt-tiny")
    assert (default.objective, "objective" in spec_to_dict(default)) == ("per-gib", False)
    assert spec_from_dict(spec_to_dict(default)) == default
    message = f"{tmp_path / 's.toml'}: objective must be one of ('per-gib', 'throughput'), but got 'speed'."
    with pytest.raises(SpecError, match=f"^{re.escape(message)}$"):
        load_spec(_write(tmp_path, 'workload = "gpt-tiny"\nobjective = "speed"\n'))


def test_a_studies_spec_outside_the_repository_reads_the_one_the_package_ships(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no studies/ here: as a user of the installed wheel
    for target in ("studies/gpt-tiny.toml", "gpt-tiny.toml"):
        shipped = shipped_spec(target)
        assert shipped is not None and shipped.read_bytes() == (STUDIES / "gpt-tiny.toml").read_bytes()
        assert load_spec(target) == load_spec(STUDIES / "gpt-tiny.toml")
    # Only a studies/NAME.toml (or a bare NAME.toml) the package has: anything else is the user's file.
    assert shipped_spec("configs/gpt-tiny.toml") is None
    assert shipped_spec("studies/mine.toml") is None
    message = "studies/mine.toml: cannot read the study spec: No such file or directory."
    with pytest.raises(SpecError, match=f"^{re.escape(message)}$"):
        load_spec("studies/mine.toml")


def test_a_spec_in_the_working_directory_comes_before_the_shipped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "studies").mkdir()
    (tmp_path / "studies" / "gpt-tiny.toml").write_text('workload = "mlp-digits"\n')
    assert load_spec("studies/gpt-tiny.toml").workload == "mlp-digits"
