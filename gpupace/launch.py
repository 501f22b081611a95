"""Runs a function on N local ranks, each in its own process with a real torch.distributed
process group, and returns every rank's result. Used by the demo, the benchmarks and the tests.

Nothing hangs: the whole run has a deadline, and a rank that fails or overruns ends the others
with an error that names it and carries its traceback.

Ranks fork from multiprocessing's fork server, which imports torch once, where there is one
(Linux, macOS); a spawned rank imports torch anew: 4 ranks on the 2-core VM took 6 s to start
and finish an all_reduce, against 0.13 s forked (2.5 s for the run that starts the server).
Each rank takes the caller's environment of the moment, as a spawned one does (the server's is
that of its start), before it unpickles the function and its arguments, which may import the
caller's modules; only the caller's main module is imported before, by multiprocessing.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import os
import pickle
import queue
import signal
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

# What the fork server imports once for every rank: nothing that reads the environment at import
# in a way a rank could need otherwise (torch reads CUDA_VISIBLE_DEVICES, NCCL_* and OMP_* when
# first used, in the rank).
PRELOAD = ["torch", "torch.distributed"]


def _context():
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)  # before the server starts; later calls change nothing
        return ctx
    return mp.get_context("spawn")


def _rank_main(payload, rank, world_size, backend, store_path, coll_timeout_s, results, env):
    try:
        os.environ.clear()
        os.environ.update(env)
        fn, args, kwargs = pickle.loads(payload)
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # N ranks share this machine's cores
        # A file store: a port picked free and bound later by rank 0 could be taken meanwhile.
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=coll_timeout_s))
        try:
            value = fn(rank, world_size, *args, **kwargs)
        finally:
            dist.destroy_process_group()
        # Plain pickle: torch's queue pickler would share tensors through file descriptors
        # that vanish when this process exits.
        results.put((rank, True, pickle.dumps(value)))
    except BaseException:  # noqa: BLE001 - report anything, then exit non-zero
        results.put((rank, False, traceback.format_exc()))
        raise SystemExit(1) from None


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
              timeout_s: float = 120.0, collective_timeout_s: float = 60.0,
              **kwargs: Any) -> list[Any]:
    """Calls `fn(rank, world_size, *args, **kwargs)` on `world_size` spawned processes inside an
    initialised process group; returns the results ordered by rank. `fn` must be importable
    (a module-level function). Raises RuntimeError if a rank fails, TimeoutError past
    `timeout_s`."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    ctx = _context()
    results = ctx.Queue()
    env = dict(os.environ)
    payload = pickle.dumps((fn, args, kwargs))  # unpickled by each rank after `env` is set
    with tempfile.TemporaryDirectory(prefix="gpupace-ranks-") as tmp:
        store = os.path.join(tmp, "store")
        procs = [ctx.Process(target=_rank_main, daemon=True,
                             args=(payload, r, world_size, backend, store, collective_timeout_s,
                                   results, env))
                 for r in range(world_size)]
        with _exit_on_termination():
            return _start_and_collect(procs, results, timeout_s)


def _start_and_collect(procs: list, results, timeout_s: float) -> list[Any]:
    """Starts the ranks and returns their results by rank; kills what is left on the way out,
    whatever the way."""
    world_size = len(procs)
    out: dict[int, Any] = {}
    deadline = _now() + timeout_s
    for p in procs:
        p.start()
    try:
        while len(out) < world_size:
            try:
                rank, ok, value = results.get(timeout=max(0.1, min(1.0, deadline - _now())))
            except queue.Empty:
                if _now() > deadline:
                    missing = sorted(set(range(world_size)) - set(out))
                    raise TimeoutError(
                        f"ranks {missing} of {world_size} did not finish within {timeout_s:.0f} s"
                    ) from None
                dead = [r for r, p in enumerate(procs) if r not in out and p.exitcode not in (None, 0)]
                if dead and results.empty():
                    raise RuntimeError(f"rank {dead[0]} died (exit code {procs[dead[0]].exitcode}) "
                                       f"without reporting") from None
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} of {world_size} failed:\n{value}")
            out[rank] = pickle.loads(value)
        for p in procs:
            p.join(timeout=max(1.0, deadline - _now()))
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()
    return [out[r] for r in range(world_size)]


@contextmanager
def _exit_on_termination() -> Iterator[None]:
    """SIGTERM and SIGHUP (a job scheduler, a closed terminal) raise SystemExit in the main
    thread, as Ctrl-C raises KeyboardInterrupt, so that the ranks are killed on the way out
    instead of training on with nobody to report to. Elsewhere than the main thread signals
    cannot be caught: nothing changes there."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    def stop(signum, _frame):
        raise SystemExit(128 + signum)
    sigs = [s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s]
    before = {s: signal.signal(s, stop) for s in sigs}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


def _now() -> float:
    return time.monotonic()
