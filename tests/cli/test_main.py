"""The CLI as users run it: subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from autotune.cli.main import DISTRIBUTION, _parser, main
from tests.paths import PLAIN_MLP, ROOT, TINY_WORKLOAD, USER_WORKLOAD

USER = USER_WORKLOAD


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # see conftest: no thread oversubscription
    return subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )


def test_measure_a_user_file_workload_as_json() -> None:
    proc = _run(
        "measure",
        "--workload",
        f"{USER}:build",
        "--micro-batch",
        "16",
        "--accum",
        "2",
        "--checkpoint",
        "0,2",
        "--precision",
        "bf16",
        "--steps",
        "2",
        "--warmup",
        "1",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["workload"] == "my-net"
    assert data["status"] == "ok"
    assert data["config"]["checkpoint"] == [True, False, True]
    assert data["config"]["precision"] == "bf16"
    assert data["memory"]["parameters"] == (3 * (32 * 32 + 32) + 32 * 2 + 2) * 4
    assert data["throughput"] > 0
    assert data["noise"]["steps"] == 4


def test_measure_and_predict_take_the_workload_positionally_and_selective_levels() -> None:
    args = ("--micro-batch", "16", "--checkpoint", "0,2:selective", "--json")
    proc = _run("measure", f"{USER}:build", *args, "--steps", "1", "--warmup", "1")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["config"]["checkpoint"] == [True, False, "selective"]
    proc = _run("predict", f"{USER}:build", *args)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["verified"] is True  # by its kinds' checks: recompute and selective
    assert "memory check selectively recomputed on cpu" in proc.stderr


def test_measure_prints_a_table() -> None:
    proc = _run("measure", "--workload", f"{USER}:build", "--steps", "2", "--warmup", "1")
    assert proc.returncode == 0, proc.stderr
    for row in ("throughput", "peak memory", "optimizer state", "gradient noise scale", "loss slope"):
        assert row in proc.stdout


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("measure", "--workload", "nope.py:build"),
            "autotune measure: error: workload 'nope.py:build': file 'nope.py' does not exist",
        ),
        (
            ("measure", "--workload", f"{USER}:build", "--micro-batch", "0"),
            "autotune measure: error: TrainConfig.micro_batch_size must be >= 1, but got 0.",
        ),
        (
            ("measure", "--workload", f"{USER}:build", "--checkpoint", "0,7"),
            "autotune measure: error: --checkpoint block indices must be in [0, 2], but got 7.",
        ),
        (
            ("measure", "--workload", f"{USER}:build", "--memory-budget", "lots"),
            "autotune measure: error: --memory-budget must be a size with a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, "
            "TiB) such as 2GiB, or a percentage of the default configuration's peak such as 75%, but got 'lots'.",
        ),
        (
            ("predict", f"{USER}:build", "--checkpoint", "0,1:full"),
            "autotune predict: error: --checkpoint must be none, all, selective or comma-separated block indices "
            "(I or I:selective), but got '0,1:full'.",
        ),
        (
            ("predict", "--micro-batch", "2"),
            "autotune predict: error: a workload is required: WORKLOAD or --workload WORKLOAD.",
        ),
        (
            ("measure", f"{USER}:build", "-w", "gpt-tiny"),
            f"autotune measure: error: two workloads given: '{USER}:build' and --workload 'gpt-tiny'; give one.",
        ),
        (("tune", f"{USER}:build", "--ranks", "0"), "autotune tune: error: ranks must be an int >= 1, but got 0."),
        (
            ("predict", "-w", f"{USER}:build", "--outer-precision", "int8"),
            "autotune predict: error: TrainConfig.outer_precision must be one of ('fp32', 'bf16', 'fp16'), "
            "but got 'int8'.",
        ),
        (
            ("predict", "-w", f"{USER}:build", "--precision", "fp16", "--outer-precision", "bf16"),
            "autotune predict: error: TrainConfig.precision must be fp32 or the outer precision 'bf16' on every "
            "block when outer_precision is reduced, but got 'fp16'.",
        ),
    ],
)
def test_user_errors_are_one_line_and_exit_2(args: tuple[str, ...], line: str) -> None:
    proc = _run(*args)
    assert proc.returncode == 2
    assert proc.stderr.strip() == line
    assert proc.stdout == ""


def test_a_measurement_over_the_budget_is_printed_and_exits_4() -> None:
    proc = _run(
        "measure", "--workload", f"{USER}:build", "--memory-budget", "10KiB", "--json", "--steps", "1", "--warmup", "1"
    )
    assert proc.returncode == 4, proc.stderr  # EXIT_OVER_BUDGET, as train's
    data = json.loads(proc.stdout)  # the measurement is still printed, whole
    assert data["status"] == "over_budget"
    assert data["memory_budget"] == 10240
    from autotune import TrainConfig

    config = TrainConfig.from_dict(data["config"]).describe()
    why = f"peak {data['peak_bytes']} bytes exceeds the memory budget of 10240 bytes"
    line = f"autotune measure: OVER BUDGET: {config}: {why}"
    assert proc.stderr.strip().splitlines()[-1] == line


def test_a_measurement_within_the_budget_exits_0() -> None:
    proc = _run("measure", "--workload", f"{USER}:build", "--memory-budget", "1GiB", "--steps", "1", "--warmup", "1")
    assert proc.returncode == 0, proc.stderr
    assert "OVER BUDGET" not in proc.stderr
    assert "fits" in proc.stdout


def test_import_autotune_is_light() -> None:
    heavy = "('torch', 'deepspeed', 'optuna', 'stable_baselines3')"
    code = f"import sys, autotune; print(sorted(m for m in {heavy} if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


TINY = TINY_WORKLOAD
_POLICY_FILES = "a policy directory holds policy.json and policy.safetensors (autotune train-policy --out writes one)"


@pytest.fixture(scope="module")
def bad_policies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Broken policy directories, and a sound one whose actions do not fit the environment."""
    import gymnasium as gym
    import numpy as np
    from autotune.policies.ppo import PRETRAINED_DIR
    from safetensors.torch import save_file
    from stable_baselines3.common.policies import ActorCriticPolicy

    root = tmp_path_factory.mktemp("policies")
    meta = json.loads((PRETRAINED_DIR / "policy.json").read_text())
    weights = (PRETRAINED_DIR / "policy.safetensors").read_bytes()
    (root / "a-file").write_text("")
    (root / "empty").mkdir()
    for name, text, tensors in [
        ("not-json", "{nope", weights),
        ("no-net-arch", json.dumps({k: v for k, v in meta.items() if k != "net_arch"}), weights),
        ("random-bytes", json.dumps(meta), bytes(range(256)) * 4),
        ("wrong-nvec", json.dumps({**meta, "action_nvec": [3, 3, 3, 3, 5]}), weights),
    ]:
        (root / name).mkdir()
        (root / name / "policy.json").write_text(text)
        (root / name / "policy.safetensors").write_bytes(tensors)
    other = ActorCriticPolicy(
        gym.spaces.Box(-1.0, 1.0, (meta["observation_size"],), dtype=np.float32),
        gym.spaces.MultiDiscrete([3, 3, 3]),
        lambda _: 0.0,
    )
    (root / "other-actions").mkdir()
    save_file(other.state_dict(), str(root / "other-actions" / "policy.safetensors"))
    (root / "other-actions" / "policy.json").write_text(
        json.dumps({**meta, "action_nvec": [3, 3, 3], "net_arch": [64, 64]})
    )
    return root


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ("tune", "TINY", "--policy", "P/missing"),
            f"autotune tune: error: policy 'P/missing' does not exist: {_POLICY_FILES}.",
        ),
        (
            ("tune", "TINY", "--policy", "P/a-file"),
            f"autotune tune: error: policy 'P/a-file' is not a directory: {_POLICY_FILES}.",
        ),
        (
            ("tune", "TINY", "--policy", "P/empty"),
            f"autotune tune: error: policy 'P/empty' has no policy.json: {_POLICY_FILES}.",
        ),
        (
            ("tune", "TINY", "--policy", "P/not-json"),
            "autotune tune: error: policy 'P/not-json': policy.json is not valid JSON (Expecting property name "
            "enclosed in double quotes: line 1 column 2 (char 1)).",
        ),
        (
            ("tune", "TINY", "--policy", "P/no-net-arch"),
            "autotune tune: error: policy 'P/no-net-arch': policy.json lacks key 'net_arch' (required: format, "
            "observation_size, action_nvec, net_arch).",
        ),
        (
            ("tune", "TINY", "--policy", "P/random-bytes"),
            "autotune tune: error: policy 'P/random-bytes': policy.safetensors is not a readable safetensors file "
            "(Error while deserializing header: header too large).",
        ),
        (
            ("tune", "TINY", "--policy", "P/wrong-nvec"),
            "autotune tune: error: policy 'P/wrong-nvec': policy.safetensors does not match policy.json (action_nvec "
            "[3, 3, 3, 3, 5], net_arch [64, 64]): action_net.bias has shape (22,), expected (17,).",
        ),
        (
            ("tune", "TINY", "--policy", "P/other-actions"),
            "autotune tune: error: policy 'P/other-actions' chooses actions from MultiDiscrete([3, 3, 3]), but the "
            "environment's action space is MultiDiscrete([3 3 3 3 4 3 3]).",
        ),
        (
            ("tune", "TINY", "--memory-budget", "0"),
            "autotune tune: error: --memory-budget must be positive and finite, but got '0'.",
        ),
        (
            ("tune", "TINY", "--memory-budget", "-0.5"),
            "autotune tune: error: --memory-budget must be positive and finite, but got '-0.5'.",
        ),
        (
            ("tune", "TINY", "--memory-budget", "0.75"),
            "autotune tune: error: --memory-budget needs a unit: a size such as 0.75GiB or 0.75MiB, or a percentage "
            "such as 75%, but got '0.75'.",
        ),
        (("tune", "TINY", "--steps", "0"), "autotune tune: error: horizon must be an int >= 1, but got 0."),
        (
            ("predict", "-w", "TINY", "--memory-budget", "5"),
            "autotune predict: error: --memory-budget needs a unit: a size such as 5GiB or 5MiB, or a percentage such "
            "as 75%, but got '5'.",
        ),
        (
            ("measure", "-w", "TINY", "--device", "tpu"),
            "autotune measure: error: device must be cpu, cuda, cuda:N or auto, but got 'tpu'.",
        ),
        (
            ("predict", "-w", "TINY", "--export-deepspeed", "no-dir/ds.json"),
            "autotune predict: error: --export-deepspeed: cannot write 'no-dir/ds.json': directory 'no-dir' does not "
            "exist.",
        ),
        (
            ("predict", "-w", "TINY", "--export-deepspeed", "P/empty"),
            "autotune predict: error: --export-deepspeed: 'P/empty' is a directory; give a file path such as "
            "'P/empty/ds.json'.",
        ),
        (("dashboard", "--port", "99999"), "autotune dashboard: error: --port must be in [1, 65535], but got 99999."),
        (("dashboard", "--port", "0"), "autotune dashboard: error: --port must be in [1, 65535], but got 0."),
        (("dashboard", "--port", "-1"), "autotune dashboard: error: --port must be in [1, 65535], but got -1."),
        (
            ("train-policy", "--timesteps", "-5"),
            "autotune train-policy: error: timesteps must be an int >= 1, but got -5.",
        ),
        (
            ("train-policy", "--timesteps", "0"),
            "autotune train-policy: error: timesteps must be an int >= 1, but got 0.",
        ),
        (
            ("measure", "-w", "TINY_bad_loss", "--micro-batch", "4", "--accum", "2"),
            "autotune measure: error: workload 'tiny': loss_fn must return a scalar tensor, but returned shape (4, 16)",
        ),
        (
            ("measure", "-w", "TINY_float_loss", "--micro-batch", "4", "--accum", "2"),
            "autotune measure: error: workload 'tiny': loss_fn must return a scalar tensor, but returned float",
        ),
        (
            ("predict", "-w", "MLP_empty"),
            "autotune predict: error: Workload.dataset must hold at least one sample, but got an empty TensorDataset.",
        ),
        (
            ("study", "MLP_small", "--create-only"),
            "autotune study: error: Workload.batch_size must be at most the dataset's 100 samples, but got 512.",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    bad_policies: Path,
    args: tuple[str, ...],
    line: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    refs = {
        "TINY": f"{TINY}:build",
        "TINY_bad_loss": f"{TINY}:build_bad_loss",
        "TINY_float_loss": f"{TINY}:build_float_loss",
        "MLP_empty": f"{PLAIN_MLP}:build_empty",
        "MLP_small": f"{PLAIN_MLP}:build_small",
    }
    argv = [refs.get(a, a.replace("P/", f"{bad_policies}/")) for a in args]
    code = main([*argv, *(("--steps", "1", "--warmup", "1") if args[0] == "measure" else ())])
    out = capsys.readouterr()
    assert (code, out.err, out.out) == (2, line.replace("P/", f"{bad_policies}/") + "\n", "")
    assert list(tmp_path.iterdir()) == []  # no database, no file, no directory


def test_measure_on_cuda_without_cuda_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["measure", "-w", f"{TINY}:build", "--device", "cuda"]) == 2
    assert capsys.readouterr().err == (
        "autotune measure: error: device 'cuda' needs CUDA, but torch.cuda.is_available() is False on this machine.\n"
    )


