"""Shared pieces of the GPU benchmarks: what is missing for one to run, device timing with
CUDA events, CUDA-graph capture on a side stream, and a one-rank NCCL process group.

Three timings of a tiny launch, because they answer different questions:
  host    perf_counter per call, no sync: what a launch costs the CPU (eager, host-bound loops)
  eager   CUDA events around `inner` back-to-back launches, queued behind a `torch.cuda._sleep`
          so the GPU never waits for the host: what the launch costs the GPU in eager mode
  graph   the same launches captured once in a CUDA graph and replayed: the graph-mode cost
Every function here needs CUDA; the suite calls them only after `missing()` said nothing is.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

# torch.cuda._sleep spins for this many GPU cycles per microsecond requested: a 2 GHz guess.
# It only has to keep the queue busy while the host enqueues; longer is harmless.
CYCLES_PER_US = 2000


def missing(*needs: str) -> str | None:
    """Why a GPU benchmark cannot run: the first need not met, or None. A need is "cuda",
    "nccl", a module name ("cupy", "gpupace.vcluster"), or "module:attr" for an API."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    for need in needs:
        if need == "cuda":
            if not torch.cuda.is_available():
                return "no CUDA device (torch.cuda.is_available() is False)"
        elif need == "cupy":  # imports without NVRTC, which the reduction compiles with
            from gpupace.backends import cupy_missing

            why = cupy_missing()
            if why:
                return why
        elif need == "nccl":
            import torch.distributed as dist

            if not (dist.is_available() and dist.is_nccl_available()):
                return "torch.distributed has no NCCL backend"
        else:
            mod, _, attr = need.partition(":")
            try:
                found = importlib.util.find_spec(mod) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                return f"{mod} is missing (not in this checkout or not installed)"
            if attr:
                try:
                    obj = importlib.import_module(mod)
                except Exception as e:  # noqa: BLE001 - report why, do not crash the suite
                    return f"{mod} does not import: {type(e).__name__}: {e}"
                for part in attr.split("."):
                    if not hasattr(obj, part):
                        return f"{mod} has no {attr} yet"
                    obj = getattr(obj, part)
    return None


def host_time(fn: Callable[[], Any], *, inner: int, warmup: int, repeats: int) -> np.ndarray:
    """Host microseconds per launch: `inner` launches between two clock reads, no sync."""
    import time

    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = np.empty(repeats)
    for r in range(repeats):
        torch.cuda.synchronize()  # an empty queue, so a launch never blocks on a full one
        t0 = time.perf_counter_ns()
        for _ in range(inner):
            fn()
        out[r] = (time.perf_counter_ns() - t0) * 1e-3 / inner
    torch.cuda.synchronize()
    return out


def device_time(
    fn: Callable[[], Any], *, inner: int, warmup: int, repeats: int, host_us: float = 30.0
) -> np.ndarray:
    """GPU microseconds per call of `fn` (eager): CUDA events around `inner` calls that were
    queued behind a `_sleep` covering the host's enqueue time (`host_us` per call)."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
    cycles = int(max(host_us, 5.0) * inner * 2 * CYCLES_PER_US)
    for r in range(repeats):
        torch.cuda._sleep(cycles)
        starts[r].record()
        for _ in range(inner):
            fn()
        ends[r].record()
        torch.cuda.synchronize()  # one rep at a time: the sleep always covers the enqueue
    return np.array([s.elapsed_time(e) * 1e3 / inner for s, e in zip(starts, ends, strict=True)])


def capture(fn: Callable[[], Any], *, inner: int, stream: Any) -> Any:
    """A CUDA graph of `inner` calls of `fn`, captured on `stream` (the caller has run `fn`
    eagerly on that stream first, so every kernel is compiled and every buffer exists)."""
    import torch

    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(inner):
            fn()
    torch.cuda.synchronize()
    return g


def graph_time(g: Any, *, inner: int, warmup: int, repeats: int) -> np.ndarray:
    """GPU microseconds per captured call: events around one replay of `g` (which holds
    `inner` calls), queued behind a short `_sleep`."""
    return device_time(g.replay, inner=1, warmup=warmup, repeats=repeats, host_us=20.0) / inner


@contextlib.contextmanager
def side_stream() -> Iterator[Any]:
    """A fresh stream made current: eager warm-up, capture and replays all run on it, so the
    CuPy view of the stream made at warm-up is the one used inside the capture."""
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        yield s
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


@contextlib.contextmanager
def nccl_world1() -> Iterator[None]:
    """A one-rank NCCL process group in this process (world 1: no peer, NCCL still runs its
    kernels), destroyed on exit. Does nothing when a group is already initialised."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    torch.cuda.set_device(0)
    # A file store, as the device check's group: no port to pick free and lose meanwhile.
    with tempfile.TemporaryDirectory(prefix="gpupace-nccl-") as tmp:
        dist.init_process_group("nccl", init_method=f"file://{tmp}/store", rank=0,
                                world_size=1, device_id=torch.device("cuda", 0))
        try:
            yield
        finally:
            dist.destroy_process_group()


def timed_spins(req_us: float, reps: int, cap_us: float,
                backoff_ns: int = 0) -> dict[str, np.ndarray]:
    """`reps` spin-waits of `req_us`, each run right after a zero-delay spin, both timed by
    CUDA events, behind a sleep that outlasts their launches (GPU time, not the host's):
    "applied" (the delay the spin wrote, from the clock it stops on), "wall" (its kernel time)
    and "zero" (the zero-delay spin's). The error the spin benchmarks judge is wall - median
    zero - request: the zero-delay spins of the same batch carry the launch and the events'
    own cost at the GPU's clocks of the moment. Call it once untimed first (kernels loaded,
    clocks up). `backoff_ns`: the spins sleep that long between clock reads (`spin.spin`)."""
    import torch

    from gpupace.kernels import spin

    # Rows of 16 bytes: every launch sees the same pointer alignment (no recompiles).
    d = torch.zeros(2, 4, device="cuda")
    d[1, 0] = req_us
    applied = torch.zeros(reps, 4, device="cuda")
    scratch = torch.zeros(4, device="cuda")
    reads = torch.zeros(reps, 4, dtype=torch.int32, device="cuda")
    clk = torch.zeros(2, dtype=torch.int64, device="cuda")
    ev = [[torch.cuda.Event(enable_timing=True) for _ in range(3)] for _ in range(reps)]
    for r in range(reps):
        torch.cuda._sleep(200 * CYCLES_PER_US)
        ev[r][0].record()
        spin.spin(d[0], scratch, reads[r], clk, cap_us=cap_us, backoff_ns=backoff_ns)
        ev[r][1].record()
        spin.spin(d[1], applied[r], reads[r], clk, cap_us=cap_us, backoff_ns=backoff_ns)
        ev[r][2].record()
    torch.cuda.synchronize()
    return {"applied": applied[:, 0].double().cpu().numpy(),
            "wall": np.array([b.elapsed_time(c) * 1e3 for _, b, c in ev]),
            "zero": np.array([a.elapsed_time(b) * 1e3 for a, b, _ in ev])}


def spin_event_error(t: dict[str, np.ndarray], req_us: float) -> np.ndarray:
    """The spin's error by events from `timed_spins`' figures (us)."""
    return t["wall"] - float(np.median(t["zero"])) - req_us
