"""torch's log records of a failing fake-tensor pass stay off stderr; autotune's one line stays."""

from __future__ import annotations

import logging

import pytest

from autotune import TrainConfig, load_workload, predict_memory
from autotune.cli.main import main
from autotune.errors import PredictionError
from autotune.memory.fake_logs import quiet_fake_logs
from tests.paths import PLAIN_MLP
from tests.phase_lines import without_phase_lines

FLOAT_TARGETS = f"{PLAIN_MLP}:build_float_targets"
REASON = (
    "cannot profile workload 'plain-mlp' under fake tensors: "
    "RuntimeError: gather(): Expected dtype int32/int64 for index, but got torch.float32"
)


def _fake_gather_with_float_index() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as fake:
        x = fake.from_tensor(torch.zeros(4, 3))
        with pytest.raises(RuntimeError, match="gather"):
            x.gather(1, torch.zeros(4, 1))


def _torch_records(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("torch")]


def test_torch_logs_a_failing_meta_kernel_with_its_traceback_unless_quieted(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    _fake_gather_with_float_index()
    assert _torch_records(caplog) == ["failed while attempting to run meta for aten.gather.default"]
    assert caplog.records[0].exc_info is not None  # with its traceback
    caplog.clear()
    with quiet_fake_logs():
        _fake_gather_with_float_index()
    assert (_torch_records(caplog), capfd.readouterr().err) == ([], "")


def test_quieting_restores_every_logger_s_level() -> None:
    child = logging.getLogger("torch._subclasses.fake_tensor")
    before = child.level
    child.setLevel(logging.INFO)
    try:
        with quiet_fake_logs():
            assert not child.isEnabledFor(logging.CRITICAL)
            assert not logging.getLogger("torch.distributed._tools.mem_tracker").isEnabledFor(logging.CRITICAL)
        assert child.level == logging.INFO
    finally:
        child.setLevel(before)


def test_a_failing_prediction_is_one_line_without_torch_s_traceback(
    caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    workload = load_workload(FLOAT_TARGETS)
    with pytest.raises(PredictionError) as raised:
        predict_memory(workload, TrainConfig(micro_batch_size=8))
    assert str(raised.value) == REASON
    assert (_torch_records(caplog), capfd.readouterr().err) == ([], "")
    assert main(["predict", "-w", FLOAT_TARGETS]) == 1
    assert without_phase_lines(capfd.readouterr().err) == f"autotune predict: {REASON}\n"
