"""The fake-tensor profile's results shared between tests of one worker process.

Nearly half of the suite's time went to fake-tensor profiles (measured: 849 mode profiles, 794 s
of the two workers' 1,800 s), mostly of the same few workloads (gpt-tiny, the corpus) rebuilt by
each test. Outside tests/memory/ (the profile's own tests, which run it every time), a test gets
the result an earlier test of its worker computed for an identical input: the same model (class,
modules, their attributes and hooks, parameter and buffer shapes, dtypes and flags), blocks, loss,
optimizer and the very batches the profile runs on. What is not recognised as identical runs for
real; a run that raises is never stored. The library itself never caches a profile: a user's
process profiles a workload once (``reuse=`` grows it).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

_MODULE_STATE = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"}
_SIMPLE = (bool, int, float, str, bytes, type(None), torch.dtype, torch.device, torch.Size)


def _describe(value: Any, depth: int = 0) -> str:
    """A description that differs whenever ``value`` could make a forward differ (else the run is
    not shared): simple values by repr, tensors by layout, functions by code and closure, an object
    by its repr unless that is the default one (an address), then by its type and attributes."""
    if isinstance(value, _SIMPLE):
        return repr(value)
    if isinstance(value, torch.Tensor):
        return f"T{tuple(value.shape)}{value.dtype}{value.device}{value.requires_grad}"
    if depth > 3:
        return f"<{type(value).__qualname__}>"
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(map(repr, value)) if isinstance(value, (set, frozenset)) else value
        return f"{type(value).__name__}[{','.join(_describe(v, depth + 1) for v in items)}]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k!r}:{_describe(v, depth + 1)}" for k, v in value.items()) + "}"
    if isinstance(value, functools.partial):
        parts = (value.func, value.args, value.keywords)
        return f"partial({','.join(_describe(v, depth + 1) for v in parts)})"
    if inspect.ismethod(value):
        return f"method({_describe(value.__func__, depth + 1)},{type(value.__self__).__qualname__})"
    if inspect.isfunction(value):
        cells = [c.cell_contents if _filled(c) else None for c in value.__closure__ or ()]
        where = f"{value.__module__}.{value.__qualname__}@{id(value.__code__)}"
        return f"fn({where},{_describe(cells, depth + 1)},{_describe(value.__defaults__, depth + 1)})"
    if isinstance(value, torch.nn.Module):
        return f"<module {type(value).__qualname__}>"  # the model's own modules are walked in _model
    text = repr(value)
    if " at 0x" not in text and "object at" not in text:
        return f"{type(value).__module__}.{type(value).__qualname__}:{text}"
    attrs = getattr(value, "__dict__", None)
    return f"{type(value).__module__}.{type(value).__qualname__}({_describe(attrs, depth + 1) if attrs else ''})"


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


def _model(model: torch.nn.Module) -> Iterator[str]:
    for name, module in model.named_modules(remove_duplicate=False):
        yield f"M{name}:{type(module).__module__}.{type(module).__qualname__}:{id(type(module))}"
        for key, value in sorted(vars(module).items()):
            if key not in _MODULE_STATE:
                yield f"{key}={_describe(value)}"
        for key, p in module._parameters.items():
            yield f"P{key}={_describe(p)}"
        for key, b in module._buffers.items():
            yield f"B{key}={_describe(b)}{key in module._non_persistent_buffers_set}"


def _batch(batch: Any) -> Iterator[bytes]:
    from autotune.search.cache import _tensor_bytes  # the study cache's: dtype, shape and raw bytes

    leaves, spec = tree_flatten(batch)
    yield str(spec).encode()
    for leaf in leaves:
        yield _tensor_bytes(leaf) if isinstance(leaf, torch.Tensor) else repr(leaf).encode()


def workload_key(workload: Any, sizes: tuple[int, ...]) -> str:
    """What a fake run of ``workload`` at the micro-batch ``sizes`` depends on, hashed."""
    from autotune.worst_case import profile_batch

    h = hashlib.sha256()
    parts = [
        f"{type(workload).__module__}.{type(workload).__qualname__}",
        workload.name,
        repr(workload.block_names()),
        _describe(workload.loss_fn),
        _describe(workload.optimizer),
        _describe(workload.collate_fn),
        repr(workload.batch_size),
        repr(workload.min_micro_batch),
        repr(torch.is_autocast_enabled("cpu")),
        *_model(workload.model),
    ]
    for part in parts:
        h.update(part.encode())
        h.update(b"\0")
    for m in sizes:
        for chunk in _batch(profile_batch(workload, m)):
            h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()


class ProfileMemo:
    """The results of the wrapped profile functions, by their input's key, for one process."""

    def __init__(self) -> None:
        self.results: dict[tuple[Any, ...], Any] = {}
        self.hits = 0

    def wrap(self, fn: Callable[..., Any], key: Callable[..., tuple[Any, ...]]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def shared(*args: Any, **kwargs: Any) -> Any:
            k = (fn.__qualname__, *key(*args, **kwargs))
            if k in self.results:
                self.hits += 1
                return self.results[k]
            result = fn(*args, **kwargs)
            self.results[k] = result
            return result

        return shared


def _shared() -> list[tuple[Any, str, Callable[..., Any], Callable[..., tuple[Any, ...]]]]:
    """(module, name, the function itself, its input's key) of each function the memo stands in for."""
    from autotune.memory import blocks, profile, structure

    def mode_key(
        workload: Any,
        fake: Any,
        mode: str,
        sizes: tuple[int, int],
        recomputed: Any,
        found: Any = None,
        device_type: str = "cpu",
    ) -> tuple[Any, ...]:
        # A mode grown from an earlier profile holds that profile's levels besides those asked for;
        # a profile for CUDA's kernels saves other tensors than the host's.
        held = None if found is None else (found.checkpointed is not None, found.selective is not None)
        return workload_key(workload, sizes), mode, sizes, recomputed, held, device_type

    def optimizer_key(workload: Any, fake: Any) -> tuple[Any, ...]:
        return (workload_key(workload, ()),)

    def structure_key(workload: Any, *, micro_batch_size: int = 2) -> tuple[Any, ...]:
        return workload_key(workload, (micro_batch_size,)), micro_batch_size

    def blocks_key(workload: Any, *, micro_batch_size: int = 2, precision: str = "fp32") -> tuple[Any, ...]:
        return workload_key(workload, (micro_batch_size,)), micro_batch_size, precision

    return [
        (profile, "_profile_mode", profile._profile_mode, mode_key),
        (profile, "_optimizer_costs", profile._optimizer_costs, optimizer_key),
        (structure, "detect_structure", structure.detect_structure, structure_key),
        (blocks, "profile_blocks", blocks.profile_blocks, blocks_key),
    ]


_SHARED = _shared()  # the originals, taken before any test patches them


def install(memo: ProfileMemo, monkeypatch: Any) -> None:
    """Route the profile's expensive functions through ``memo`` for one test."""
    for module, name, original, key in _SHARED:
        monkeypatch.setattr(module, name, memo.wrap(original, key))


def counted_runs(monkeypatch: Any) -> list[str]:
    """The profile's own functions again (none shared), and the list each fake run the profile then
    makes appends its recompute level to, in order: for a test that counts them."""
    from autotune.memory import profile

    for module, name, original, _ in _SHARED:
        monkeypatch.setattr(module, name, original)
    runs: list[str] = []
    run = profile.profile_run

    def counted(*args: Any, **kwargs: Any) -> Any:
        runs.append(str(kwargs["checkpoints"][0]))
        return run(*args, **kwargs)

    monkeypatch.setattr(profile, "profile_run", counted)
    return runs
