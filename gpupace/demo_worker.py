"""One rank of `gpupace demo`: a small MLP trained with DDP through the pacing comm hook, with
straggler work injected from a schedule, run twice in one process group (baseline in `observe`
mode, then paced), so both runs see the same ranks, data and injected work.

The injected work is real compute (matrix products), not sleep: a straggler that needs a core
competes with whatever else wants one, which is what couples ranks on a shared machine.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from .config import PaceConfig
from .integrations.ddp import ddp_comm_hook
from .pacer import Pacer

WORK_DIM = 96  # one unit of injected work: a 96x96 matrix product (~0.1 ms on one core)


def work_units(n: int) -> None:
    a = torch.full((WORK_DIM, WORK_DIM), 1.0 / WORK_DIM)
    for _ in range(n):
        a = a @ a  # stays bounded: the matrix is its own square


def ms_per_unit(repeats: int = 200) -> float:
    """Measured cost of one unit of injected work on this machine (one thread)."""
    torch.set_num_threads(1)
    work_units(20)
    t = time.perf_counter()
    work_units(repeats)
    return (time.perf_counter() - t) * 1e3 / repeats


class Spinner:
    """Emulates NCCL's waiting: while any collective of this rank is pending, a thread polls it
    in a busy loop, burning a core as NCCL's kernels burn SMs. Gloo's own waiting sleeps."""

    def __init__(self) -> None:
        self._pending: list[torch.futures.Future] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def watch(self, fut: torch.futures.Future) -> None:
        with self._lock:
            self._pending.append(fut)
        self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait()
            while True:
                with self._lock:
                    self._pending = [f for f in self._pending if not f.done()]
                    if not self._pending:
                        self._wake.clear()
                        break
                time.sleep(0)  # release the GIL but keep the core busy

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout=5)


def build_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    # 0.66 M parameters (2.6 MB of gradients): DDP makes several buckets, several sites.
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )


def train(rank: int, world: int, *, mode: str, label: str, schedule: np.ndarray,
          units_per_ms: float, wait: str, batch: int, seed: int, config: PaceConfig,
          telemetry_path: str | None, scenario: str, show_progress: bool) -> dict[str, Any]:
    device = torch.device(f"cuda:{rank}") if dist.get_backend() == "nccl" else torch.device("cpu")
    model = build_model(seed).to(device)
    ddp = DDP(model, bucket_cap_mb=0.5, device_ids=[rank] if device.type == "cuda" else None)
    cfg = config.replace(mode=mode, telemetry_path=telemetry_path)
    pacer = Pacer(cfg, samples_per_step=batch * world, label=label,
                  telemetry_extra={"scenario": scenario, "wait": wait, "source_detail": "demo"})
    spinner = Spinner() if wait == "spin" else None

    def hook(state, bucket):  # unannotated: DDP checks annotations as real types
        fut = ddp_comm_hook(state, bucket)
        if spinner is not None:
            spinner.watch(fut)
        return fut

    ddp.register_comm_hook(pacer, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    steps = schedule.shape[0]
    t0 = time.perf_counter()
    try:
        for k in range(steps):
            x = torch.randn(batch, 256, generator=gen).to(device)
            y = torch.randint(0, 10, (batch,), generator=gen).to(device)
            work_units(int(round(schedule[k, rank] * units_per_ms)))  # the injected straggler work
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            pacer.step()
            if show_progress and rank == 0 and (k + 1) % max(1, steps // 10) == 0:
                print(f"  {label}: step {k + 1}/{steps}", file=sys.stderr, flush=True)
    finally:
        pacer.close()
        if spinner is not None:
            spinner.close()
    summary = pacer.summary()
    summary["wall_s"] = time.perf_counter() - t0
    return summary


def run_both(rank: int, world: int, **kwargs: Any) -> dict[str, Any]:
    """Baseline (observe: measured, never delayed), then paced, in the same process group."""
    paths = kwargs.pop("telemetry_paths")
    out = {}
    for label, mode in (("baseline", "observe"), ("paced", "pace")):
        out[label] = train(rank, world, mode=mode, label=label, telemetry_path=paths[label],
                           **kwargs)
        dist.barrier()
    return out
