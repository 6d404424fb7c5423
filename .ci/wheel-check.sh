#!/usr/bin/env bash
# The package as a user gets it: build the sdist and wheel, install the wheel into a fresh venv
# outside the repository and run it from a directory outside the repository (`make wheel-check`).
#
# The fresh venv gets the wheel and its base dependencies only, as `pip install torch-autotune`
# gives them (torch pinned to the CPU wheel, the rest to requirements/constraints.txt): no
# DeepSpeed, transformers, Lightning or dashboard. The study, the policy and Adaptive must run;
# a command that needs a missing extra must say which in one line, exit 2, without a traceback.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
python=${VENV:-.venv}/bin/python
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "wheel-check: building the sdist and wheel"
# --no-isolation: the build backend (setuptools) is the venv's, nothing downloaded.
if ! "$python" -m build --no-isolation --outdir "$work/dist" . >"$work/build.log" 2>&1; then
    cat "$work/build.log"
    exit 1
fi
rm -rf build/lib build/bdist.* # setuptools' staging folders (build/ also holds make typecheck's copy)
wheel=$(ls "$work"/dist/*.whl)
sdist=$(ls "$work"/dist/*.tar.gz)
# The distribution is torch-autotune (`autotune` on PyPI is an unrelated project); its files name it
# with the dash normalized to an underscore. The import name and the command stay `autotune`.
pkg_version=$("$python" -c 'import autotune; print(autotune.__version__)')
for built in "$wheel" "$sdist"; do
    case "$(basename "$built")" in
        "torch_autotune-$pkg_version-py3-none-any.whl" | "torch_autotune-$pkg_version.tar.gz") ;;
        *) echo "wheel-check: built $(basename "$built"), expected torch_autotune-$pkg_version-py3-none-any.whl and .tar.gz" >&2; exit 1 ;;
    esac
done

# What the CLI and the library read at run time must be in both.
"$python" - "$wheel" "$sdist" <<'PY'
import sys, tarfile, zipfile
wheel, sdist = sys.argv[1:]
needed = ["policies/pretrained/policy.json", "policies/pretrained/policy.safetensors", "studies/gpt-tiny.toml",
          "studies/mlp-digits.toml", "envs/profiles/gpt-tiny.json"]
in_wheel = set(zipfile.ZipFile(wheel).namelist())
in_sdist = {n.split("/", 1)[1] for n in tarfile.open(sdist).getnames() if "/" in n}
missing = [f"wheel: autotune/{n}" for n in needed if f"autotune/{n}" not in in_wheel]
missing += [f"sdist: {n}" for n in needed if n not in in_sdist]
if missing:
    sys.exit("wheel-check: missing from the package: " + ", ".join(missing))
print(f"wheel-check: {len(in_wheel)} files in the wheel, {len(in_sdist)} in the sdist, the policy and specs in both")
PY

echo "wheel-check: installing the wheel and its base dependencies into a fresh venv"
"$python" -m venv --without-pip "$work/venv"
# pip's own warnings about the machine's local package folders are not the package's business.
"$python" -m pip --python "$work/venv/bin/python" install -q -c requirements/constraints.txt \
    torch==2.13.0 "$wheel" 2> >(grep -v "^WARNING: Location" >&2)
for extra in deepspeed transformers lightning optuna_dashboard; do
    if "$work/venv/bin/python" -c "import $extra" 2>/dev/null; then
        echo "wheel-check: the base install brought $extra, an extra" >&2
        exit 1
    fi
done

mkdir "$work/run"
cd "$work/run" # outside the repository: nothing may depend on its working directory
export PATH="$work/venv/bin:$PATH"
where=$(python -c 'import autotune; print(autotune.__file__)')
case "$where" in
    "$work/venv/"*) echo "wheel-check: autotune imported from $where" ;;
    *) echo "wheel-check: autotune imported from $where, not from the fresh venv" >&2; exit 1 ;;
esac
version=$(autotune --version)
expected="autotune $(python -c 'import autotune; print(autotune.__version__)')"
[ "$version" = "$expected" ] || { echo "wheel-check: --version says '$version', expected '$expected'" >&2; exit 1; }
echo "wheel-check: $version"
autotune workloads
# The repository's command, from here: the shipped spec (2 trials: the two baselines).
autotune study studies/mlp-digits.toml --trials 2 --no-policy-proposal --no-retime --no-progress
python - <<'PY'
import torch
from torch import nn

from autotune import Adaptive

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 64), *(nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(3)), nn.Linear(64, 4))
data = torch.utils.data.TensorDataset(torch.randn(128, 16), torch.randint(0, 4, (128,)))


def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
with Adaptive(model, opt, loss_fn, data, batch_size=16, policy="pretrained", decide_every=2) as tuner:
    losses = [tuner.step().loss for _ in range(6)]
print(f"wheel-check: Adaptive(policy='pretrained'): 6 steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
      f"{len(tuner.history)} decisions, last config {tuner.config.describe()}")
PY
# A command that needs a missing extra: one line naming the extra, exit 2, no traceback.
expect_missing() { # expect_missing EXTRA COMMAND...
    local extra=$1 status=0
    shift
    "$@" >/dev/null 2>"$work/err" || status=$?
    if [ "$status" != 2 ] || [ "$(wc -l <"$work/err")" != 1 ] || ! grep -qF "pip install 'torch-autotune[$extra]'" "$work/err"; then
        echo "wheel-check: '$*' without the $extra extra: exit $status, stderr:" >&2
        cat "$work/err" >&2
        exit 1
    fi
    echo "wheel-check: $* -> exit 2, $(cat "$work/err")"
}
expect_missing hf autotune measure -w hf-gpt2
expect_missing hf autotune study hf-llama --trials 1
expect_missing zero autotune study mlp-digits --trials 1 --ranks 2
expect_missing zero autotune measure -w mlp-digits --ranks 2
expect_missing dashboard autotune dashboard --storage sqlite:///studies/autotune.db
echo "wheel-check: ok"
