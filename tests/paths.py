"""Where the test workloads live: one place, so a test module never guesses a sibling's path."""

from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
#: A residual MLP that trains in milliseconds (``build``).
TINY_WORKLOAD = DATA / "tiny_workload.py"
#: Small workloads for DeepSpeed ranks (``build``, ``fails_on_rank_1``, ``hangs_on_rank_1``).
ZERO_WORKLOADS = DATA / "zero_workloads.py"
#: The README's example of a user's own workload file.
USER_WORKLOAD = DATA / "my_workload.py"
#: A workload whose loss is NaN at every step (``build``).
NAN_WORKLOAD = DATA / "nan_workload.py"
#: A user's model loaded in bf16: every parameter 16-bit (``build``).
HELD_BF16 = DATA / "held_bf16.py"
#: Variable-length token sequences with a padding collate (``build``: an IterableDataset;
#: ``build_map_style``: a list).
PADDED_WORKLOAD = DATA / "padded_workload.py"
#: A user's plain MLP: four repeated ``nn.Sequential(Linear, GELU, Linear)`` and a head in one
#: ``nn.Sequential``, batch 512 (``build``; user mistakes: ``build_empty``, ``build_small``,
#: ``build_float_targets``).
PLAIN_MLP = DATA / "plain_mlp.py"
#: A Hugging Face speech recognizer: ``Wav2Vec2ForCTC`` with LayerDrop on, CTC loss (``wav2vec2``),
#: as its benchmark builds it.
SPEECH_CTC = ROOT / "benchmarks" / "hf_families.py"


def benchmark_module(name: str) -> ModuleType:
    """``benchmarks/NAME.py`` loaded as a module (its directory on ``sys.path``: it imports
    ``results.py`` beside it)."""
    import importlib.util
    import sys

    if str(ROOT / "benchmarks") not in sys.path:
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
