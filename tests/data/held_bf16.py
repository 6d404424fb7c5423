"""A user's model loaded in bf16 (``torch_dtype=torch.bfloat16``): every parameter 16-bit. The
README's example workload (``my_workload.py``), its model cast to bf16 and its inputs with it."""

import dataclasses

import torch
from torch import nn

from autotune import Workload
from tests.data.my_workload import build as build_in_fp32


def build() -> Workload:
    workload = build_in_fp32()

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        xb, yb = batch
        return nn.functional.cross_entropy(model(xb.bfloat16()).float(), yb)

    return dataclasses.replace(workload, name="held-net", model=workload.model.to(torch.bfloat16), loss_fn=loss_fn)
