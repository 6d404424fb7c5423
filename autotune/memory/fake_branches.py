"""Real answers for the data-dependent checks model code cannot make on fake tensors.

Under ``FakeTensorMode`` a tensor has shapes but no values, so model code that branches on values
must guess, and Hugging Face transformers guesses the expensive way. Its mask construction
(``transformers.masking_utils``) skips the causal mask, letting SDPA run with ``is_causal`` and
save no mask, when the attention mask is all ones (``_ignore_causal_mask_sdpa``) and the position
ids hold one sequence per row (``find_packed_sequence_indices``); both read values, and both treat
a fake tensor as "cannot tell" (``is_tracing``): materialise a 4-D mask. A real training step of
the same batch skips it. Measured: a 4-layer Mistral with ``use_cache=False`` (what
``transformers.Trainer`` sets; with a cache the positions come from it and the check is skipped)
was predicted 55,461,668 bytes at micro-batch 16 against a measured 52,315,944 (+6.0%).

:class:`RealBranches` answers those two checks during the fake pass from the real batch the pass
was faked from: its ``attention_mask`` (the same tensor the model turns into the padding mask)
and its ``position_ids`` (absent: the model numbers the positions itself, ``arange``, one
sequence per row). Anything else, or a transformers without these functions, runs as before.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch

from autotune.memory.fake_values import is_fake

__all__ = ["RealBranches"]


class RealBranches:
    """A context manager for a fake-tensor pass of ``real_batch`` (the batch before faking)."""

    def __init__(self, real_batch: Any) -> None:
        self.batch = real_batch if isinstance(real_batch, Mapping) else {}
        self._undo: list[tuple[Any, str, Any]] = []

    def _real(self, key: str) -> torch.Tensor | None:
        value = self.batch.get(key)
        return value if isinstance(value, torch.Tensor) and not is_fake(value) else None

    def __enter__(self) -> RealBranches:
        masking = sys.modules.get("transformers.masking_utils")  # imported by the model, if at all
        if masking is None:
            return self
        packed = getattr(masking, "find_packed_sequence_indices", None)
        ignore = getattr(masking, "_ignore_causal_mask_sdpa", None)
        if packed is not None:
            self._patch(masking, "find_packed_sequence_indices", self._packed(packed))
        if ignore is not None:
            self._patch(masking, "_ignore_causal_mask_sdpa", self._ignore(ignore))
        return self

    def __exit__(self, *exc: object) -> None:
        while self._undo:
            module, name, original = self._undo.pop()
            setattr(module, name, original)

    def _patch(self, module: Any, name: str, replacement: Any) -> None:
        self._undo.append((module, name, getattr(module, name)))
        setattr(module, name, replacement)

    def _packed(self, original: Any) -> Any:
        def find_packed_sequence_indices(position_ids: torch.Tensor) -> Any:
            if not is_fake(position_ids):
                return original(position_ids)
            real = self._real("position_ids")
            if real is None:
                return None if "position_ids" not in self.batch else original(position_ids)
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():
                found = original(real)
            return None if found is None else original(position_ids)  # packed: the fake pass's own mask

        return find_packed_sequence_indices

    def _ignore(self, original: Any) -> Any:
        def _ignore_causal_mask_sdpa(padding_mask: Any, *args: Any, **kwargs: Any) -> Any:
            real = self._real("attention_mask")
            if not is_fake(padding_mask) or real is None or tuple(real.shape) != tuple(padding_mask.shape):
                return original(padding_mask, *args, **kwargs)
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            with unset_fake_temporarily():
                return original(real.to(torch.bool), *args, **kwargs)

        return _ignore_causal_mask_sdpa
