"""The device engine's per-step reduction and update, captured once per site count and
replayed in eager steps.

An eager step ends with the row (`finish_row`), the exchange (an all_gather), the CuPy
reduction and the Triton update. The last two are a CuPy launch and a kernel launch (a
kernel launch cost 6.2-6.5 us of host time on the H200 machine of 2026-11-30; CuPy's was not
timed alone); captured in a CUDA graph they are one graph launch. They are the kernels graph mode
captures (the GPU tests capture and replay them), on the engine's preallocated buffers, so a
replay does what the launches would. The exchange stays out: NCCL orders a group's
collectives on the group's own stream, and a captured all_gather replayed on the current
stream would not be ordered after a collective of the user's still in flight on that group.

Opt-in (`GPUPACE_TAIL_GRAPH=1`) until a GPU has measured it: not yet measured on a GPU. A
capture needs both kernels compiled and CuPy's view of the capturing stream made: the engine
asks for it from its second eager step on. It uses `capture_begin` in thread-local mode, not
`torch.cuda.graph` (which synchronises), so other threads' CUDA calls (a data loader's) go
on; some torch versions still wait in `capture_begin` for the process group's pending NCCL
work, once per site count. A capture that fails raises: torch's caching allocator may be left
routing allocations to the failed graph's pool, so going on with launches would not be safe.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch

TAIL_GRAPH_ENV = "GPUPACE_TAIL_GRAPH"


def tail_graph_wanted() -> bool:
    """Whether `GPUPACE_TAIL_GRAPH=1` asks for the tail graphs (off by default)."""
    from gpupace.kernels.launch import env_switch  # no triton import

    return env_switch(TAIL_GRAPH_ENV, False)


class TailGraphs:
    """`tail(n)` (enqueues kernels for a step of `n` sites on the current stream; no
    collective), captured once per `n` on a stream of its own and replayed on the current
    one; `tail` and `prepare` come with each call, so that the graphs hold no reference to
    the engine that owns them. `prepare(stream)` runs before each capture, outside it (e.g.
    makes CuPy's view of the capturing stream). `failed` says why a capture failed (it
    raised)."""

    def __init__(self, device: torch.device):
        self._stream = torch.cuda.Stream(device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.failed: str | None = None

    def __call__(self, n: int, tail: Callable[[int], None],
                 prepare: Callable[[Any], None] | None = None) -> None:
        """Runs the tail for `n` sites from its graph, capturing it first if new."""
        g = self.graphs.get(n)
        if g is None:
            g = self._capture(n, tail, prepare)
        g.replay()

    def _capture(self, n: int, tail: Callable[[int], None],
                 prepare: Callable[[Any], None] | None) -> torch.cuda.CUDAGraph:
        s = self._stream
        try:
            if prepare is not None:
                prepare(s)
            # Before the capture (a capture must not wait on an event from outside it), as
            # torch.cuda.graph does; the replays run on the current stream, in its order.
            s.wait_stream(torch.cuda.current_stream())
            g = torch.cuda.CUDAGraph()
            with torch.cuda.stream(s):
                g.capture_begin(capture_error_mode="thread_local")
                try:
                    tail(n)
                except BaseException:
                    with contextlib.suppress(Exception):  # the tail's error is the one to tell
                        g.capture_end()
                    raise
                g.capture_end()
        except Exception as e:
            self.failed = f"{type(e).__name__}: {e}"
            raise RuntimeError(
                f"gpupace: capturing the step's reduction and update ({n} sites) in a CUDA graph "
                f"failed; unset {TAIL_GRAPH_ENV} to launch them instead") from e
        self.graphs[n] = g
        return g
