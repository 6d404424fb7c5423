"""A speech recognizer as Hugging Face users fine-tune one: ``Wav2Vec2ForCTC`` built from its
config class (random weights, nothing downloaded), CTC loss on padded label sequences, and the
config's LayerDrop on (``layerdrop=0.1``, as the released checkpoints set it)."""

import torch
import transformers

from autotune import Workload


def build() -> Workload:
    torch.manual_seed(0)
    config = transformers.Wav2Vec2Config(
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=128,
        conv_dim=(32, 32, 32),
        conv_stride=(5, 2, 2),
        conv_kernel=(10, 3, 3),
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4,
        vocab_size=32,
        layerdrop=0.1,
        mask_time_prob=0.0,
    )
    g = torch.Generator().manual_seed(0)
    audio = torch.randn(32, 4000, generator=g)
    labels = torch.randint(1, 32, (32, 20), generator=g)
    labels[::2, 15:] = -100  # shorter transcripts, padded: the longest target is the data's
    data = [{"input_values": a, "labels": y} for a, y in zip(audio, labels, strict=True)]
    return Workload(
        name="speech-ctc",
        model=transformers.Wav2Vec2ForCTC(config),
        dataset=data,
        loss_fn=lambda model, batch: model(**batch).loss,
        batch_size=8,
    )
