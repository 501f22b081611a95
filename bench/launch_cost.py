"""Host time per launch of one small Triton kernel, the paced collective's exit stamp, three
ways: through the JIT (`kernels.stamp.exit_stamp`: Triton binds and specialises the arguments
and looks the kernel up on every call); through the runner of the CompiledKernel that the
JIT returned (tensors as arguments, launch metadata and hooks); and through gpupace's `Hot`,
as the device engine launches after its first call (`kernels/launch.py`: the compiled kernel's
launcher with data pointers as integers and no hooks); a torch in-place add on one element
for scale. On the H200 machine of 2026-11-30: 17 us through the JIT, 6.2-6.5 us through the
runner (the engine's way then), 6.3 us for the add (a slower run of that evening: 34, 11.2
and 10.1); `Hot` as it is now: not yet measured on a GPU.

Also, from a one-rank device engine, the host time of each launch an eager step adds once
(the row, the CuPy reduction, the update; 4 sites), each checked to write what it should; and
of an async paced collective's fork onto the engine's pacing stream and the step's join back,
an empty block between: the engine's (`_Fork`, two events recorded anew at each use, the
current stream set directly) against the way it was until 2026-12-01 (`Stream.wait_stream`,
an event made each time, and `torch.cuda.stream` in a generator context manager), replayed
here; and `torch.cuda.is_current_stream_capturing()`, which an eager step calls at its first
site until `warmup()` (so that a capture before it is refused, not a crash) and in `step()`,
an async site at its fork, a timed step (one in eight) at every site. Not yet measured on a
GPU.

    python bench/launch_cost.py --json PATH

Each direct way is checked: it must write the exit stamp, or it is not timed. The device
check runs this in a process of its own, so that a direct launch gone wrong cannot take the
other figures with it. Without CUDA it prints why, writes nothing and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: make `bench` importable

from bench.harness import description, quantiles  # noqa: E402


def _per_launch_us(fn, launches: int) -> float:
    """Host us per call over `launches` calls, from an empty queue (a launch never waits)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(launches):
        fn()
    us = (time.perf_counter_ns() - t0) * 1e-3 / launches
    torch.cuda.synchronize()
    return us


def engine_ways(dev) -> tuple[dict, dict]:
    """A one-rank device engine's launches of a step, each checked once, and an async site's
    fork and join both ways: (ways by name, facts); or ({}, {"why": ...})."""
    import contextlib

    import torch

    from gpupace import PaceConfig
    from gpupace.backends import device_backend_missing

    why = device_backend_missing()
    if why:
        return {}, {"why": why}
    from gpupace.backends.device import DeviceEngine

    eng = DeviceEngine(PaceConfig(mode="observe"), None, 0, 1, device=dev)
    pace, n = eng._pace_stream, 4

    def engine_fork() -> None:
        with eng.issue(sync=False):
            pass
        eng._join()

    @contextlib.contextmanager
    def forked():  # DeviceEngine._forked until 2026-12-01
        torch.cuda.is_current_stream_capturing()
        pace.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(pace):
            yield

    def fork_before() -> None:
        with forked():
            pass
        torch.cuda.is_current_stream_capturing()  # _join's query, then its wait
        torch.cuda.current_stream(dev).wait_stream(pace)

    def wrote(fn, buf, before, check) -> bool:
        buf.fill_(before)
        fn()
        torch.cuda.synchronize()
        return bool(check(buf))

    facts, ways = {}, {}
    # the step's launches as an eager step makes them (rows of zeros: one valid rank)
    checks = {
        "engine_finish_row": (eng._finish, eng.row[:1], -1.0, lambda b: b.item() == 0.0),
        "engine_cupy_reduce": (lambda: eng._reduce(n), eng.red["n_valid"], -1,
                               lambda b: b.item() == 1),
        "engine_update": (lambda: eng._update(n), eng.state["counter"][0, :1], 7,
                          lambda b: b.item() == 8),
    }
    for name, (fn, buf, before, check) in checks.items():
        facts[f"{name}_wrote"] = ok = wrote(fn, buf, before, check)
        if ok:
            ways[name] = fn
    for name, fn in (("fork_join_engine", engine_fork), ("fork_join_before", fork_before)):
        was = torch.cuda.current_stream(dev)  # timed only if it gives the current stream back
        fn()
        facts[f"{name}_restored_stream"] = back = torch.cuda.current_stream(dev) == was
        if back:
            ways[name] = fn
    return ways, facts


