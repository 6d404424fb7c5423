"""One prepared check of autotune on a CUDA GPU: six parts, each timed, guarded and reported.

Run on one H100/H200 (at most the parts' limits, 9 min 30 s, inside a 10-minute call; nothing
downloaded: every model is built from its config):

    python benchmarks/gpu_check.py --out build/gpu-check      (make gpu-check)

Parts (each in its own process with its own time limit, so a hang or a CUDA error in one is
reported, exception text included, and the others still run):

1. ``device``: name, capability, bf16/fp16/fp32 matmul TFLOP/s, and the machine probe
   (``probe_precisions``: whole training steps of the decoder in each precision against fp32).
2. ``realsize``: a transformers GPT-2 at GPT-2-small width, sequence 1024, batch 32, under a 20 GiB
   budget: a 12-trial study with each objective (``per-gib``, ``throughput``; each cut at 40 s;
   selective recompute allowed: ``space.selective``, off by default), its setup lines with their
   seconds and its seconds to the first trial; then the check's own plain PyTorch loop judges side by side the
   PyTorch default, the Hugging Face recipes (``bf16=True``, with ``gradient_checkpointing=True``,
   at smaller per-device batches with accumulation) and both picks, each applied by its exported
   snippet as a user would; last, compiled, the per-GiB pick (``compile="default"``, its snippet's
   ``model.compile()``) and HF ``bf16=True`` + ``gradient_checkpointing=True`` +
   ``torch_compile=True``, each only while the part has time left for a compile. Targets: the
   per-GiB pick >= 1.0x ``bf16`` + checkpointing per GiB, and compiled >= 1.0x the HF recipe
   compiled; the throughput pick >= 1.0x the fastest Hugging Face recipe within the budget. Each
   judged recipe's memory-model prediction (checked on the GPU) is reported against its allocated
   peak.
3. ``measure``: ``autotune.measure`` of a decoder LM, a vision model and an LSTM at sizes that
   fill a few GiB, under 4 configurations each: tracked peak, the allocator's peak allocated and
   reserved, its retries, and the memory model's prediction against both (and scaled by the
   reserved/allocated ratio of the model's first configuration).
4. ``adapt``: ``tune`` (the pretrained policy on the real loop) for 4 env steps and
   ``train --adapt`` for 60 steps of the decoder, through the functions those commands call.
5. ``deepspeed``: the decoder on one DeepSpeed rank (NCCL), ZeRO 0-3, predicted vs measured.
6. ``hf``: the Hugging Face ``Trainer`` with ``AutotuneCallback``, 20 steps.

Writes ``report.json`` and ``report.md`` to ``--out`` (and each part's JSON and log under
``parts/``), the report rewritten after each part; with ``--result docs/results/memory-model-gpu.json``
also the results page's record of the ``measure`` part (the memory model over each tracked peak;
``benchmarks/results.py``, then ``python benchmarks/render_results.py``). Without CUDA it says so
in one line and exits 0.
``--parts a,b`` runs some parts only. ``--dry-run`` runs the plan, the imports and the report
writer on fake results, on any machine, in seconds (tests/test_gpu_check.py,
which also runs one part's child process dry).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from autotune.config import Precision
    from autotune.measurement.objective import ObjectiveName

SCRIPT = Path(__file__).resolve()
DEVICE = "cuda"

# Sizes that fill a few GiB at the micro-batches below (fp32, Adam): the decoder ~60M parameters,
# the ViT 21M with 257 tokens per image, the LSTM 4 x 1024 over 256 tokens.
DECODER = {"layers": 8, "width": 768, "heads": 12, "seq_len": 256, "vocab": 8192, "num_samples": 2048, "batch_size": 16}
VISION = {
    "layers": 12,
    "width": 384,
    "heads": 6,
    "patch_size": 4,
    "image_size": 64,
    "num_samples": 2048,
    "batch_size": 64,
}
LSTM = {"layers": 4, "width": 1024, "seq_len": 256, "vocab": 8192, "num_samples": 2048, "batch_size": 32}
# Real size: a transformers GPT-2 at GPT-2-small width (124M parameters, the 50257-token
# vocabulary), sequence 1024, effective batch 32, under the budget of a 24 GB card.
GPT2_SMALL = {
    "layers": 12,
    "width": 768,
    "heads": 12,
    "seq_len": 1024,
    "vocab": 50256,
    "num_samples": 256,
    "batch_size": 32,
}
REAL_BUDGET = 20 * 2**30


def decoder_lm() -> Any:
    """The decoder LM (a workload reference: ``benchmarks/gpu_check.py:decoder_lm``)."""
    from autotune.zoo import CORPUS

    return CORPUS["hf-llama"].build(**DECODER)


def vision_model() -> Any:
    from autotune.zoo import CORPUS

    return CORPUS["hf-vit"].build(**VISION)


def lstm_lm() -> Any:
    from autotune.zoo import CORPUS

    return CORPUS["lstm-lm"].build(**LSTM)


def gpt2_small() -> Any:
    """The real-size decoder (a workload reference: ``benchmarks/gpu_check.py:gpt2_small``)."""
    from autotune.zoo import CORPUS

    return CORPUS["hf-gpt2"].build(**GPT2_SMALL)


def _ref(builder: Callable[[], Any]) -> str:
    return f"{SCRIPT}:{builder.__name__}"


# The measure part's models and micro-batches; its record's row label of each.
MEASURED: tuple[tuple[Callable[[], Any], int], ...] = ((decoder_lm, 16), (vision_model, 64), (lstm_lm, 32))
MEASURED_LABELS = {
    "decoder_lm": f"decoder (hf-llama, {DECODER['layers']} x {DECODER['width']})",
    "vision_model": f"ViT (hf-vit, {VISION['layers']} x {VISION['width']})",
    "lstm_lm": "LSTM (lstm-lm)",
}
# The record's column of each of _configs' configurations, in its order.
CONFIG_COLUMNS = ("fp32", "bf16", "fp32, every block recomputed", "fp16")


def _configs(batch: int) -> list[Any]:
    """The PyTorch default, bf16 everywhere, every block recomputed, fp16 with the loss scaler."""
    from autotune import TrainConfig

    return [
        TrainConfig(micro_batch_size=batch),
        TrainConfig(micro_batch_size=batch, precision="bf16"),
        TrainConfig(micro_batch_size=batch, checkpoint=True),
        TrainConfig(micro_batch_size=batch, precision="fp16"),
    ]


def _load(builder: Callable[[], Any]) -> Any:
    from autotune.resolve import load_workload

    return load_workload(_ref(builder))  # with its source set: study children and ranks rebuild it


# ---- the parts ----------------------------------------------------------------------------------------


def part_device() -> dict[str, Any]:
    import torch

    from autotune.measurement.probe import probe_precisions, reduced_precisions
    from autotune.train.local import Trainer

    props = torch.cuda.get_device_properties(0)
    tflops = {
        name: _matmul_tflops(dtype)
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16))
    }
    wl = _load(decoder_lm)
    base = _configs(8)[0]
    trainer = Trainer(wl, base, device=DEVICE)
    try:
        speeds = probe_precisions(
            trainer,
            base,
            precisions=reduced_precisions(DEVICE),
            recover=lambda: trainer.optimizer.zero_grad(set_to_none=True),
        )
    finally:
        trainer.close()
    rows = [
        {
            "precision": p,
            "matmul TFLOP/s": round(tflops[p], 1),
            "step speed vs fp32": round(s, 3),
            "failure": speeds.failures.get(p),
        }
        for p, s in speeds.speeds.items()
    ]
    summary = f"{props.name}, capability {props.major}.{props.minor}, {props.total_memory / 2**30:.1f} GiB"
    return {
        "summary": summary,
        "name": props.name,
        "capability": [props.major, props.minor],
        "total_memory": props.total_memory,
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "rows": rows,
    }


def _matmul_tflops(dtype: Any, n: int = 8192, iters: int = 20) -> float:
    import torch

    a, b = (torch.randn(n, n, device=DEVICE, dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return float(2 * n**3 * iters / (start.elapsed_time(end) / 1e3) / 1e12)


def part_measure() -> dict[str, Any]:
    from autotune import AutotuneError, measure
    from autotune.memory.predict import predict_memory, profile_memory

    rows: list[dict[str, Any]] = []
    for builder, batch in MEASURED:
        wl = _load(builder)
        # No CPU verification step (seconds at these sizes): each prediction is checked here, on the GPU.
        profile = profile_memory(wl, modes=("fp32", "bf16", "fp16"), checkpointed=True, verify=False)
        ratio = None
        for config in _configs(batch):
            try:
                m = measure(wl, config, steps=2, warmup=1, device=DEVICE)
            except AutotuneError as e:  # one configuration's failure is a row, not the part's end
                rows.append({"model": builder.__name__, "config": config.describe(), "status": f"error: {e}"})
                continue
            estimate = predict_memory(wl, config, profile=profile, device_type=DEVICE)
            a = m.allocator
            if ratio is None and a is not None:
                ratio = a.reserved_ratio  # the first real step's: what the gate would carry
            estimate = estimate.with_reserved_ratio(ratio)
            rows.append(
                {
                    "model": builder.__name__,
                    "config": config.describe(),
                    "status": m.status,
                    "tracked": m.peak_bytes,
                    "allocated": None if a is None else a.allocated_peak,
                    "reserved": None if a is None else a.reserved_peak,
                    "retries": None if a is None else a.alloc_retries,
                    "predicted": estimate.total,
                    "predicted reserved": estimate.reserved,
                    "vs allocated": _ratio(estimate.total, None if a is None else a.allocated_peak),
                    "vs reserved": _ratio(estimate.reserved, None if a is None else a.reserved_peak),
                    "samples/s": None if m.throughput is None else round(m.throughput, 1),
                }
            )
    ok = sum(r["status"] == "ok" for r in rows)
    return {"summary": f"{ok}/{len(rows)} configurations measured ok", "rows": rows}


def _ratio(predicted: int | None, measured: int | None) -> float | None:
    return None if predicted is None or not measured else round(predicted / measured, 4)


# ---- real size: studies judged by the check's own loop against the Hugging Face recipes ---------------


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """A configuration as the check's own loop runs it: ``bf16``, ``checkpointing`` and ``compiled``
    are what ``TrainingArguments`` would set (``bf16``, ``gradient_checkpointing``,
    ``torch_compile``); ``config`` an autotune pick, applied by the exported snippet's ``apply()``
    (what a user runs; a compiled pick's snippet compiles the model itself)."""

    name: str
    micro_batch: int
    accumulation: int
    bf16: bool = False
    checkpointing: bool = False
    compiled: bool = False  # HF's torch_compile=True: the model torch.compile-d, default mode
    config: Any = None  # a TrainConfig: the pick, applied by its exported snippet

    def as_config(self) -> Any:
        """The :class:`~autotune.TrainConfig` that trains as this recipe does (HF's ``bf16=True``
        autocasts the whole model; its gradient checkpointing recomputes every block)."""
        from autotune import TrainConfig

        if self.config is not None:
            return self.config
        precision: Precision = "bf16" if self.bf16 else "fp32"
        return TrainConfig(
            micro_batch_size=self.micro_batch,
            grad_accum_steps=self.accumulation,
            precision=precision,
            outer_precision=precision,
            checkpoint=self.checkpointing,
            compile="default" if self.compiled else "none",
        )


def hf_recipes(batch: int) -> list[Recipe]:
    """What a Hugging Face user sets without autotune: the PyTorch default, ``bf16=True``, ``bf16=True``
    with ``gradient_checkpointing=True``, and ``bf16=True`` at smaller per-device batches with
    accumulation (the user's own way to fit a budget)."""
    return [
        Recipe(name="pytorch-default", micro_batch=batch, accumulation=1),
        Recipe(name="hf bf16", micro_batch=batch, accumulation=1, bf16=True),
        Recipe(name="hf bf16+gc", micro_batch=batch, accumulation=1, bf16=True, checkpointing=True),
        Recipe(name=f"hf bf16 {batch // 2}x2", micro_batch=batch // 2, accumulation=2, bf16=True),
        Recipe(name=f"hf bf16 {batch // 4}x4", micro_batch=batch // 4, accumulation=4, bf16=True),
    ]


def hf_compiled_recipe(batch: int) -> Recipe:
    """HF ``bf16=True`` + ``gradient_checkpointing=True`` + ``torch_compile=True``: the recipe the
    per-GiB pick compiled stands beside."""
    return Recipe(
        name="hf bf16+gc+compile", micro_batch=batch, accumulation=1, bf16=True, checkpointing=True, compiled=True
    )


def pick_recipe(name: str, config: Any) -> Recipe:
    return Recipe(name=name, micro_batch=config.micro_batch_size, accumulation=config.grad_accum_steps, config=config)


def compiled_pick_recipe(pick: Recipe) -> Recipe:
    """``pick`` with ``compile="default"``: its exported snippet compiles the model after its wrappers."""

    config = dataclasses.replace(pick.config, compile="default")
    return dataclasses.replace(pick, name=f"{pick.name} compiled", config=config)


def judge(
    build: Callable[[], Any], recipes: list[Recipe], *, device: str, steps: int = 8, warmup: int = 2
) -> list[dict[str, Any]]:
    """Each recipe on a fresh model in a plain PyTorch loop (not autotune's): its samples/s (median of
    ``steps`` steps after ``warmup``) and its peak (the allocator's most allocated above what was
    allocated before the model was built, over one step; tracked bytes on the CPU)."""
    import statistics

    import torch

    from autotune.search.export import export_config

    rows = []
    for recipe in recipes:
        workload = build()
        names = workload.block_names()
        baseline = torch.cuda.memory_allocated() if device == "cuda" else 0
        model = workload.model.to(device).train()
        handle = None
        if recipe.config is not None:
            namespace: dict[str, Any] = {}
            snippet = export_config(
                recipe.config, "python", block_names=names, workload=workload.name, largest_parameter=0
            )
            exec(compile(snippet, f"<{recipe.name} snippet>", "exec"), namespace)  # what a user runs
            handle = namespace["apply"](model, device_type=device)
        if recipe.checkpointing:  # transformers 5.2x renamed it; the GPU machine may have either
            enable = getattr(model, "activation_checkpointing_enable", None)
            if enable is not None:
                enable({"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if recipe.compiled:  # as the Trainer's torch_compile=True: after checkpointing, default mode
            model.compile()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        generator = torch.Generator().manual_seed(0)

        step = functools.partial(_train_step, model, optimizer, recipe, device=device, generator=generator)
        for _ in range(warmup):
            step()
        peak: int | None = None  # the CPU stand-in (the check's test) times only
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            step()
            peak = torch.cuda.max_memory_allocated() - baseline
        seconds = statistics.median(step() for _ in range(steps))
        samples = recipe.micro_batch * recipe.accumulation / seconds
        rows.append(
            {
                "recipe": recipe.name,
                "config": None if recipe.config is None else recipe.config.describe(),
                "compiled": recipe.compiled or (recipe.config is not None and recipe.config.compile != "none"),
                "split": f"{recipe.micro_batch}x{recipe.accumulation}",
                "samples/s": round(samples, 2),
                "peak": peak,
                "per GiB": round(samples / (peak / 2**30), 3) if peak else None,
            }
        )
        if handle is not None:
            handle.remove()
        del step, model, optimizer, workload
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def _train_step(model: Any, optimizer: Any, recipe: Recipe, *, device: str, generator: Any) -> float:
    """One optimizer step of a causal LM on random tokens, as a plain loop runs it; its seconds."""
    import torch

    vocab, seq = model.config.vocab_size, model.config.n_positions
    start = time.perf_counter()
    for _ in range(recipe.accumulation):
        ids = torch.randint(0, vocab, (recipe.micro_batch, seq), generator=generator).to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=recipe.bf16):
            loss = model(input_ids=ids, labels=ids).loss / recipe.accumulation
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if device == "cuda":
        torch.cuda.synchronize()  # a sync point: the step's kernels are done when the clock stops
    return time.perf_counter() - start


def judge_in_time(
    build: Callable[[], Any],
    recipes: list[Recipe],
    *,
    device: str,
    deadline: float,
    row_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> list[dict[str, Any]]:
    """:func:`judge` of each recipe that has ``row_s`` seconds left before ``deadline`` (on
    ``clock``); a recipe without them, or whose run raises (a compile that fails), is a row saying
    so: the part reports what it judged instead of being killed at its limit."""
    rows = []
    for recipe in recipes:
        left = deadline - clock()
        if left < row_s:
            rows.append({"recipe": recipe.name, "status": f"skipped: {left:.0f} s left, a row needs {row_s:.0f} s"})
            continue
        try:
            rows += judge(build, [recipe], device=device)
        except Exception as e:  # a row's failure (a Dynamo error) is its result; the judged rows stand
            rows.append({"recipe": recipe.name, "status": f"error: {type(e).__name__}: {e}"})
    return rows


def _study_pick(out: Path, objective: ObjectiveName, timeout: float) -> dict[str, Any]:
    """A 12-trial study of the real-size decoder under the budget, with ``objective``; its setup lines
    with the seconds since the study began, and its pick."""
    from autotune.policies.transfer import propose

    from autotune.search import MeasureSpec, RunOptions, SpaceSpec, StudySpec, summarize
    from autotune.search.opening import open_study
    from autotune.search.study import StudyObserver, measuring_ahead, prepare, run_study
    from autotune.units import MemoryBudget

    start = time.perf_counter()
    lines: list[str] = []
    first_trial: list[float] = []

    class Observer(StudyObserver):
        def note(self, message: str) -> None:
            lines.append(f"{time.perf_counter() - start:6.1f} s  {message}")

        def trial_finished(self, study: Any, trial: Any) -> None:
            if not first_trial:
                first_trial.append(round(time.perf_counter() - start, 1))

    spec = StudySpec(
        workload=_ref(gpt2_small),
        name=f"realsize-{objective}",
        trials=12,
        timeout=timeout,
        memory_budget=MemoryBudget(bytes=REAL_BUDGET),
        objective=objective,
        space=SpaceSpec(precisions=("fp32", "bf16"), selective=True),  # issue 42's row: the level allowed
        measure=MeasureSpec(steps=3, warmup=1, trial_timeout=30.0),
    )
    options = RunOptions(
        storage=f"sqlite:///{out / f'realsize-{objective}.db'}",
        cache=None,
        artifact_dir=out / "artifacts",
        device=DEVICE,
        dashboard=False,
        propose=propose,
        # Not the study's own eager/compiled timing (a compile, ~30-60 s on an H200, per study):
        # the check's own loop judges the per-GiB pick compiled, once, beside HF's compiled recipe.
        compile_check=False,
    )
    # As `autotune study` does: the measuring child builds the model while this process loads it.
    with measuring_ahead(spec, options) as measurer:
        prepared = prepare(spec)
        study = open_study(prepared, options)
        run_study(prepared, study, options, Observer(), measurer=measurer)
    summary = summarize(study)
    best = summary.recommended
    return {
        "objective": objective,
        "seconds": round(time.perf_counter() - start, 1),
        "cut_s": timeout,
        "seconds_to_first_trial": first_trial[0] if first_trial else None,
        "states": summary.states,
        "setup": lines,
        "pick": None if best is None or best.config is None else best.config,
        # The study's own account of its pick against the recipes (side by side where it re-timed
        # them with its finalists), beside the check's independent judgement of it.
        "versus": {
            i.baseline: {"per_gib": i.per_gib, "throughput": i.throughput, "side_by_side": i.side_by_side}
            for i in summary.improvements
        },
    }


def predicted_peaks(build: Callable[[], Any], recipes: list[Recipe], *, device: str) -> dict[str, dict[str, Any]]:
    """The memory model's peak of each recipe on ``device`` (one fake-tensor profile of every mode
    they need, checked by real steps on ``device``), and whether it is verified there."""
    from autotune.memory.model import plan_of
    from autotune.memory.predict import predict_memory, profile_memory

    workload = build()
    n = len(workload.block_names())
    configs = {r.name: r.as_config() for r in recipes}
    modes = sorted({m for c in configs.values() for m in plan_of(c, num_blocks=n, device_type=device).modes})
    profile = profile_memory(workload, modes=modes, checkpointed=True, device=device)
    out = {}
    for name, config in configs.items():
        e = predict_memory(workload, config, profile=profile, device_type=device)
        out[name] = {"predicted": e.total, "verified": e.verified}
    return out


# The real-size part's time (its Part's limit): two studies each cut at study_seconds(limit) (plus
# their setup, 25-40 s on the H200, the policy's proposal, 25-32 s, and the trial under way at the
# cut, at most its 30 s trial timeout), seven eager recipes judged and predicted, then the two
# compiled rows, each judged only while COMPILED_ROW_S are left before the limit less REAL_MARGIN_S
# (writing the result): a compile on an H200 costs ~30-60 s per model, plus the row's ten steps and
# the model's build. 2026-11-30, H200: 231 s with the studies cut at 40 s and no compiled row, 281 s
# with both compiled rows.
REAL_LIMIT_S = 225
REAL_STUDY_S = 40.0  # the least a study gets
REAL_REST_S = 400.0  # what the rest of the part takes, both studies' setups and tails included
COMPILED_ROW_S = 75.0
REAL_MARGIN_S = 5.0
PICK_PER_GIB = "study pick (per-gib, selective allowed)"
PICK_THROUGHPUT = "study pick (throughput, selective allowed)"


def study_seconds(limit_s: float) -> float:
    """Where each real-size study is cut: what a longer limit leaves beyond :data:`REAL_REST_S`,
    shared by the two studies, and never under :data:`REAL_STUDY_S` (``--limit realsize=600``,
    the part alone in a call, gives each 100 s)."""
    return max(REAL_STUDY_S, (limit_s - REAL_REST_S) / 2)


def part_realsize(out: Path, limit_s: float = REAL_LIMIT_S) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s - REAL_MARGIN_S
    objectives: tuple[ObjectiveName, ...] = ("per-gib", "throughput")
    cut = study_seconds(limit_s)
    studies = [_study_pick(out, objective, timeout=cut) for objective in objectives]
    recipes = hf_recipes(GPT2_SMALL["batch_size"])
    picks = {PICK_PER_GIB: studies[0]["pick"], PICK_THROUGHPUT: studies[1]["pick"]}
    recipes += [pick_recipe(name, pick) for name, pick in picks.items() if pick is not None]
    compiled = [hf_compiled_recipe(GPT2_SMALL["batch_size"])]
    if studies[0]["pick"] is not None:
        compiled.insert(0, compiled_pick_recipe(pick_recipe(PICK_PER_GIB, studies[0]["pick"])))
    rows = judge(gpt2_small, recipes, device=DEVICE)
    # The memory model against the real allocated peaks (per kind: fp32, bf16, recomputed, the
    # picks; a compiled row is predicted as eager: the model has no compiled peak on the GPU).
    try:
        predictions = predicted_peaks(gpt2_small, recipes + compiled, device=DEVICE)
    except Exception as e:  # the judged figures stand without it; the report says why
        predictions = {r.name: {"error": f"{type(e).__name__}: {e}"} for r in recipes + compiled}
    rows += judge_in_time(gpt2_small, compiled, device=DEVICE, deadline=deadline, row_s=COMPILED_ROW_S)
    for row in rows:
        p = predictions[row["recipe"]]
        row.update(p)
        if "predicted" in p and row.get("peak"):
            row["predicted/measured"] = round(p["predicted"] / row["peak"], 3)
    result = realsize_verdicts(rows, studies)
    result["summary"] = (
        f"per-GiB pick {result['per_gib_pick_vs_hf_gc']}x HF bf16+gc per GiB, compiled "
        f"{result['per_gib_pick_compiled_vs_hf_gc_compiled']}x HF bf16+gc+compile; throughput pick "
        f"{result['throughput_pick_vs_fastest_hf']}x {result['fastest_hf_within_budget']}; studies "
        + ", ".join(f"{s['objective']} {s['seconds']} s (first trial {s['seconds_to_first_trial']} s)" for s in studies)
    )
    return result


def realsize_verdicts(rows: list[dict[str, Any]], studies: list[dict[str, Any]]) -> dict[str, Any]:
    """The real-size part's targets from its judged rows: each pick against its Hugging Face recipe
    (None where a row is missing, skipped or failed)."""
    by_name = {r["recipe"]: r for r in rows if r.get("samples/s") is not None}
    fits = [r for r in by_name.values() if r["config"] is None and not r["compiled"] and _within_budget(r)]
    fastest_hf = max(fits, key=lambda r: r["samples/s"], default=None)
    throughput = by_name.get(PICK_THROUGHPUT)
    return {
        "studies": [{**s, "pick": None if s["pick"] is None else s["pick"].describe()} for s in studies],
        "judged": rows,
        "per_gib_pick_vs_hf_gc": _per_gib_ratio(by_name.get(PICK_PER_GIB), by_name.get("hf bf16+gc")),
        "per_gib_pick_compiled_vs_hf_gc_compiled": _per_gib_ratio(
            by_name.get(f"{PICK_PER_GIB} compiled"), by_name.get("hf bf16+gc+compile")
        ),
        "fastest_hf_within_budget": None if fastest_hf is None else fastest_hf["recipe"],
        "throughput_pick_vs_fastest_hf": None
        if throughput is None or fastest_hf is None or not _within_budget(throughput)
        else round(throughput["samples/s"] / fastest_hf["samples/s"], 3),
    }


def _within_budget(row: dict[str, Any]) -> bool:
    """Whether a judged row's peak is known (a GPU's allocator; the CPU stand-in has none) and fits."""
    return row["peak"] is not None and row["peak"] <= REAL_BUDGET


def _per_gib_ratio(pick: dict[str, Any] | None, hf: dict[str, Any] | None) -> float | None:
    if pick is None or hf is None or not pick["per GiB"] or not hf["per GiB"]:
        return None
    return round(float(pick["per GiB"]) / float(hf["per GiB"]), 3)


def part_adapt() -> dict[str, Any]:
    from autotune.envs.training import TrainingEnv
    from autotune.policies.episode import run_episode
    from autotune.policies.ppo import PRETRAINED_DIR, load_policy

    from autotune.adapt.adaptive import Adaptive
    from autotune.units import parse_memory_budget

    # autotune tune WORKLOAD --steps 4 --fine-tune-seconds 0
    policy = load_policy(PRETRAINED_DIR)
    env = TrainingEnv(
        workloads=[_ref(decoder_lm)],
        memory_budget=parse_memory_budget("75%"),
        steps_per_action=4,
        horizon=4,
        device=DEVICE,
    )
    try:
        policy.check_action_space(env.action_space)
        episode = run_episode(env, policy, workload="decoder_lm", seed=0, steps=4)
    finally:
        env.close()
    # autotune train WORKLOAD --steps 60 --adapt (the model on the GPU first: Adaptive trains it in place)
    wl = _load(decoder_lm)
    model = wl.model.to(DEVICE)
    tuner = Adaptive(
        model,
        wl.make_optimizer(model.parameters()),
        wl.loss_fn,
        wl.dataset,
        batch_size=wl.batch_size,
        policy="pretrained",
        decide_every=10,
        blocks=wl.blocks,
        name=wl.name,
        track_memory="all",
    )
    try:
        steps = [tuner.step() for _ in range(60)]
    finally:
        tuner.close()
    rows = [
        {
            "step": c.step,
            "verdict": "applied" if c.applied else ("reverted" if c.reverted else "refused"),
            "config": c.after.describe(),
            "why": f"{c.source}: {c.reason}",
        }
        for c in tuner.history
    ]
    best = tuner.best
    return {
        "summary": f"tune return {episode.total_reward:+.3f}; train --adapt: {len(tuner.history)} changes, "
        f"final {tuner.config.describe()}",
        "tune_final": episode.final_config.to_dict(),
        "tune_budget_bytes": episode.budget_bytes,
        "adapt_budget_bytes": tuner.budget_bytes,
        "reserved_ratio": tuner.gate.reserved_ratio,
        "adapt_final_loss": steps[-1].loss,
        "adapt_best": None if best is None else best.config.describe(),
        "rows": rows,
    }


def part_deepspeed() -> dict[str, Any]:
    from autotune import measure, predict_memory
    from autotune.procs.multirank import measure_ranks

    wl = _load(decoder_lm)
    configs = [dataclasses.replace(_configs(8)[1], zero_stage=stage) for stage in range(4)]
    # ZeRO 0 at one rank is the local runner in autotune (nothing to partition); stages 1-3 share
    # one rank session (one torchrun start, one NCCL init) instead of one each.
    runs = [
        measure(wl, configs[0], steps=2, warmup=1, device=DEVICE),
        *measure_ranks(wl, configs[1:], steps=2, warmup=1, device=DEVICE),
    ]
    rows = []
    for config, m in zip(configs, runs, strict=True):
        predicted = predict_memory(wl, config, device_type=DEVICE, verify=False)
        rows.append(
            {
                "stage": config.zero_stage,
                "runner": "deepspeed" if config.on_deepspeed else "local",
                "status": m.status,
                "predicted": predicted.total,
                "tracked": m.peak_bytes,
                "reserved": m.reserved_bytes,
                "vs tracked": _ratio(predicted.total, m.peak_bytes),
                "reason": m.reason,
            }
        )
    ok = sum(r["status"] == "ok" for r in rows)
    return {"summary": f"{ok}/4 stages measured ok", "rows": rows}


def part_hf(out: Path) -> dict[str, Any]:
    import torch
    import transformers

    from autotune.integrations.hf import AutotuneCallback

    wl = _load(decoder_lm)
    callback = AutotuneCallback(decide_every=5)
    args = transformers.TrainingArguments(
        output_dir=str(out / "hf"),
        per_device_train_batch_size=8,
        max_steps=20,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    torch.cuda.reset_peak_memory_stats()
    result = transformers.Trainer(model=wl.model, args=args, train_dataset=wl.dataset, callbacks=[callback]).train()
    rows = [
        {"step": c.step, "applied": c.applied, "config": c.after.describe(), "why": f"{c.source}: {c.reason}"}
        for c in callback.history
    ]
    return {
        "summary": f"20 steps, loss {result.training_loss:.4f}, {len(rows)} changes",
        "allocated_peak": torch.cuda.max_memory_allocated(),
        "reserved_peak": torch.cuda.max_memory_reserved(),
        "rows": rows,
    }


# ---- plan, guard, report --------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Part:
    """One part of the check: what it runs (given the output folder and its time limit), its time
    limit, and what it imports (the dry run's check)."""

    name: str
    title: str
    limit_s: int
    run: Callable[[Path, int], dict[str, Any]]
    imports: tuple[str, ...]


# Limits (570 s together) from the H200 runs: device 17-20 s, measure 70-87, adapt 70-99, DeepSpeed
# 49-53 (2026-11-27), Hugging Face 42.5 (2026-11-30; 31-32 before the callback's start plan); the
# real-size part gets what is left. It took 231 s without its compiled rows and 281 s with them
# (2026-11-30): run alone with `--limit realsize=600` for those (and 100 s per study: study_seconds).
PLAN = (
    Part(
        name="device",
        title="device and machine probe",
        limit_s=25,
        run=lambda out, limit_s: part_device(),
        imports=("autotune.measurement.probe", "autotune.train.local"),
    ),
    Part(
        name="realsize",
        title="GPT-2 small, seq 1024: two 12-trial studies vs the HF recipes, eager and compiled",
        limit_s=REAL_LIMIT_S,
        run=part_realsize,
        imports=("autotune.search", "autotune.search.study", "autotune.search.export", "transformers"),
    ),
    Part(
        name="measure",
        title="measure vs the memory model",
        limit_s=95,
        run=lambda out, limit_s: part_measure(),
        imports=("autotune.measurement", "autotune.memory.predict"),
    ),
    Part(
        name="adapt",
        title="tune 4 steps, train --adapt 60 steps",
        limit_s=110,
        run=lambda out, limit_s: part_adapt(),
        imports=(
            "autotune.adapt.adaptive",
            "autotune.envs.training",
            "autotune.policies.episode",
            "autotune.policies.ppo",
        ),
    ),
    Part(
        name="deepspeed",
        title="DeepSpeed, one rank, ZeRO 0-3",
        limit_s=60,
        run=lambda out, limit_s: part_deepspeed(),
        imports=("autotune.procs.multirank", "deepspeed"),
    ),
    Part(
        name="hf",
        title="Hugging Face Trainer callback, 20 steps",
        limit_s=55,
        run=lambda out, limit_s: part_hf(out),
        imports=("autotune.integrations.hf", "transformers"),
    ),
)


def run_part(part: Part, out: Path, *, dry_run: bool = False) -> dict[str, Any]:
    """Run ``part`` in a child process of its own session, killed with everything it started
    (study children, torchrun ranks) when its time limit passes; its result or why it has none."""
    result_file = out / "parts" / f"{part.name}.json"
    result_file.unlink(missing_ok=True)
    start = time.monotonic()
    command = [sys.executable, str(SCRIPT), "--out", str(out), "--part", part.name, *(["--dry-run"] * dry_run)]
    command += ["--limit", f"{part.name}={part.limit_s}"]  # the child's deadline is the limit it is killed at
    with (out / "parts" / f"{part.name}.log").open("w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=part.limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
    seconds = round(time.monotonic() - start, 1)
    if result_file.exists():
        entry: dict[str, Any] = json.loads(result_file.read_text())
        return entry | {"seconds": seconds}
    tail = (out / "parts" / f"{part.name}.log").read_text().splitlines()[-5:]
    error = f"timed out after {part.limit_s} s" if rc is None else f"exited with code {rc} and no result"
    return _entry(part, seconds=seconds, error=f"{error}: {' | '.join(tail)}")


def _entry(
    part: Part, *, seconds: float, result: dict[str, Any] | None = None, error: str | None = None
) -> dict[str, Any]:
    return {
        "name": part.name,
        "title": part.title,
        "limit_s": part.limit_s,
        "seconds": seconds,
        "ok": error is None,
        "error": error,
        "result": result,
    }


def guarded(part: Part, out: Path, run: Callable[[Path, int], dict[str, Any]]) -> dict[str, Any]:
    """``run(out)`` timed; any exception becomes the entry's ``error`` (type, message, last frame)."""
    start = time.monotonic()
    try:
        result, error = run(out, part.limit_s), None
    except BaseException as e:  # a check reports every failure, KeyboardInterrupt aside
        if isinstance(e, KeyboardInterrupt):
            raise
        frame = traceback.extract_tb(e.__traceback__)[-1:] or None
        where = f" (at {Path(frame[0].filename).name}:{frame[0].lineno})" if frame else ""
        result, error = None, f"{type(e).__name__}: {e}{where}"
        # The whole traceback in the part's log: the last frame alone (torch's F.embedding) did not
        # say which of autotune's callers fed it a host tensor on the first GPU run.
        traceback.print_exc()
    return _entry(part, seconds=round(time.monotonic() - start, 1), result=result, error=error)


def fake_result(part: Part) -> dict[str, Any]:
    """What the dry run reports for ``part``: the shape of a real result, with made-up figures."""
    return {
        "summary": f"dry run of {part.name}",
        "rows": [
            {
                "config": "micro x acc x ranks 16x1x1 | fp32 | ckpt none | ZeRO 0",
                "allocated": 4_700_160,
                "reserved": 6_291_456,
                "retries": 0,
            }
        ],
    }


def write_report(out: Path, machine: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    report = {"machine": machine, "parts": entries}
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    from results import markdown_table

    parts = [
        (
            e["title"],
            "ok" if e["ok"] else "FAILED",
            f"{e['seconds']} ({e['limit_s']})",
            _cell(e["result"]["summary"] if e["ok"] else e["error"]),
        )
        for e in entries
    ]
    lines = [
        f"# autotune GPU check: {machine.get('device', '?')}",
        "",
        *markdown_table(("part", "status", "seconds (limit)", "result"), parts),
    ]
    for e in entries:
        rows = (e["result"] or {}).get("rows") or []
        if rows:
            columns = list(dict.fromkeys(k for row in rows for k in row))
            lines += ["", f"## {e['title']}", ""]
            lines += markdown_table(columns, [[_cell(row.get(c)) for c in columns] for row in rows])
    (out / "report.md").write_text("\n".join(lines) + "\n")


def _cell(value: object) -> str:
    return "-" if value is None else str(value).replace("\n", " ")


def _machine(dry_run: bool) -> dict[str, Any]:
    import torch

    name = "dry run" if dry_run else torch.cuda.get_device_name(0)
    capability = None if dry_run else ".".join(map(str, torch.cuda.get_device_capability(0)))
    return {
        "device": name,
        "capability": capability,
        "date": time.strftime("%Y-%m-%d"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": _version("transformers"),
        "deepspeed": _version("deepspeed"),
        "dry_run": dry_run,
    }


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def memory_record_rows(rows: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """The measure part's rows as the record's: per model, the memory model's prediction over the
    tracked peak of each configuration (``-`` where it has no measurement)."""
    out = []
    for builder, batch in MEASURED:
        mine = {r["config"]: r for r in rows if r.get("model") == builder.__name__}
        if not mine:
            continue
        cells = []
        for config in _configs(batch):
            r = mine.get(config.describe(), {})
            ok = r.get("status") == "ok" and r.get("predicted") and r.get("tracked")
            cells.append(f"{r['predicted'] / r['tracked']:.3f}" if ok else "-")
        out.append((MEASURED_LABELS[builder.__name__], *cells))
    return out


def _record_machine(machine: dict[str, Any], packages: tuple[str, ...]) -> tuple[str, str]:
    """A record's machine and capability fields for a GPU run: the device, torch and ``packages``."""
    versions = [f"{p} {machine[p]}" for p in packages if machine.get(p)]
    line = "; ".join([f"One {machine['device']}", ", ".join([f"torch {machine['torch']}", *versions])])
    return line, f"GPU: {machine['device']} (capability {machine['capability']})"


def write_memory_record(path: Path, machine: dict[str, Any], rows: list[dict[str, Any]], command: str) -> None:
    """The results page's record of the measure part (``benchmarks/results.py``)."""
    from results import write_result

    (_, decoder_batch), (_, vision_batch), (_, lstm_batch) = MEASURED
    line, capability = _record_machine(machine, ("transformers", "deepspeed"))
    write_result(
        path,
        title="The memory model on a GPU",
        claim=(
            "The memory model (profiled on the host, under fake tensors) over the tracked peak of the real CUDA step, "
            f"micro-batch {decoder_batch} (decoder), {vision_batch} (ViT, {VISION['image_size']} px images, "
            f"patch {VISION['patch_size']}) and {lstm_batch} (LSTM {LSTM['layers']} x {LSTM['width']}, "
            f"{LSTM['seq_len']} tokens): 1.000 is exact, under 1 a prediction below the real step."
        ),
        machine=line,
        capability=capability,
        date=machine["date"],
        command=command,
        columns=("model", *CONFIG_COLUMNS),
        rows=memory_record_rows(rows),
        note=(
            "Where a CUDA kernel saves what its CPU counterpart saves the prediction is exact; the decoder's fp32 "
            "step and cuDNN's LSTM workspaces differ, and the budget gate learns that error from the first real "
            "steps (`BudgetGate.device_error`). Every GPU run: [benchmark "
            "log](benchmark-log.md#the-third-gpu-run-one-h200-2026-11-27-later)."
        ),
    )


def realsize_record_rows(result: dict[str, Any]) -> list[tuple[str, ...]]:
    """The real-size part's judged rows as the record's: each recipe's split, samples/s, peak,
    samples/s per GiB and the memory model's prediction over that peak (``-`` where it has none)."""
    rows: list[tuple[str, ...]] = []
    for r in result["judged"]:
        if r.get("samples/s") is None:
            continue
        peak = r.get("peak")
        rows.append(
            (
                r["recipe"] if r["config"] is None else f"{r['recipe']}: {r['config']}",
                r["split"],
                f"{r['samples/s']:.1f}",
                "-" if not peak else f"{peak / 2**30:.1f}",
                "-" if r.get("per GiB") is None else f"{r['per GiB']:.2f}",
                "-" if r.get("predicted/measured") is None else f"{r['predicted/measured']:.3f}",
            )
        )
    return rows


def write_realsize_record(
    path: Path, machine: dict[str, Any], result: dict[str, Any], command: str, commit: str | None = None
) -> None:
    """The results page's record of the real-size part (``benchmarks/results.py``)."""
    from results import write_result

    studies = "; ".join(
        f"{s['objective']}: {s['states'].get('COMPLETE', 0)} measured, first at {s['seconds_to_first_trial']} s, "
        f"pick {s['pick']}"
        for s in result["studies"]
    )
    cut = max((s.get("cut_s", REAL_STUDY_S) for s in result["studies"]), default=REAL_STUDY_S)
    line, capability = _record_machine(machine, ("transformers",))
    write_result(
        path,
        title="GPT-2 small on one GPU: the studies' picks against the Hugging Face recipes",
        claim=(
            f"A transformers GPT-2 at GPT-2-small width ({GPT2_SMALL['layers']} x {GPT2_SMALL['width']}, vocabulary "
            f"{GPT2_SMALL['vocab'] + 1}), sequence {GPT2_SMALL['seq_len']}, effective batch "
            f"{GPT2_SMALL['batch_size']}, budget {REAL_BUDGET // 2**30} GiB: each recipe and each study's pick "
            "(applied by its exported snippet) trained by the check's own plain PyTorch loop, one after another in "
            "one process (median of 8 steps; peak = the allocator's most allocated above the model-less baseline "
            f"over one step). Per-GiB pick over HF bf16 + gradient checkpointing per GiB: "
            f"{result['per_gib_pick_vs_hf_gc']}x; throughput pick over the fastest HF recipe within the budget "
            f"({result['fastest_hf_within_budget']}): {result['throughput_pick_vs_fastest_hf']}x."
        ),
        machine=line,
        capability=capability,
        date=machine["date"],
        command=command,
        columns=("recipe", "split", "samples/s", "peak GiB", "samples/s per GiB", "predicted / peak"),
        rows=realsize_record_rows(result),
        note=(
            f"Each study was cut at {cut:.0f} s ({studies}): a first look at real size, not a finished "
            "search. Every GPU run: [benchmark log](benchmark-log.md#gpt-2-small-on-one-h200-2026-11-30)."
        ),
        commit=commit,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for report.json, report.md and parts/")
    parser.add_argument("--dry-run", action="store_true", help="plan, imports and report on fake results")
    parser.add_argument(
        "--parts", default=",".join(p.name for p in PLAN), help="comma-separated parts to run (default: all)"
    )
    parser.add_argument("--part", choices=[p.name for p in PLAN], help=argparse.SUPPRESS)  # one part, in a child
    parser.add_argument(
        "--limit",
        action="append",
        default=[],
        metavar="PART=SECONDS",
        help="another time limit for a part (repeatable), e.g. realsize=420 when it runs alone",
    )
    parser.add_argument(
        "--result", type=Path, help="also write the measure part's record of the memory model here (docs/results/)"
    )
    parser.add_argument(
        "--realsize-result", type=Path, help="also write the real-size part's record here (docs/results/)"
    )
    parser.add_argument(
        "--from-report",
        type=Path,
        metavar="REPORT",
        help="write --realsize-result from an earlier run's report.json (the GPU's) instead of running; "
        "with --commit, the commit that run measured",
    )
    parser.add_argument("--commit", help="with --from-report: the commit the report's run measured")
    args = parser.parse_args(argv)
    if args.from_report is not None:
        if args.realsize_result is None or args.commit is None:
            parser.error("--from-report writes --realsize-result, with the --commit its run measured")
        return record_from_report(args.from_report, args.realsize_result, args.commit)
    if args.result is not None and "measure" not in args.parts.split(","):
        parser.error(f"--result writes the measure part's record, but --parts is {args.parts!r}")
    if args.result is not None and args.dry_run:
        parser.error("--result writes measured figures: it cannot go with --dry-run")
    import torch

    try:
        plan = with_limits(PLAN, args.limit)
    except ValueError as e:
        parser.error(str(e))
    if not args.dry_run and not torch.cuda.is_available():
        print("gpu_check: no CUDA device on this machine: nothing to check.")
        return 0
    (args.out / "parts").mkdir(parents=True, exist_ok=True)
    if args.part is not None:  # in the child run_part started
        part = next(p for p in plan if p.name == args.part)
        run = (lambda out, limit_s: _imported(part) | fake_result(part)) if args.dry_run else part.run
        entry = guarded(part, args.out, run)
        (args.out / "parts" / f"{part.name}.json").write_text(json.dumps(entry, indent=2, default=str) + "\n")
        return 0
    if args.dry_run:
        _check_sizes()
    chosen = args.parts.split(",")
    unknown = sorted(set(chosen) - {p.name for p in plan})
    if unknown:
        parser.error(f"unknown part {unknown[0]!r} (parts: {', '.join(p.name for p in PLAN)})")
    entries = []
    for part in (p for p in plan if p.name in chosen):
        if args.dry_run:  # in this process: seconds, not a Python start per part
            entry = guarded(part, args.out, lambda out, limit_s, p=part: _imported(p) | fake_result(p))  # type: ignore[misc]
        else:
            entry = run_part(part, args.out)
        entries.append(entry)
        print(f"{part.name}: {'ok' if entry['ok'] else 'FAILED'} in {entry['seconds']} s", flush=True)
        write_report(args.out, _machine(args.dry_run), entries)  # after each part: a cut-off run keeps what it did
    print(f"report: {args.out / 'report.md'}")
    if args.result is not None:
        from results import command_line

        measured = next(e for e in entries if e["name"] == "measure")
        if not measured["ok"]:
            print(f"no record written to {args.result}: the measure part failed")
            return 1
        command = command_line(__file__, argv)
        write_memory_record(args.result, _machine(False), measured["result"]["rows"], command)
        print(f"record: {args.result}")
    return 0


def with_limits(plan: tuple[Part, ...], limits: list[str]) -> tuple[Part, ...]:
    """``plan`` with the time limits ``limits`` name (``PART=SECONDS`` each)."""
    seconds: dict[str, int] = {}
    names = [p.name for p in plan]
    for item in limits:
        name, _, value = item.partition("=")
        if name not in names or not value.isdigit() or int(value) < 1:
            raise ValueError(f"--limit takes PART=SECONDS with a part of {', '.join(names)}, got {item!r}")
        seconds[name] = int(value)
    return tuple(dataclasses.replace(p, limit_s=seconds.get(p.name, p.limit_s)) for p in plan)


def record_from_report(report_file: Path, path: Path, commit: str) -> int:
    """Write the real-size record from ``report_file`` (a run's report.json); 1 if it holds no
    real-size result."""
    report = json.loads(report_file.read_text())
    entry = next((e for e in report["parts"] if e["name"] == "realsize" and e["ok"]), None)
    if entry is None:
        print(f"no record written to {path}: {report_file} holds no real-size result")
        return 1
    limit = f" --limit realsize={entry['limit_s']}" if entry["limit_s"] != REAL_LIMIT_S else ""
    command = f"python benchmarks/gpu_check.py --out build/gpu-check --parts realsize{limit}"
    write_realsize_record(path, report["machine"], entry["result"], command, commit=commit)
    print(f"record: {path}")
    return 0


def _check_sizes() -> None:
    """The sizes above name only sizes their corpus entries have (building them is the real run's)."""
    from autotune.zoo import CORPUS

    for name, sizes in (("hf-llama", DECODER), ("hf-vit", VISION), ("lstm-lm", LSTM), ("hf-gpt2", GPT2_SMALL)):
        unknown = sorted(set(sizes) - set(CORPUS[name].sizes))
        if unknown:
            raise ValueError(f"{name} has no size {unknown[0]!r} (sizes: {sorted(CORPUS[name].sizes)})")


def _imported(part: Part) -> dict[str, Any]:
    """Import what ``part`` uses; an optional package that is missing is noted, not fatal, in a dry run."""
    missing = []
    for module in part.imports:
        try:
            importlib.import_module(module)
        except ImportError as e:
            if module in ("deepspeed", "transformers") or e.name in ("deepspeed", "transformers"):
                missing.append(module)
            else:
                raise
    return {"missing": missing}


if __name__ == "__main__":
    sys.exit(main())
