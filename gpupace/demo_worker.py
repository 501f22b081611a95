"""One rank of `gpupace demo`: a small MLP trained with DDP through the pacing comm hook, with
straggler work injected from a schedule. Baseline (`observe`: measured, never delayed) and
paced runs alternate in four phases, baseline-paced-paced-baseline, in one process group, each
pair on the same half of the schedule, so a drift of the machine over the run (caches, clocks,
other load) cancels out of the comparison instead of favouring whichever ran second.

The injected work is real compute (matrix products), not sleep: a straggler that needs a core
competes with whatever else wants one, which is what couples ranks on a shared machine.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from .config import PaceConfig
from .integrations.ddp import ddp_comm_hook
from .pacer import Pacer
from .summary import summarize
from .telemetry import StepRecord

WORK_DIM = 96  # one unit of injected work: a 96x96 matrix product (12-17 us on the 2-core VM)


def work_units(n: int) -> None:
    a = torch.full((WORK_DIM, WORK_DIM), 1.0 / WORK_DIM)
    for _ in range(n):
        a = a @ a  # stays bounded: the matrix is its own square


def ms_per_unit(repeats: int = 50, rounds: int = 7) -> float:
    """Measured cost of one unit of injected work on this machine (one thread): the median of
    `rounds` timings, as one timing of 200 units read 13 to 42 us in three demos on the 2-core
    VM, where fresh processes read 18-22 (the straggler then ran 10 ms behind for 20)."""
    torch.set_num_threads(1)
    work_units(20)
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        work_units(repeats)
        times.append((time.perf_counter() - t) * 1e3 / repeats)
    return float(np.median(times))


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
          telemetry_path: str | None, scenario: str, show_progress: bool,
          stats_from: int) -> list[StepRecord]:
    """Trains on `schedule`; returns this rank's telemetry records from step `stats_from` on."""
    device = torch.device(f"cuda:{rank}") if dist.get_backend() == "nccl" else torch.device("cpu")
    model = build_model(seed).to(device)
    ddp = DDP(model, bucket_cap_mb=0.5, device_ids=[rank] if device.type == "cuda" else None)
    # "" and not None: no file even where GPUPACE_TELEMETRY_PATH names one
    cfg = config.replace(mode=mode, telemetry_path=telemetry_path or "")
    pacer = Pacer(cfg, samples_per_step=batch * world, label=label,
                  telemetry_extra={"scenario": scenario, "wait": wait, "source_detail": "demo",
                                   # the report counts the steps the demo's table counts
                                   "first_measured_step": stats_from})
    spinner = Spinner() if wait == "spin" else None

    def hook(state, bucket):  # unannotated: DDP checks annotations as real types
        fut = ddp_comm_hook(state, bucket)
        if spinner is not None:
            spinner.watch(fut)
        return fut

    pacer.attach(ddp, hook=hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(seed * 1000 + rank)
    steps = schedule.shape[0]
    if show_progress and rank == 0:
        print(f"  {label}: {steps} steps", file=sys.stderr, flush=True)
    try:
        for k in range(steps):
            x = torch.randn(batch, 256, generator=gen).to(device)
            y = torch.randint(0, 10, (batch,), generator=gen).to(device)
            work_units(int(round(schedule[k, rank] * units_per_ms)))  # the injected straggler work
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()
            pacer.step()
            if show_progress and rank == 0 and (k + 1) % max(1, steps // 4) == 0:
                print(f"  {label}: step {k + 1}/{steps}", file=sys.stderr, flush=True)
    finally:
        pacer.close()
        if spinner is not None:
            spinner.close()
    return [r for r in pacer.ring if r.step >= stats_from]


PHASES = (("baseline", "observe", 0), ("paced", "pace", 0), ("paced", "pace", 1),
          ("baseline", "observe", 1))


def telemetry_files(telemetry_dir: str | None) -> list[str | None]:
    """The telemetry file of each phase in `telemetry_dir` (None each without one)."""
    return [str(Path(telemetry_dir) / f"{side}-{k + 1}.jsonl") if telemetry_dir else None
            for side, _, k in PHASES]


def run_abba(rank: int, world: int, *, schedule: np.ndarray, telemetry_dir: str | None,
             **kwargs: Any) -> dict[str, Any]:
    """The four phases; returns the summary of each side over both of its phases, and each
    phase's throughput (`phase_throughput`: the baseline's two phases, the same code at the
    run's two ends, gauge this machine's noise). A side's step-time CV is the mean of its two
    phases' CVs: pooled, the drift between the phases (5-8% of throughput on the 2-core VM)
    would count as step-to-step jitter. (NaN when a phase measured fewer than 2 step times.)"""
    half = schedule.shape[0] // 2
    samples = kwargs["batch"] * world
    records: dict[str, list[StepRecord]] = {"baseline": [], "paced": []}
    phase_throughput, phase_cv = {}, {}
    for (side, mode, k), path in zip(PHASES, telemetry_files(telemetry_dir), strict=True):
        label = f"{side}-{k + 1}"
        recs = train(rank, world, mode=mode, label=label, telemetry_path=path,
                     schedule=schedule[k * half:(k + 1) * half], **kwargs)
        records[side] += recs
        phase = summarize(recs, world, samples)
        phase_throughput[label] = phase["throughput"]
        phase_cv[label] = phase["step_time_cv"]
        dist.barrier()
    out: dict[str, Any] = {side: summarize(recs, world, samples)
                           for side, recs in records.items()}
    for side in records:
        out[side]["step_time_cv"] = float(np.mean([phase_cv[f"{side}-{k}"] for k in (1, 2)]))
    out["phase_throughput"], out["phase_cv"] = phase_throughput, phase_cv
    return out
