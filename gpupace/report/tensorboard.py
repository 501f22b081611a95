"""Live view: logs each step's telemetry scalars to TensorBoard, the same figures the report
plots (step time, arrival spread, entry spread after pacing, transfer, straggler, pacing armed,
delays), so a running job shows its coordination costs next to its loss curve.

    from gpupace.report.tensorboard import TensorBoardLogger
    tb = TensorBoardLogger("runs/gpupace")     # ImportError naming the package if missing
    record = pacer.step()
    if record is not None:
        tb.log(record)

Needs the `tensorboard` package (torch.utils.tensorboard imports it). Logging costs one
SummaryWriter call per scalar on the host; call it on one rank only (every rank holds the
same gathered figures).
"""

from __future__ import annotations

import math
import os

import numpy as np

from ..telemetry import StepRecord

INSTALL_HINT = "pip install tensorboard"


def summary_writer():
    """torch's SummaryWriter class; ImportError naming the package when tensorboard is absent."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:  # torch raises ImportError when tensorboard is absent
        raise ImportError(f"TensorBoard logging needs the tensorboard package: "
                          f"{INSTALL_HINT} ({e})") from None
    return SummaryWriter


class TensorBoardLogger:
    """Writes `StepRecord` scalars under `prefix/` to a TensorBoard log directory."""

    def __init__(self, log_dir: str | os.PathLike, prefix: str = "gpupace",
                 flush_secs: int = 30):
        self.prefix, self._log_dir, self._flush_secs = prefix, str(log_dir), flush_secs
        self._writer = summary_writer()(log_dir=self._log_dir, flush_secs=flush_secs)

    @property
    def folder(self) -> str:
        return self._log_dir

    def resume_at(self, step: int) -> None:
        """Goes on from `step` in the same folder, a resumed job's: a new event file that
        tells TensorBoard to hide the points earlier files hold from `step` on (the ones a
        crashed run logged after its checkpoint), as SummaryWriter's `purge_step` does."""
        if self._writer is None:
            raise ValueError("this TensorBoardLogger is closed")
        self._writer.close()
        self._writer = summary_writer()(log_dir=self._log_dir, flush_secs=self._flush_secs,
                                        purge_step=int(step))

    def log(self, record: StepRecord) -> None:
        """Logs one step; NaN figures (the first step's time, an unknown transfer) are left
        out rather than drawn as gaps."""
        if self._writer is None:
            raise ValueError("this TensorBoardLogger is closed")
        delays = np.asarray(record.delay_us, dtype=np.float64)
        delays = delays[np.isfinite(delays)]
        scalars = {
            "step_time_ms": record.step_time_us / 1e3,
            "spread_ms": record.spread_us / 1e3,
            "residual_spread_ms": record.residual_us / 1e3,
            "transfer_ms": record.transfer_us / 1e3,
            "straggler_rank": float(record.straggler),
            "pacing_active": 1.0 if record.active else 0.0,
            "delay_mean_ms": float(delays.mean()) / 1e3 if delays.size else 0.0,
            "delay_max_ms": float(delays.max()) / 1e3 if delays.size else 0.0,
        }
        for name, value in scalars.items():
            if math.isfinite(value):
                self._writer.add_scalar(f"{self.prefix}/{name}", value, record.step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flushes and closes the log. Safe to call twice."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
