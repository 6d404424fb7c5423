"""The search commands as users run them: subprocesses, exit codes, one-line errors, resume after SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune.cli import main
from autotune.config import TrainConfig
from autotune.search.export import allocator_note, recompute_note
from autotune.zoo import BUILTINS
from tests.paths import TINY_WORKLOAD, USER_WORKLOAD

TINY = TINY_WORKLOAD
BUILTIN_NAMES = ", ".join(sorted(BUILTINS))
MEASURE = ("--steps", "2", "--warmup", "1", "--threads", "1", "--no-progress", "--no-memory-model")


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200", **extra}


def _autotune(*args: str, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(**env),
        cwd=cwd,
    )


def _study(storage: Path, name: str = "tiny") -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.load_study(study_name=name, storage=f"sqlite:///{storage}")


def test_help_lists_the_search_commands(tmp_path: Path) -> None:
    proc = _autotune("--help", cwd=tmp_path)
    assert proc.returncode == 0
    for command in ("study", "worker", "best", "dashboard"):
        assert command in proc.stdout


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("study", "no-such-model"),
            f"autotune study: error: unknown workload 'no-such-model': expected a built-in name ({BUILTIN_NAMES}), "
            "'random:SEED', 'path/to/file.py:build' or 'package.module:build'",
        ),
        (
            ("study", "SPEC", "--memory-budget", "1KiB"),
            "autotune study: error: memory_budget must be at least the parameter memory of workload 'tiny' "
            "(134.1 KiB), but got 1 KiB.",
        ),
        (
            ("study", "BAD_KEY"),
            "autotune study: error: BAD_KEY: unknown key 'space.rank' (known keys: batch_size, batch_sizes, blocks, "
            "expandable_segments, min_micro_batch, precisions, ranks, selective, zero_stages).",
        ),
        (
            ("study", "BAD_TYPE"),
            "autotune study: error: BAD_TYPE: trials must be an int, but got 'ten'.",
        ),
        (
            ("study", "SPEC", "--storage", "postgresql://autotune@127.0.0.1:1/none"),
            "autotune study: error: cannot open storage 'postgresql+psycopg://autotune@127.0.0.1:1/none': "
            'connection failed: connection to server at "127.0.0.1", port 1 failed: Connection refused',
        ),
        (
            ("study", "SPEC", "--storage", "sqlite:////nonexistent-dir/x.db"),
            "autotune study: error: cannot open storage 'sqlite:////nonexistent-dir/x.db': "
            "unable to open database file",
        ),
        (
            ("study", "SPEC", "--batch-sizes", "16,x"),
            "autotune study: error: --batch-sizes must be a comma list of ints, but got '16,x'.",
        ),
        (
            ("best", "nothing"),
            "autotune best: error: no study storage at studies/autotune.db: run autotune study first, "
            "or pass --storage",
        ),
        (
            ("study", "SPEC", "--objective", "bogus"),
            "autotune study: error: objective must be one of ('per-gib', 'throughput'), but got 'bogus'.",
        ),
        (
            ("study", "SPEC", "--trials", "0"),
            "autotune study: error: trials must be >= 1, but got 0.",
        ),
        (
            ("study", "SPEC", "--trials", "-1"),
            "autotune study: error: trials must be >= 1, but got -1.",
        ),
        (
            ("study", "SPEC", "--min-micro-batch", "0"),
            "autotune study: error: --min-micro-batch must be >= 1, but got 0.",
        ),
        (
            ("study", "SPEC", "--memory-budget", "5"),
            "autotune study: error: --memory-budget needs a unit: a size such as 5GiB or 5MiB, or a percentage "
            "such as 75%, but got '5'.",
        ),
        (
            ("study", "BAD_LOSS", "--trials", "3"),
            "autotune study: error: workload 'tiny': loss_fn must return a scalar tensor, but returned shape (2, 16)",
        ),
        (
            ("dashboard", "--storage", "missing.db"),
            "autotune dashboard: error: no study storage at missing.db: run autotune study first, or pass --storage",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: tuple[str, ...],
    line: str,
) -> None:
    # In-process (cli.main is what the console script calls): a subprocess per case would spend
    # seconds importing torch and optuna for each one-line error. One case below runs as a process.
    monkeypatch.chdir(tmp_path)
    specs = {
        "SPEC": f"{TINY}:build",
        "BAD_LOSS": f"{TINY}:build_bad_loss",
        "BAD_KEY": tmp_path / "bad_key.toml",
        "BAD_TYPE": tmp_path / "bad_type.toml",
    }
    specs["BAD_KEY"].write_text(f'workload = "{TINY}:build"\n[space]\nrank = [2]\n')
    specs["BAD_TYPE"].write_text(f'workload = "{TINY}:build"\ntrials = "ten"\n')
    expected = line
    for key, value in specs.items():
        expected = expected.replace(key, str(value))
    code = main([str(specs.get(a, a)) for a in args])
    out = capsys.readouterr()
    assert (code, out.err, out.out) == (2, expected + "\n", "")
    assert not (tmp_path / "studies").exists()  # not even the default storage file
    assert not (tmp_path / "missing.db").exists()


def test_an_unknown_workload_exits_2_from_a_real_process(tmp_path: Path) -> None:
    proc = _autotune("study", "no-such-model", "--trials", "3", cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.startswith("autotune study: error: unknown workload 'no-such-model': expected a built-in name")
    assert proc.stderr.count("\n") == 1 and not (tmp_path / "studies").exists()


def test_a_study_name_taken_by_other_objectives_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "s.db"
    optuna.create_study(study_name="tiny", storage=f"sqlite:///{db}", directions=["minimize", "minimize"])
    before = db.read_bytes()
    assert main(["study", f"{TINY}:build", "--storage", str(db)]) == 2
    assert capsys.readouterr().err == (
        f"autotune study: error: study 'tiny' already exists in 'sqlite:///{db}' with other objectives "
        "(minimize, minimize); pass --study-name to start another study\n"
    )
    assert db.read_bytes() == before


def _counted(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    finished = ("COMPLETE", "PRUNED", "FAIL")
    return [t for t in study.trials if t.state.name in finished and not t.user_attrs.get("interrupted")]


def test_sigkill_mid_trial_loses_no_completed_trial_and_rerun_resumes(tmp_path: Path) -> None:
    db, hold = tmp_path / "s.db", tmp_path / "hold"
    args = ("study", f"{TINY}:build_holdable", "--trials", "4", "--storage", str(db), "--cache", str(tmp_path / "c.db"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", *args, *MEASURE],
        env=_env(AUTOTUNE_TEST_HOLD=str(hold)),
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 240
        while _finished_count(db) < 2:  # let two trials finish, then hold the next one mid-trial
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        hold.write_text("")
        while not Path(f"{hold}.held").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        before = {t.number: t.state.name for t in _study(db).trials if t.state.name != "WAITING"}
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    held_pid = int(Path(f"{hold}.held").read_text())
    hold.unlink()
    assert list(before.values()).count("RUNNING") == 1
    done_before = [n for n, s in before.items() if s != "RUNNING"]
    _wait_gone(held_pid)  # the orphaned measurement child exits by itself

    rerun = _autotune(*args, *MEASURE, cwd=tmp_path, AUTOTUNE_TEST_HOLD=str(hold))
    assert rerun.returncode == 0, rerun.stderr
    study = _study(db)
    after = {t.number: t for t in study.trials}
    assert len(_counted(study)) == 4
    assert all(after[n].state.name == before[n] for n in done_before)  # nothing completed was lost
    interrupted = [t for t in study.trials if t.user_attrs.get("interrupted")]
    assert len(interrupted) == 1 and interrupted[0].state.name == "FAIL"
    retries = [t for t in study.trials if t.user_attrs.get("retry_of") == interrupted[0].number]
    assert len(retries) == 1 and retries[0].params == interrupted[0].params
    assert "recommended: trial" in rerun.stdout


def _finished_count(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        try:
            row = con.execute("SELECT COUNT(*) FROM trials WHERE state IN ('COMPLETE', 'PRUNED', 'FAIL')").fetchone()
        except sqlite3.OperationalError:  # tables not created yet
            return 0
    return int(row[0])


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    raise AssertionError(f"measurement process {pid} outlived its study process")


def test_best_exports_json_deepspeed_and_python(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "s.db"
    args = ("study", f"{TINY}:build", "--trials", "3", "--storage", str(db), "--cache", str(tmp_path / "c.db"))
    assert main([*args, "--artifact-dir", str(tmp_path / "art"), *MEASURE]) == 0
    printed = capsys.readouterr().out
    assert "Pareto front of 'tiny'" in printed and "recommended / baseline" in printed
    out, err = {}, {}
    for fmt in ("json", "deepspeed", "python"):
        assert main(["best", "tiny", "--storage", str(db), "--format", fmt]) == 0
        out[fmt], err[fmt] = capsys.readouterr()
    config = TrainConfig.from_json(out["json"])
    # JSON has no comments: which allocator setting the DeepSpeed config assumes goes to stderr, and
    # the per-block recompute it cannot say (which blocks the pick recomputes is measured).
    recompute = recompute_note(config, num_blocks=4)
    assert err["deepspeed"] == (
        f"autotune best: {allocator_note(False)}\n"
        "autotune best: recommended for the most samples/s per GiB of peak within the memory budget "
        "(objective per-gib)\n" + ("" if recompute is None else f"autotune best: {recompute}\n")
    )
    assert "ALLOC_CONF = None" in out["python"]
    assert config.effective_batch_size == 16
    ds = json.loads(out["deepspeed"])
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"]) == (16, config.micro_batch_size)
    compile(out["python"], "snippet.py", "exec")
    assert "BLOCKS = ['blocks.0', 'blocks.1', 'blocks.2', 'blocks.3']" in out["python"]


@pytest.mark.serial  # a study child raced against a deadline: beside another worker it can miss it
def test_ctrl_c_mid_trial_is_one_line_exit_130_and_keeps_the_completed_trials(tmp_path: Path) -> None:
    db, hold = tmp_path / "x.db", tmp_path / "hold"
    # No policy proposal: its line would precede the one this test checks is all that remains.
    args = ("study", f"{TINY}:build_holdable", "--trials", "4", "--storage", f"sqlite:///{db}", "--no-policy-proposal")
    proc = subprocess.Popen(
        [sys.executable, "-m", "autotune.cli", *args, "--cache", str(tmp_path / "c.db"), *MEASURE],
        env=_env(AUTOTUNE_TEST_HOLD=str(hold)),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the terminal's Ctrl-C reaches parent and child
        # A runner started in the background by a non-interactive shell (`cmd &`) ignores SIGINT, and
        # an ignored signal is inherited: Python would keep it ignored and the Ctrl-C never arrive.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 240
        while _finished_count(db) < 1:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        hold.write_text("")
        while not Path(f"{hold}.held").exists():  # a trial is running in the measuring child
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    hold.unlink()
    # The setup's lines (one per phase, each with its seconds), then the one line Ctrl-C gets.
    *setup, last = err.splitlines()
    assert (proc.returncode, last, out) == (130, "autotune study: interrupted", "")
    assert [re.sub(r"\d+\.\d s(?=[,)])", "s", line) for line in setup] == [
        "workload tiny loaded: 34,340 parameters, 4 blocks (s)",
        "blocks: blocks.0..blocks.3 (4 repeated Block(LayerNorm, Linear, Linear))",
        "blocks ranked by the activation bytes they save (one fake-tensor forward, s)",
        # Launched before the study loaded the workload: its build overlapped the load.
        "measuring process ready on cpu: workload built, one warm-up step (s, launched before the workload was loaded)",
        "reduced precisions screened: bf16 kept (s)",
        "baselines enqueued: pytorch-default, seed-recipe, hf-recipe (s)",
    ]
    _wait_gone(int(Path(f"{hold}.held").read_text()))
    study = _study(db)
    counted = _counted(study)
    assert len(counted) >= 1 and all(t.state.name in ("COMPLETE", "PRUNED", "FAIL") for t in counted)
    interrupted = [t for t in study.trials if t.user_attrs.get("interrupted")]
    assert [t.state.name for t in interrupted] == ["FAIL"]  # not counted: a rerun measures it again


def test_no_policy_proposal_enqueues_only_the_baselines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "s.db"
    args = ["study", f"{TINY}:build", "--storage", str(db), "--create-only", "--no-policy-proposal"]
    assert main(args) == 0
    assert [re.sub(r"\d+\.\d s\)$", "s)", line) for line in capsys.readouterr().err.splitlines()[-2:]] == [
        "baselines enqueued: pytorch-default, seed-recipe, hf-recipe (s)",
        "study 'tiny' ready: 3 trials enqueued; start the workers now",
    ]
    assert [t.user_attrs["baseline"] for t in _study(db).trials] == ["pytorch-default", "seed-recipe", "hf-recipe"]


def test_a_rerun_of_an_unseeded_workload_says_why_its_fingerprint_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The README's user workload without its torch.manual_seed(0): other weights on every build().
    unseeded = tmp_path / "unseeded.py"
    unseeded.write_text(USER_WORKLOAD.read_text().replace("torch.manual_seed(0)", ""))
    db = tmp_path / "s.db"
    args = ["study", f"{unseeded}:build", "--storage", str(db), "--no-policy-proposal", "--create-only"]
    assert main(args) == 0
    capsys.readouterr()
    before = db.read_bytes()
    assert main(args) == 2
    err = capsys.readouterr().err
    line = (
        f"autotune study: error: study 'my-net' already exists in 'sqlite:///{db}' with another workload "
        "fingerprint ('HEX', this run: 'HEX'); unseeded random weights change the fingerprint on every run (seed "
        "them: torch.manual_seed in build()), or pass --study-name to start another study\n"
    )
    assert re.fullmatch(re.escape(line).replace("HEX", "[0-9a-f]{64}"), err)
    assert err.count("\n") == 1 and db.read_bytes() == before


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", "an empty file"),
        (b"trial,value\n0,1.5\n", "not an SQLite database"),
        (None, "an SQLite database without Optuna's tables"),
    ],
)
@pytest.mark.parametrize("command", [("dashboard",), ("best", "tiny")])
def test_a_storage_file_that_is_no_study_storage_is_refused_untouched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None, why: str, command: tuple[str, ...]
) -> None:
    path = tmp_path / "data.db"
    if content is None:
        with sqlite3.connect(path) as db:  # someone else's database
            db.execute("CREATE TABLE notes (text TEXT)")
    else:
        path.write_bytes(content)
    before = path.read_bytes()
    assert main([*command, "--storage", str(path)]) == 2
    out = capsys.readouterr()
    line = f"autotune {command[0]}: error: {path} is not a study storage ({why}): run autotune study first, or pass "
    assert (out.out, out.err) == ("", line + "--storage\n")
    assert path.read_bytes() == before


def test_selective_stores_the_space_with_the_level_and_the_default_keeps_the_identity(tmp_path: Path) -> None:
    # --selective-refine: stored, and the baselines (no selective block) enqueued without the parameter.
    for flags, stored in (
        ((), None),
        (("--no-selective",), None),
        (("--selective",), True),
        (("--selective-refine",), "refine"),
    ):
        db = tmp_path / f"{'-'.join(flags) or 'default'}.db"
        args = ["study", f"{TINY}:build", "--storage", str(db), "--create-only", "--no-policy-proposal", *flags]
        assert main(args) == 0
        space = _study(db).user_attrs["spec"]["space"]
        assert space.get("selective") == stored  # off, the default, is not stored: older studies resume
        params = [set(t.system_attrs["fixed_params"]) for t in _study(db).trials]  # the enqueued baselines
        assert all(("selective_blocks" in p) == (stored is True) for p in params)
