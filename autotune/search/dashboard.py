"""optuna-dashboard: trial notes, the Pareto plot with baselines marked, best-config artifacts,
and serving the dashboard on a study storage.

optuna-dashboard and plotly are optional (the ``search`` extra): they load lazily, and a missing
one raises :class:`MissingDependencyError` naming what to install (``optuna.integration``'s
``try_import`` idea). Artifacts go to an ``optuna.artifacts.FileSystemArtifactStore`` directory
(default ``studies/artifacts``); the dashboard must be started with the same directory to show them.
"""

from __future__ import annotations

import importlib
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.dependencies import install_command
from autotune.errors import MissingDependencyError
from autotune.search.export import export_config
from autotune.search.results import StudySummary
from autotune.search.trial_record import TrialRecord

if TYPE_CHECKING:
    import optuna

__all__ = ["PARETO_PLOT_ID", "note_saver", "pareto_figure", "save_study_artifacts", "serve"]

PARETO_PLOT_ID = "autotune-pareto-front"
_ARTIFACTS_OF = "artifacts_of_trial"  # study user attribute: the trial whose config files are attached
_INSTALL = install_command("dashboard")


def _require(module: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(f"{module} is not installed: {_INSTALL} (or pip install {package})") from None


def note_saver() -> Callable[[optuna.Trial, str], None] | None:
    """``optuna_dashboard.save_note``, or None when optuna-dashboard is not installed (notes are
    a nicety: a study runs without them)."""
    try:
        dashboard = importlib.import_module("optuna_dashboard")
    except ImportError:
        return None
    save: Callable[[optuna.Trial, str], None] = dashboard.save_note
    return save


def _label(r: TrialRecord) -> str:
    c = r.config
    knobs = "" if c is None else f"micro {c.micro_batch_size} x accum {c.grad_accum_steps}"
    return f"trial {r.number}" + (f" ({r.baseline})" if r.baseline else "") + f"<br>{knobs}"


def pareto_figure(summary: StudySummary) -> Any:
    """Scatter of feasible trials (peak MiB vs objective), the front as a line, baselines and the
    recommended configuration marked."""
    go = _require("plotly.graph_objects", "plotly")
    fig = go.Figure()

    def points(rows: list[TrialRecord], name: str, marker: dict[str, Any], mode: str = "markers") -> None:
        fig.add_trace(
            go.Scatter(
                x=[r.peak_mib for r in rows],
                y=[r.objective for r in rows],
                mode=mode,
                name=name,
                text=[_label(r) for r in rows],
                marker=marker,
            )
        )

    points([r for r in summary.trials if r.feasible], "trials", {"color": "lightsteelblue", "size": 8})
    points(list(summary.front), "Pareto front", {"color": "royalblue", "size": 10}, mode="lines+markers")
    for name, r in summary.baselines.items():
        if r.feasible:
            points([r], f"baseline: {name}", {"symbol": "x", "size": 14})
    if summary.recommended is not None:
        label = "recommended (max per GiB)" if summary.objective == "per-gib" else "recommended (max samples/s)"
        points([summary.recommended], label, {"symbol": "star", "size": 18, "color": "gold"})
    fig.update_layout(
        title=f"{summary.name}: {summary.metric} vs peak memory (feasible trials)",
        xaxis_title="peak memory (MiB)",
        yaxis_title=f"{summary.metric} (samples/s)",
    )
    return fig


def save_study_artifacts(
    study: optuna.Study,
    summary: StudySummary,
    *,
    artifact_dir: str | Path,
    block_names: tuple[str, ...],
    workload: str,
    largest_parameter: int,
) -> list[str]:
    """Attach the Pareto plot and the recommended config (json, deepspeed, python) to ``study``.

    The plot is replaced on every call; the config files are uploaded only when the recommended
    trial changed since the last upload (a resumed study would otherwise pile up copies).
    Returns the new artifact ids."""
    import optuna.artifacts

    dashboard = _require("optuna_dashboard", "optuna-dashboard")
    dashboard.save_plotly_graph_object(study, pareto_figure(summary), graph_object_id=PARETO_PLOT_ID)
    best, config = summary.recommended, summary.recommended_config
    if best is None or config is None or study.user_attrs.get(_ARTIFACTS_OF) == best.number:
        return []
    Path(artifact_dir).mkdir(parents=True, exist_ok=True)
    store = optuna.artifacts.FileSystemArtifactStore(str(artifact_dir))
    ids = []
    with tempfile.TemporaryDirectory() as tmp:
        for fmt, suffix in (("json", "json"), ("deepspeed", "deepspeed.json"), ("python", "py")):
            path = Path(tmp) / f"{summary.name}-best-trial{best.number}.{suffix}"
            path.write_text(
                export_config(
                    config,  # compiled where the compile check recommends it
                    fmt,
                    block_names=block_names,
                    workload=workload,
                    largest_parameter=largest_parameter,
                    objective=summary.objective,
                )
            )
            ids.append(
                optuna.artifacts.upload_artifact(artifact_store=store, file_path=str(path), study_or_trial=study)
            )
    study.set_user_attr(_ARTIFACTS_OF, best.number)
    return ids


def serve(
    storage: str,
    *,
    artifact_dir: str | Path,
    host: str,
    port: int,
    announce: Callable[[str], None] | None = None,
) -> None:
    """Run optuna-dashboard on ``storage`` (blocking) with the artifact store attached.

    Args:
        storage: The study storage's URL.
        artifact_dir: The artifact store's folder (attached when it exists).
        host: The address the server listens on.
        port: Its port.
        announce: Called with the dashboard's URL once optuna-dashboard imported, just before the
            server starts (so nothing is announced for a server that cannot start).

    Raises:
        MissingDependencyError: optuna-dashboard is not installed.
    """
    import optuna.artifacts

    dashboard = _require("optuna_dashboard", "optuna-dashboard")
    store = optuna.artifacts.FileSystemArtifactStore(str(artifact_dir)) if Path(artifact_dir).is_dir() else None
    if announce is not None:
        announce(f"http://{host}:{port}")
    dashboard.run_server(storage, host=host, port=port, artifact_store=store)
