"""LayerDrop: layers skipped at random while training, and the step a memory budget must hold.

LayerDrop (Fan et al., "Reducing Transformer Depth on Demand with Structured Dropout", ICLR 2020)
skips each layer of a stack with probability ``p`` at every training step. Hugging Face's speech
encoders turn it on by default (``config.layerdrop``: 0.1 in Wav2Vec2, HuBERT, WavLM, UniSpeech,
SEW, Data2VecAudio; ``encoder_layerdrop`` / ``decoder_layerdrop`` elsewhere), drawing
``torch.rand([]) < p`` per layer. Two consequences for autotune:

* the fake-tensor profile cannot take the branch: the draw has no value under fake tensors
  (``aten._local_scalar_dense``), so the model could not be profiled at all;
* a step's peak is random: a step that skipped a layer saved none of its activations. Every
  layer runs in some steps (``(1 - p)^L`` of them: 28% for 12 layers at 0.1), and a budget must
  hold those.

So every step autotune runs on a copy of the model (the fake profile, measurements, check
steps, a study's trials) runs every layer: :func:`disable_layer_drop` on the copy. A user's own
training (an adaptive run, the callbacks) keeps its LayerDrop; its predictions are of the step
where every layer runs, and only its steps that did not come in under them check them (a step
that skipped a layer peaks lower than the step predicted).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: importing a workload does not import torch
    import torch

__all__ = ["disable_layer_drop", "layer_drop_of"]


def _holders(model: torch.nn.Module) -> list[Any]:
    """The objects a forward may read a LayerDrop probability from: every module and its config."""
    holders: list[Any] = []
    seen: set[int] = set()
    for module in model.modules():
        for holder in (module, getattr(module, "config", None)):
            if holder is not None and id(holder) not in seen:
                seen.add(id(holder))
                holders.append(holder)
    return holders


def _probabilities(holder: Any) -> dict[str, float]:
    """``holder``'s LayerDrop probabilities above zero, by attribute name (``layerdrop``,
    ``encoder_layerdrop``, ``decoder_layerdrop``: the names Hugging Face and fairseq use)."""
    names = vars(holder) if hasattr(holder, "__dict__") else {}
    return {
        name: float(value)
        for name, value in names.items()
        if name.endswith("layerdrop") and isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
    }


def layer_drop_of(model: torch.nn.Module) -> str | None:
    """The model's LayerDrop in words (``"layerdrop=0.1"``), or None where it skips no layer.

    Example:
        >>> import transformers
        >>> config = transformers.Wav2Vec2Config(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
        ...                                      intermediate_size=64, layerdrop=0.1)
        >>> layer_drop_of(transformers.Wav2Vec2ForCTC(config))
        'layerdrop=0.1'
    """
    found: dict[str, float] = {}
    for holder in _holders(model):
        for name, p in _probabilities(holder).items():
            found[name] = max(p, found.get(name, 0.0))
    return ", ".join(f"{name}={p:g}" for name, p in sorted(found.items())) or None


def disable_layer_drop(model: torch.nn.Module) -> None:
    """Set every LayerDrop probability of ``model`` (its modules' and their configs') to 0: every
    layer runs. For a copy autotune runs: the user's model is never given to it."""
    for holder in _holders(model):
        for name in _probabilities(holder):
            setattr(holder, name, 0.0)
