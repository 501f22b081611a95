"""The device engine's per-step reduction and update, captured once per site count and
replayed in eager steps.

An eager step ends with the row (`finish_row`), the exchange (an all_gather), the CuPy
reduction and the Triton update. The last two are a CuPy launch and a kernel launch, ~15 us of
host time on the H200 machine of 2026-11-30 (a kernel launch there cost 6.2-6.5 us, CuPy's
more); captured in a CUDA graph they are one graph launch. They are the kernels graph mode
captures (the GPU tests capture and replay them), on the engine's preallocated buffers, so a
replay does what the launches would. The exchange stays out: NCCL orders a group's
collectives on the group's own stream, and a captured all_gather replayed on the current
stream would not be ordered after a collective of the user's still in flight on that group.

Opt-in (`GPUPACE_TAIL_GRAPH=1`) until a GPU has measured it: not yet measured on a GPU. A
capture needs both compiled and CuPy's view of the capturing stream made: the engine asks for
it from its second eager step on. Capturing does not synchronise (`capture_begin`, not
`torch.cuda.graph`, which does), and captures in thread-local mode, so that other threads'
CUDA calls (a data loader's) go on. A capture that fails turns the graphs off for the engine,
with a warning, and the step launches its kernels.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from ..warn import warn

TAIL_GRAPH_ENV = "GPUPACE_TAIL_GRAPH"


def tail_graph_wanted() -> bool:
    return os.environ.get(TAIL_GRAPH_ENV, "0") == "1"


class TailGraphs:
    """`tail(n)` (enqueues kernels for a step of `n` sites on the current stream; no
    collective), captured once per `n` on a stream of its own and replayed on the current one. `prepare(stream)` runs
    before each capture, outside it (e.g. makes CuPy's view of the capturing stream)."""

    def __init__(self, tail: Callable[[int], None], device: torch.device,
                 prepare: Callable[[Any], None] | None = None):
        self._tail, self._prepare = tail, prepare
        self._stream = torch.cuda.Stream(device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.failed: str | None = None

    def __call__(self, n: int) -> bool:
        """Runs the tail for `n` sites from its graph, capturing it first if new. False (and
        nothing enqueued) when the graphs are off: the caller then launches the tail itself."""
        if self.failed is not None:
            return False
        g = self.graphs.get(n)
        if g is None:
            g = self._capture(n)
            if g is None:
                return False
        g.replay()
        return True

    def _capture(self, n: int) -> torch.cuda.CUDAGraph | None:
        s = self._stream
        if self._prepare is not None:
            self._prepare(s)
        # Before the capture (a capture must not wait on an event from outside it), as
        # torch.cuda.graph does; the replays run on the current stream, in its order.
        s.wait_stream(torch.cuda.current_stream())
        g = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(s):
                g.capture_begin(capture_error_mode="thread_local")
                try:
                    self._tail(n)
                finally:
                    g.capture_end()
        except Exception as e:  # noqa: BLE001 - training goes on with launches
            self.failed = f"{type(e).__name__}: {e}"
            warn(f"gpupace: capturing the step's reduction and update in a CUDA graph failed, "
                 f"so eager steps launch them as before ({TAIL_GRAPH_ENV}=1): {self.failed}")
            return None
        self.graphs[n] = g
        return g
