"""The host time of the device backend's Python, its launches excluded: what `Pacer` and
`DeviceEngine` do on the CPU around the kernels they launch, per paced collective and per step.

In eager mode the device backend is host-bound: on the H200 machine of 2026-11-30 a paced
collective added 44-72 us at 8 a step against a target of 15, while one kernel launch took
6.2-6.5 us of host time there (`bench/launch_cost.py`) and a paced collective launches two.
The rest is this Python, which any CPU can time. Here the engine runs on the CPU device (as
the CPU tests run it) with its launches, its exchange, its reduction and its update replaced
by stand-ins that only count their calls (a check that the timed path launched what a GPU
step launches: two per collective, four per step); everything else is the real code. Per
repeat, one step: `SITES` paced blocks with no collective in them (`Pacer.collective`, the
path of `Pacer.all_reduce`), timed together, then `step()`, timed alone. Warm caches: a
tight loop, so a lower bound of what a training step pays.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from collections.abc import Iterator

import numpy as np

from gpupace.backends.device import COPY_EVERY, DeviceEngine

from .harness import Harness

SITES = 8  # paced collectives a step, as the device check's figure


@contextlib.contextmanager
def _interpreting() -> Iterator[None]:
    """The device engine runs on a CPU device only under Triton's interpreter; it launches
    nothing here, but checks that flag when built. Setting Triton's knob also sets
    TRITON_INTERPRET in the environment: both are put back as they were, or kernels imported
    later in this process would be interpreted ones (the kernel modules must be imported
    before, for the same reason)."""
    import triton

    knobs = triton.knobs.runtime
    env, own = os.environ.get("TRITON_INTERPRET"), knobs.__dict__.get("interpret")
    knobs.interpret = True
    try:
        yield
    finally:
        if own is None:
            del knobs.interpret  # back to reading the environment
        else:
            knobs.interpret = own
        if env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = env


def paced_loop(group, sites: int = SITES):
    """A Pacer on `group` (one rank) with a CPU-device DeviceEngine whose launches count
    instead of running; returns (one_step() -> (sites_ns, step_ns), counts)."""
    from gpupace import PaceConfig, Pacer

    # Imported before the flag is set: @triton.jit decides at import whether a kernel is an
    # interpreted one, and the GPU suite may run later in this process.
    for name in ("clock", "reduce", "spin", "stamp", "update"):
        importlib.import_module(f"gpupace.kernels.{name}")

    cfg = PaceConfig(mode="pace", max_sites=sites)
    pacer = Pacer(cfg, group, backend="host")
    with _interpreting():
        engine = DeviceEngine(cfg, group, 0, 1, device="cpu")
    counts = dict.fromkeys(("enter", "exit", "finish", "exchange", "reduce", "update"), 0)

    def stand_in(name: str):
        def launch(*_args) -> None:
            counts[name] += 1
        return launch

    for name in counts:
        setattr(engine, f"_{name}", stand_in(name))
    pacer._engine, pacer.backend = engine, "device"
    clock = time.perf_counter_ns

    def one_step() -> tuple[int, int]:
        t0 = clock()
        for _ in range(sites):
            with pacer.collective("grads") as issued:
                issued(None)
        t1 = clock()
        pacer.step()
        return t1 - t0, clock() - t1

    return one_step, counts


@contextlib.contextmanager
def _one_rank_group() -> Iterator[object]:
    """A gloo group of one rank, as a job's pacer has a group (one without checks at every
    collective whether a group has appeared since it was built)."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError("host_path makes its own one-rank group: run it where none exists")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def bench_host_path(h: Harness) -> None:
    if importlib.util.find_spec("triton") is None:  # `pip install -e .` alone: a skip, not rc 1
        h.skip("host_path", "needs triton, whose kernels the device engine is built with: "
               "pip install -e '.[test]' (or the cuda12 / cuda13 extra)")
        return
    reps, warm = (200, 20) if h.quick else (3000, 200)
    with _one_rank_group() as group:
        _measure(h, group, reps, warm)


def _measure(h: Harness, group, reps: int, warm: int) -> None:
    one_step, counts = paced_loop(group)
    per_site, per_step = np.empty(reps), np.empty(reps)
    for r in range(-warm, reps):
        a, b = one_step()
        if r >= 0:
            per_site[r], per_step[r] = a * 1e-3 / SITES, b * 1e-3
    steps = warm + reps
    expected = {"enter": SITES * steps, "exit": SITES * steps, "finish": steps,
                "exchange": steps, "reduce": steps, "update": steps}
    if counts != expected:
        raise RuntimeError(f"the timed path launched {counts}, a GPU step's path {expected}")
    case = {"sites_per_step": SITES}
    h.record("host_path", {**case, "part": "per paced collective (its block)"}, per_site)
    h.record("host_path", {**case, "part": "per step (step())"}, per_step)
    # Every COPY_EVERY steps the engine copies and parses its telemetry ring: windows of that
    # many steps carry one each, as a training loop's average step does.
    w = COPY_EVERY
    windows = per_step[:reps // w * w].reshape(-1, w).mean(axis=1)
    h.record("host_path", {**case, "part": f"per step, mean over windows of {w} steps"}, windows)
    shared = per_site[:reps // w * w].reshape(-1, w).mean(axis=1) + windows / SITES
    h.record("host_path", {**case, "part": f"per paced collective with its share of step(), "
                           f"mean over windows of {w} steps"}, shared)