def time_ways(ways: dict, windows: int, launches: int,
              per_launch=_per_launch_us) -> tuple[dict[str, list[float]], dict[str, str]]:
    """Us per call of each way, window by window after a warm one, interleaved (the machine's
    drift hits every way alike); a way that raises is dropped, with why, and the others go
    on: ({way: samples}, {way: error})."""
    ways, failed = dict(ways), {}
    samples: dict[str, list[float]] = {k: [] for k in ways}
    for window in range(-1, windows):  # the warm one: caches, the driver's first launches
        for k, fn in list(ways.items()):
            try:
                us = per_launch(fn, 20 if window < 0 else launches)
            except Exception as e:  # noqa: BLE001 - one way failing keeps the others' figures
                failed[k] = f"{type(e).__name__}: {e}"
                del ways[k], samples[k]
                continue
            if window >= 0:
                samples[k].append(us)
    return samples, failed


def measure(launches: int = 200, windows: int = 15) -> dict:
    import torch
    import triton

    from gpupace.kernels import stamp
    from gpupace.kernels.clock import use_clock
    from gpupace.kernels.launch import COMPILE_OPTIONS

    dev = torch.device("cuda", torch.cuda.current_device())
    m, site = 4, 1  # an engine's buffers (spin.py's layout), the second site
    row = torch.zeros(2 + 2 * m, dtype=torch.float32, device=dev)
    stamps = torch.zeros(m, 3, dtype=torch.int64, device=dev)
    clk = torch.zeros(2, dtype=torch.int64, device=dev)
    one = torch.zeros(1, device=dev)
    clock = use_clock(None)
    stream = torch.cuda.current_stream(dev).cuda_stream
    compiled = stamp._exit_kernel[(1,)](row, stamps, clk, site, USE_CLOCK=clock, num_warps=1,
                                        **COMPILE_OPTIONS)
    out: dict = {"triton": triton.__version__, "launches_per_window": launches}
    ways = {"jit_exit_stamp": lambda: stamp.exit_stamp(row, stamps, clk, site),
            "torch_add_1_element": lambda: one.add_(1.0),
            # what an eager step pays to learn whether a capture is on (see the docstring)
            "capture_query": torch.cuda.is_current_stream_capturing}
    if not all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
        out["direct"] = f"the JIT returned {type(compiled).__name__}, not a CompiledKernel"
    else:
        runner = compiled[(1, 1, 1)]
        hot = stamp.exit_stamper(row, stamps, clk)  # the engine's launcher
        candidates = {
            # Triton's runner of the compiled kernel: tensors, launch metadata and hooks
            "runner_exit_stamp": lambda: runner(row, stamps, clk, site, clock, stream=stream),
            # gpupace's: data pointers as integers, no hooks (kernels/launch.py)
            "hot_exit_stamp": lambda: hot(site),
        }
        hot(site)  # binds it (a JIT call), as the engine's first call does
        out["hot_direct"] = hot.hot.direct
        for name, fn in candidates.items():
            stamps.zero_()
            row.fill_(float("nan"))  # a step's start: no site marked exited
            fn()
            torch.cuda.synchronize()
            wrote = bool(stamps[site, 2].item() != 0 and row[2 + site].item() == 0.0)
            out[f"{name}_wrote"] = wrote
            if wrote:
                ways[name] = fn
    try:
        more, facts = engine_ways(dev)
    except Exception as e:  # noqa: BLE001 - the launch figures above matter more
        more, facts = {}, {"why": f"{type(e).__name__}: {e}"}
    out["engine"] = facts
    ways.update(more)
    samples, failed = time_ways(ways, windows, launches)
    if failed:
        out["failed"] = failed
    out["per_launch_us"] = {k: quantiles(np.array(v)) for k, v in samples.items()}
    med = {k: float(np.median(v)) for k, v in samples.items()}
    for fast in ("runner_exit_stamp", "hot_exit_stamp"):
        if fast in med and "jit_exit_stamp" in med:
            out[f"jit_over_{fast[:-len('_exit_stamp')]}"] = med["jit_exit_stamp"] / med[fast]
    if "runner_exit_stamp" in med and "hot_exit_stamp" in med:
        out["runner_over_hot"] = med["runner_exit_stamp"] / med["hot_exit_stamp"]
    if "fork_join_engine" in med and "fork_join_before" in med:
        out["fork_join_saved_us"] = med["fork_join_before"] - med["fork_join_engine"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--json", type=Path, required=True, help="where the figures go")
    ap.add_argument("--launches", type=int, default=200, help="launches per timed window")
    args = ap.parse_args(argv)
    if args.launches < 1:
        ap.error(f"--launches must be >= 1, got {args.launches}")
    import torch

    if not torch.cuda.is_available():
        print("launch cost: SKIP: no CUDA device. Nothing measured, nothing written.")
        return 0
    from dataclasses import asdict

    from bench.harness import Machine

    # Where the figures came from, as every harness row says it (the GPU, versions, date).
    res = {"machine": asdict(Machine.probe("")), **measure(args.launches)}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
