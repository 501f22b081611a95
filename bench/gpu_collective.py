"""GPU benchmarks of whole paced collectives through `gpupace.Pacer(backend="device")` on a
one-rank NCCL group: the time a paced collective adds, eager against CUDA graph, and paced
against plain NCCL all_reduce from 4 KB to 256 MB.

World 1 has no peer, so no rank is ever delayed (the policy needs two valid ranks): what is
measured is the mechanism, stamps, a zero-delay spin and the per-step exchange and update,
which is what the device issue's targets bound (graph <= 3 us, eager <= 15 us per collective,
its share of the step update included). The step's exchange is a one-rank all_gather: its
launch, without the network time of many ranks (a lower bound there). Variants are
interleaved; every timed call is bracketed by `torch.cuda.synchronize()`, which costs both
variants alike.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from . import gpu_common as gc
from .harness import Harness, interleave

SITES_PER_STEP = 8  # paced collectives per step (DDP buckets) that share one step update
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
QUICK_SIZES = [4 << 10, 1 << 20, 64 << 20, 256 << 20]  # the range, its ends included
GRAPH_TARGET_US, EAGER_TARGET_US = 3.0, 15.0
NEEDS = (
    "cuda",
    "nccl",
    "triton",
    "cupy",
    "gpupace.backends.device:DeviceEngine",
    "gpupace.pacer:Pacer.warmup",
)


def human(nbytes: int) -> str:
    return f"{nbytes >> 20}MB" if nbytes >= 1 << 20 else f"{nbytes >> 10}KB"


def _device_pacer():
    import gpupace

    pacer = gpupace.Pacer(gpupace.PaceConfig(mode="pace"), backend="device")
    if pacer.backend != "device":
        raise RuntimeError(f"Pacer picked backend {pacer.backend!r}, not 'device'")
    pacer._engine.gather_alone = True  # world 1: time the exchange's all_gather all the same
    return pacer


def bench_site(h: Harness) -> None:
    """Added time per paced collective, eager and in a CUDA graph: a step of 8 small
    all_reduces, paced (with its step()) against plain, pair by pair, divided by 8. Eager
    pairs are windows of steps that hold a step that copies the telemetry ring and one that
    records CUDA events (one in COPY_EVERY and one in PHASE_EVERY): single steps' median left
    them out (44 us a collective on 2026-11-30, where the same row's mean was 55)."""
    why = gc.missing(*NEEDS)
    if why:
        h.skip("site", why)
        return
    import torch
    import torch.distributed as dist

    from gpupace.backends.device import COPY_EVERY, PHASE_EVERY

    window_steps = math.lcm(COPY_EVERY, PHASE_EVERY)  # a telemetry copy and a timed step each
    k = SITES_PER_STEP
    reps = 30 if h.quick else 300
    with gc.nccl_world1(), gc.side_stream() as s:
        t = torch.ones(1024, dtype=torch.float32, device="cuda")  # 4 KB: the mechanism dominates
        pacer, lone = _device_pacer(), _device_pacer()

        def plain() -> None:
            for _ in range(k):
                dist.all_reduce(t)

        def paced() -> None:
            for _ in range(k):
                pacer.all_reduce(t)
            pacer.step()

        def window(step: Callable[[], None]) -> Callable[[], None]:
            def run() -> None:
                for _ in range(window_steps):
                    step()
            return run

        for _ in range(3):  # eager steps first: NCCL, Triton and CuPy all initialised
            plain()
            paced()
            lone.step()
        eager = interleave(
            {"plain": window(plain), "paced": window(paced), "step": window(lone.step)},
            warmup=2,
            repeats=max(10, reps // window_steps),
            sync=torch.cuda.synchronize,
        )
        eager = {v: x / window_steps for v, x in eager.items()}  # a step's share of its window
        pacer.warmup()
        g_plain = gc.capture(plain, inner=1, stream=s)
        g_paced = gc.capture(paced, inner=1, stream=s)
        graph = interleave(
            {"plain": g_plain.replay, "paced": g_paced.replay},
            warmup=5,
            repeats=reps,
            sync=torch.cuda.synchronize,
        )
        pacer.close()
        lone.close()
        # Graphs holding NCCL kernels must be gone before the process group is destroyed.
        del g_plain, g_paced
        torch.cuda.synchronize()
    case = {"size": "4KB", "sites_per_step": k}
    out = {}
    labels = {
        "plain": f"plain: {k} all_reduce",
        "paced": f"paced: {k} all_reduce + step()",
        "step": "step() alone, 0 sites",
    }
    for mode, res in (("eager", eager), ("graph", graph)):
        for v, x in res.items():
            h.record("paced_collective", {**case, "mode": mode, "variant": labels[v]}, x)
        added = (res["paced"] - res["plain"]) / k
        out[mode] = h.record(
            "paced_collective", {**case, "mode": mode, "variant": "added per collective"}, added
        )["p50"]
    detail = (f"(paced step of {k} - plain step of {k}) / {k}, median of pairs (eager: of "
              f"windows of {window_steps} steps); step update included")
    h.check(
        "added time per paced collective, CUDA graph",
        out["graph"],
        GRAPH_TARGET_US,
        "us",
        detail=detail,
    )
    h.check(
        "added time per paced collective, eager", out["eager"], EAGER_TARGET_US, "us", detail=detail
    )


def bench_nccl(h: Harness) -> None:
    """Paced against plain NCCL all_reduce (world 1), 4 KB to 256 MB, eager. At one rank an
    in-place all_reduce moves no data: plain is NCCL's launch and the sync alone, flat over the
    sizes (29-32 us on 2026-11-30), so the ratios are against an empty collective; what a
    transfer of each size would hide needs two GPUs or more (not yet measured)."""
    why = gc.missing(*NEEDS)
    if why:
        h.skip("nccl", why)
        return
    import torch
    import torch.distributed as dist

    sizes = QUICK_SIZES if h.quick else SIZES
    summary = {}
    with gc.nccl_world1(), gc.side_stream():
        for nbytes in sizes:
            t = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
            pacer = _device_pacer()
            reps = 20 if h.quick else (200 if nbytes <= 16 << 20 else 60)
            res = interleave(
                {
                    "plain": lambda t=t: dist.all_reduce(t),
                    "paced": lambda t=t, p=pacer: p.all_reduce(t),
                    "step": pacer.step,
                },
                warmup=5,
                repeats=reps,
                sync=torch.cuda.synchronize,
            )
            pacer.close()
            size = human(nbytes)
            for v, x in res.items():
                h.record("nccl_all_reduce", {"size": size, "variant": v}, x)
            pairs = {
                "paced/plain": res["paced"] / res["plain"],
                "(paced+step)/plain": (res["paced"] + res["step"]) / res["plain"],
            }
            for name, r in pairs.items():
                h.record(
                    "nccl_all_reduce_ratio",
                    {"size": size, "ratio": name},
                    r,
                    metric="ratio",
                    unit="x",
                )
            added = h.record(
                "nccl_all_reduce",
                {"size": size, "variant": "paced-plain"},
                res["paced"] - res["plain"],
                metric="overhead",
            )
            summary[size] = {
                "bytes": nbytes,
                "added_p50_us": added["p50"],
                **{n: float(np.median(r)) for n, r in pairs.items()},
                "p20": {n: float(np.percentile(r, 20)) for n, r in pairs.items()},
                "p80": {n: float(np.percentile(r, 80)) for n, r in pairs.items()},
            }
    h.extras["nccl_all_reduce"] = summary
    h.plot("nccl_overhead_vs_size", lambda fig: _draw(fig, sizes, summary))


def _draw(fig, sizes: list[int], summary: dict) -> None:
    x = np.asarray(sizes, dtype=float)
    ax = fig.add_subplot(1, 2, 1)
    for name, marker in (("paced/plain", "o"), ("(paced+step)/plain", "s")):
        med = [summary[human(n)][name] for n in sizes]
        ax.plot(x, med, marker=marker, label=name)
        ax.fill_between(
            x,
            [summary[human(n)]["p20"][name] for n in sizes],
            [summary[human(n)]["p80"][name] for n in sizes],
            alpha=0.15,
        )
    ax.axhline(1.0, color="0.3", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size")
    ax.set_ylabel("time ratio to plain (median, band p20-p80)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax2 = fig.add_subplot(1, 2, 2)
    ax2.plot(x, [summary[human(n)]["added_p50_us"] for n in sizes], marker="o")
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("message size")
    ax2.set_ylabel("paced - plain, p50 of pairs (us)")
    ax2.grid(alpha=0.3)
    for a in (ax, ax2):
        a.set_xticks(x[::2], [human(n) for n in sizes[::2]])
    fig.suptitle("Paced against plain NCCL all_reduce (world 1, device backend, eager)")
