"""Runs a function on N local ranks, each in its own process with a real torch.distributed
process group, and returns every rank's result. Used by the demo, the benchmarks and the tests.

Nothing hangs: the whole run has a deadline, and a rank that fails or overruns ends the others
with an error that names it and carries its traceback (the first to fail, not the peers whose
collectives it broke); ranks end with their caller, even one killed by SIGKILL, and leave
Ctrl-C to it (SIGINT blocked: its KeyboardInterrupt ends them).

Ranks are spawned: each imports torch anew, ~1.5 s of CPU (4 ranks on the 2-core VM took 6 s
to start and finish an all_reduce). With `START_METHOD = "forkserver"` (Linux; the tests set it)
they fork from multiprocessing's fork server, which imported torch once: 0.13 s there, after
2.5 s for the run that starts the server. Forked ranks take the caller's environment, stdout and
stderr of the moment, as spawned ones do (the server's are those of its start); the
environment is set before the function and its arguments are unpickled, but modules imported
before that (torch, gpupace and numba in the server; the caller's main module in the rank)
read theirs at import. Their arguments travel by plain pickle: tensors are copied,
not shared, and multiprocessing's queues and locks cannot be passed.
"""

from __future__ import annotations

import datetime
import multiprocessing as mp
import multiprocessing.forkserver
import os
import pickle
import queue
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

START_METHOD = "spawn"  # or "forkserver" (module docstring)
START_METHODS = ("spawn", "forkserver")
# What the fork server imports once for every rank (gpupace: ~0.6 s of numba's import a rank
# on the 2-core VM; it imports no kernel, so no Triton, and reads no environment at import)
PRELOAD = ["torch", "torch.distributed", "gpupace"]


class _CallerFd:
    """One of the caller's file descriptors, duplicated into a forked rank by multiprocessing
    (a rank forked from the server would otherwise write where the server's went)."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        from multiprocessing.reduction import DupFd

        return _detach, (DupFd(self.fd),)


def _detach(dup) -> int:
    return dup.detach()


def _caller_fds() -> list[_CallerFd | None]:
    out = []
    for fd in (1, 2):
        try:
            os.fstat(fd)
            out.append(_CallerFd(fd))
        except OSError:  # closed (a daemon's): the rank keeps the server's
            out.append(None)
    return out


def _forked_rank_main(payload, env, fds, rank, world_size, backend, store_path, coll_timeout_s,
                      results):
    """A forked rank: the caller's environment, stdout and stderr, then its function."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # Ctrl-C is the caller's
    os.environ.clear()
    os.environ.update(env)
    for target, fd in zip((1, 2), fds, strict=True):
        if fd is not None:
            os.dup2(fd, target)
            os.close(fd)
    try:
        fn, args, kwargs = pickle.loads(payload)
    except BaseException:  # noqa: BLE001 - a module that fails to import here: say which
        _report_failure(results, rank)
    _rank_main(fn, rank, world_size, backend, store_path, coll_timeout_s, results, args, kwargs)


def _exit_with_parent() -> None:
    """Ends this rank when the process that started it ends, however it ends: a caller killed
    by SIGKILL (the OOM killer, a CI hard kill) runs nothing that could end its ranks, which
    trained on to the end of the run."""
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        from multiprocessing.connection import wait

        wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="gpupace-parent-watch", daemon=True).start()


def _rank_main(fn, rank, world_size, backend, store_path, coll_timeout_s, results, args, kwargs):
    _exit_with_parent()
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # N ranks share this machine's cores
        # A file store: a port picked free and bound later by rank 0 could be taken meanwhile.
        dist.init_process_group(backend, init_method=f"file://{store_path}", rank=rank,
                                world_size=world_size,
                                timeout=datetime.timedelta(seconds=coll_timeout_s))
        try:
            value = fn(rank, world_size, *args, **kwargs)
        except BaseException:  # noqa: BLE001 - timed before the process group goes, which
            # fails the peers' collectives: the caller tells the first failure from theirs
            _report_failure(results, rank)
        finally:
            dist.destroy_process_group()
        # Plain pickle: torch's queue pickler would share tensors through file descriptors
        # that vanish when this process exits.
        results.put((rank, True, pickle.dumps(value)))
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - report anything, then exit non-zero
        _report_failure(results, rank)


