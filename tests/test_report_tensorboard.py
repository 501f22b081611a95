"""The live TensorBoard logger: the scalars of each StepRecord reach an event file, NaN figures
are left out, and without tensorboard the error names the package to install."""

from __future__ import annotations

import builtins

import pytest

from gpupace.telemetry import StepRecord

pytestmark = pytest.mark.timeout(60)


def _record(k: int) -> StepRecord:
    return StepRecord(step=k, time_s=0.1 * k, step_time_us=float("nan") if k == 0 else 1e5 + k,
                      spread_us=2000.0 + k, residual_us=100.0, transfer_us=900.0,
                      straggler=k % 4, active=k >= 2, earliness_us=[0.0] * 4,
                      wait_us=[1.0] * 4, delay_us=[0.0, 500.0, 1500.0, float("nan")])


def test_logger_writes_the_scalars(tmp_path):
    pytest.importorskip("tensorboard", reason="needs tensorboard (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gpupace.report.tensorboard import TensorBoardLogger

    tb = TensorBoardLogger(tmp_path)
    for k in range(5):
        tb.log(_record(k))
    tb.close()
    tb.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        tb.log(_record(5))
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"gpupace/step_time_ms", "gpupace/spread_ms", "gpupace/pacing_active",
            "gpupace/delay_max_ms", "gpupace/straggler_rank"} <= tags
    steps = [e.step for e in acc.Scalars("gpupace/step_time_ms")]
    assert steps == [1, 2, 3, 4]  # step 0's NaN left out
    assert [e.value for e in acc.Scalars("gpupace/pacing_active")] == [0, 0, 1, 1, 1]
    assert acc.Scalars("gpupace/delay_max_ms")[0].value == pytest.approx(1.5)
    assert acc.Scalars("gpupace/delay_mean_ms")[0].value == pytest.approx(2000 / 3 / 1e3)


def test_missing_tensorboard_names_the_install(monkeypatch, tmp_path):
    real_import = builtins.__import__

    def no_tb(name, *args, **kwargs):
        if name.startswith("torch.utils.tensorboard") or name.startswith("tensorboard"):
            raise ImportError("No module named 'tensorboard'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_tb)
    from gpupace.report.tensorboard import TensorBoardLogger

    with pytest.raises(ImportError, match="pip install tensorboard"):
        TensorBoardLogger(tmp_path)
