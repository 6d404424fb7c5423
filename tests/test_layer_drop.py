"""LayerDrop (layers skipped at random while training): found, and off in every copy autotune runs."""

from __future__ import annotations

import torch
import transformers

from autotune import Workload, load_workload
from autotune.layer_drop import disable_layer_drop, layer_drop_of
from tests.paths import SPEECH_CTC


def _config(**kw: object) -> transformers.Wav2Vec2Config:
    return transformers.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, **kw
    )


def test_it_is_found_in_a_config_and_on_a_module_and_said_by_name() -> None:
    assert layer_drop_of(transformers.Wav2Vec2Model(_config(layerdrop=0.1))) == "layerdrop=0.1"
    assert layer_drop_of(transformers.Wav2Vec2Model(_config(layerdrop=0.0))) is None
    mlp = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    mlp[1].encoder_layerdrop = 0.05  # type: ignore[assignment]  # another library's name, on a module
    mlp[1].layerdrop = 0.2  # type: ignore[assignment]
    assert layer_drop_of(mlp) == "encoder_layerdrop=0.05, layerdrop=0.2"
    disable_layer_drop(mlp)
    assert layer_drop_of(mlp) is None and mlp[1].layerdrop == 0.0


def test_every_copy_runs_every_layer_and_the_users_model_keeps_its_layerdrop() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    workload = load_workload(f"{SPEECH_CTC}:wav2vec2")
    assert workload.drops_layers == "layerdrop=0.1"
    for copy in (workload.model_copy(), workload.model_copy(fake=FakeTensorMode())):
        assert layer_drop_of(copy) is None
        assert copy.config is not workload.model.config  # type: ignore[union-attr]
    assert workload.model.config.layerdrop == 0.1  # type: ignore[union-attr]
    plain = Workload(
        name="p",
        model=torch.nn.Linear(2, 2),
        dataset=[torch.zeros(2)] * 2,
        loss_fn=lambda m, b: m(b).sum(),
        batch_size=2,
    )
    assert plain.drops_layers is None