def _report_failure(results, rank: int) -> NoReturn:
    """Reports the exception being handled, with the time it was seen (the caller names the
    first failure), and ends the rank."""
    results.put((rank, False, (time.time(), traceback.format_exc())))
    raise SystemExit(1) from None


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, backend: str = "gloo",
              timeout_s: float = 120.0, collective_timeout_s: float = 60.0,
              **kwargs: Any) -> list[Any]:
    """Calls `fn(rank, world_size, *args, **kwargs)` on `world_size` processes, each inside an
    initialised process group; returns the results ordered by rank. `fn` must be importable
    (a module-level function). Raises RuntimeError if a rank fails, TimeoutError past
    `timeout_s`."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an integer >= 1, got {world_size!r}")
    if START_METHOD not in START_METHODS or START_METHOD not in mp.get_all_start_methods():
        raise ValueError(f"gpupace.launch.START_METHOD must be one of {START_METHODS} and "
                         f"available here ({mp.get_all_start_methods()}), got {START_METHOD!r}")
    ctx = mp.get_context(START_METHOD)
    forked = START_METHOD == "forkserver"
    if forked:
        ctx.set_forkserver_preload(PRELOAD)  # before the server starts; later calls change nothing
        # Started here, not by the first rank inside `_ctrl_c_to_caller`: it would keep SIGINT
        # blocked for this process's later forkserver children, the caller's own included.
        multiprocessing.forkserver.ensure_running()
        # unpickled by each rank once the caller's environment is set
        caller = (pickle.dumps((fn, args, kwargs)), dict(os.environ), _caller_fds())
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="gpupace-ranks-") as tmp:
        common = (world_size, backend, os.path.join(tmp, "store"), collective_timeout_s, results)
        procs = [ctx.Process(target=_forked_rank_main, args=(*caller, r, *common), daemon=True)
                 if forked else
                 ctx.Process(target=_rank_main, args=(fn, r, *common, args, kwargs), daemon=True)
                 for r in range(world_size)]
        with _exit_on_termination():
            return _start_and_collect(procs, results, timeout_s)


# After a first failure, how long the others' reports are awaited: a rank that fails ends its
# process group, and its peers' collectives then fail too, often reporting first.
FAILURE_GRACE_S = 3.0


def _start_and_collect(procs: list, results, timeout_s: float) -> list[Any]:
    """Starts the ranks and returns their results by rank; kills what is left on the way out,
    whatever the way."""
    world_size = len(procs)
    out: dict[int, Any] = {}
    failed: dict[int, tuple[float, str]] = {}
    deadline = _now() + timeout_s
    try:
        with _ctrl_c_to_caller():
            for p in procs:
                p.start()
        while len(out) + len(failed) < world_size:
            try:
                rank, ok, value = results.get(timeout=max(0.1, min(1.0, deadline - _now())))
            except queue.Empty:
                if _now() > deadline:
                    missing = sorted(set(range(world_size)) - set(out))
                    raise TimeoutError(
                        f"ranks {missing} of {world_size} did not finish within {timeout_s:.0f} s"
                    ) from None
                if any(r not in out and r not in failed and p.exitcode not in (None, 0)
                       for r, p in enumerate(procs)) and results.empty():
                    raise RuntimeError(_failure(procs, out, failed, results)) from None
                continue
            if not ok:
                failed[rank] = value
                raise RuntimeError(_failure(procs, out, failed, results))
            out[rank] = pickle.loads(value)
        for p in procs:
            p.join(timeout=max(1.0, deadline - _now()))
    finally:
        # A rank that reported is on its way out: its finalizers write what its telemetry
        # writer still holds, and the file's end line (killed at once, it lost them). The
        # others are killed at once (they had FAILURE_GRACE_S in `_failure`).
        grace = _now() + FAILURE_GRACE_S
        for r, p in enumerate(procs):
            if r in out or r in failed:
                p.join(timeout=max(0.0, grace - _now()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()
    return [out[r] for r in range(world_size)]


def _failure(procs: list, out: dict[int, Any], failed: dict[int, tuple[float, str]],
             results) -> str:
    """What failed, once something has: the others' reports awaited FAILURE_GRACE_S more,
    then the ranks that died without a word (killed: the likely cause) or the earliest failure
    with its traceback, and the ranks that failed after it or went silent."""
    world_size = len(procs)
    grace = _now() + FAILURE_GRACE_S
    while len(out) + len(failed) < world_size and _now() < grace:
        try:
            rank, ok, value = results.get(timeout=0.1)
        except queue.Empty:
            if all(r in out or r in failed or p.exitcode is not None for r, p in enumerate(procs)):
                break
            continue
        if ok:
            out[rank] = None
        else:
            failed[rank] = value
    unheard = [r for r in range(world_size) if r not in out and r not in failed]
    died = [r for r in unheard if procs[r].exitcode not in (None, 0)]
    silent = [r for r in unheard if procs[r].exitcode is None]
    lines = []
    for r in died:
        code = procs[r].exitcode
        how = f"exit code {code}"
        if code < 0:
            try:
                how = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        lines.append(f"rank {r} of {world_size} died ({how}) without reporting")
    order = sorted(failed, key=lambda r: failed[r][0])
    if order:
        first = order[0]
        later = f" (then ranks {order[1:]} failed too, likely for it)" if order[1:] else ""
        lines.append(f"rank {first} of {world_size} failed{' first' if later else ''}{later}:"
                     f"\n{failed[first][1]}")
    if silent:
        lines.append(f"ranks {silent} had not reported when the others failed (hung?)")
    return "\n".join(lines)


@contextmanager
def _ctrl_c_to_caller() -> Iterator[None]:
    """Ranks started here never see SIGINT: Ctrl-C reaches every process of the terminal's
    foreground group, and ranks still importing torch (their first seconds) printed a traceback
    each (112 lines at 4 ranks) while their caller, whose KeyboardInterrupt ends them all,
    stopped the run anyway. The signal is blocked, not ignored, while they start: a rank
    inherits the mask through fork and exec and keeps it, and a Ctrl-C meanwhile stays pending
    here and is raised on leaving, where an ignored one was lost (a run went on). Forked ranks
    block it themselves, first thing (`_forked_rank_main`)."""
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


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
        # Said, so that the exit status (128 + signal) is not all a log shows of the end.
        print(f"gpupace: {signal.Signals(signum).name} received: stopping the ranks",
              file=sys.stderr, flush=True)
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