def test_a_percentage_budget_is_of_the_default_configurations_predicted_peak(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from autotune import TrainConfig, load_workload
    from autotune.memory.predict import predict_memory

    workload = load_workload(f"{TINY}:build")
    default_peak = predict_memory(workload, TrainConfig(micro_batch_size=16)).total
    assert (
        main(["measure", "-w", f"{TINY}:build", "--memory-budget", "150%", "--steps", "1", "--warmup", "1", "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert (data["memory_budget"], data["status"]) == (int(default_peak * 1.5), "ok")  # micro-batch 8 fits


def test_every_argument_has_help() -> None:
    parser = _parser()
    parsers = {"autotune": parser}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            parsers.update({f"autotune {n}": p for n, p in action.choices.items()})
    missing = [
        f"{name} {'/'.join(a.option_strings) or a.dest}"
        for name, p in parsers.items()
        for a in p._actions
        if not isinstance(a, argparse._SubParsersAction) and not a.help
    ]
    assert missing == []
    assert len(parsers) == 13


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert (exit_info.value.code, capsys.readouterr().out) == (0, "autotune 0.1.0\n")


def test_version_reads_the_distribution_pyproject_names() -> None:
    # `autotune` on the public index is an unrelated project: the distribution has its own name, which
    # --version reads the metadata of and the `all` extra refers back to.
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [e for e in project["optional-dependencies"] if e not in ("all", "dev")]
    assert (DISTRIBUTION, project["name"]) == ("torch-autotune", "torch-autotune")
    assert project["optional-dependencies"]["all"] == [f"torch-autotune[{','.join(extras)}]"]
    assert project["scripts"] == {"autotune": "autotune.cli:main"}


def test_workloads_without_transformers_lists_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # In-process, to make `import transformers` fail; a subset of the built-ins keeps it fast.
    from autotune import cli, zoo
    from autotune.zoo.corpus import installed_version

    monkeypatch.setitem(sys.modules, "transformers", None)
    monkeypatch.setattr(zoo, "BUILTINS", {name: zoo.BUILTINS[name] for name in ("gpt-tiny", "hf-gpt2", "lstm-lm")})
    assert cli.main(["workloads"]) == 0
    rows = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if line.startswith("│")}
    assert list(rows) == ["gpt-tiny", "hf-gpt2", "lstm-lm"]
    assert "autotune" in rows["gpt-tiny"] and "1,263,616" in rows["gpt-tiny"]
    assert "GPT2LMHeadModel" in rows["hf-gpt2"] and "pip install 'torch-autotune[hf]'" in rows["hf-gpt2"]
    assert f"torch {installed_version('torch')} nn.LSTM" in rows["lstm-lm"] and "2,238,976" in rows["lstm-lm"]


def test_the_commands_that_train_as_they_tune_share_one_ranks_flag() -> None:
    parser = _parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices

    def ranks_flag(command: str) -> tuple[object, str | None]:
        (flag,) = [a for a in subcommands[command]._actions if a.dest == "ranks"]
        return flag.default, flag.help

    assert ranks_flag("train") == ranks_flag("tune")
    assert ranks_flag("train") == (
        1,
        "data-parallel DeepSpeed ranks (> 1: the ZeRO stage is a live knob; needs deepspeed; default 1)",
    )
    assert parser.parse_args(["train", "gpt-tiny", "--ranks", "2"]).ranks == 2


def test_predict_the_whole_model_in_bf16_from_the_flags() -> None:
    """``--precision bf16 --outer-precision bf16``: what ``bf16=True`` trains, predicted and checked
    by real steps of its kinds; the outer precision reaches the prediction (gpt-tiny's embeddings,
    head and loss in bf16 keep fewer bytes at the forward/backward peak)."""
    totals = {}
    for outer in ("fp32", "bf16"):
        proc = _run(
            "predict",
            "-w",
            "gpt-tiny",
            "--micro-batch",
            "16",
            "--precision",
            "bf16",
            "--outer-precision",
            outer,
            "--json",
        )
        assert proc.returncode == 0, proc.stderr
        data = json.loads(proc.stdout)
        assert (data["verified"], data["verification"]["device"], data["phase"]) == (True, "cpu", "forward/backward")
        totals[outer] = data["total"]
    assert totals["bf16"] < totals["fp32"]


def test_predict_without_a_micro_batch_is_the_workload_s_own_batch(capsys: pytest.CaptureFixture[str]) -> None:
    """The workload's batch of 32 in one micro-batch (its PyTorch default), or split over ``--accum``
    and ``--ranks``: the prediction is of the training the workload describes."""
    splits = {}
    for extra in ((), ("--accum", "4"), ("--ranks", "2", "--accum", "2")):
        assert main(["predict", f"{USER}:build", "--json", *extra]) == 0
        config = json.loads(capsys.readouterr().out)["config"]
        splits[extra] = (config["micro_batch_size"], config["grad_accum_steps"], config["ranks"])
    assert list(splits.values()) == [(32, 1, 1), (8, 4, 1), (8, 2, 2)]
    assert main(["predict", f"{USER}:build", "--accum", "3"]) == 2
    assert capsys.readouterr().err == (
        "autotune predict: error: the batch of workload 'my-net' (32) does not split evenly into 3 accumulation "
        "step(s) x 1 rank(s): give --micro-batch.\n"
    )


def test_json_output_is_stdout_s_alone_when_the_user_s_code_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A build that prints (nanoGPT prints its parameter count) and a forward that prints: under
    ``--json`` their lines go to stderr and stdout is the JSON, parseable as it is."""
    source = USER.read_text().replace(
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n",
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        print('forward')\n",
    )
    source = source.replace(
        "def build() -> Workload:\n", "def build() -> Workload:\n    print('number of parameters: 0.00M')\n"
    )
    path = tmp_path / "printing.py"
    path.write_text(source)
    for command in (["predict"], ["measure", "--steps", "1", "--warmup", "1"]):
        assert main([command[0], f"{path}:build", "--json", *command[1:]]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["workload"] == "my-net"
        assert "number of parameters: 0.00M\n" in err and "forward\n" in err
