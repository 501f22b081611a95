"""GPU benchmarks of the kernels alone (`gpupace.kernels`): the stamp, the two site kernels and
the row's once-a-step finish, the spin-wait's precision (requested against applied, 0 to
1000 us), and the per-step update kernel with the CuPy reduction at world sizes 2 to 4096.

Kernel buffers are made the way the device engine makes them (`gpupace.backends.device`); the
engine's launchers are called directly (after their first call they skip Triton's JIT), so
these rows are the kernels' own cost, without the engine's Python bookkeeping
(`gpu_collective` measures the whole paced collective).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import gpu_common as gc
from .harness import Harness

SPIN_REQUESTS_US = [0.0, 1.0, 10.0, 100.0, 1000.0]
UPDATE_WORLDS = [2, 8, 64, 512, 4096]
UPDATE_SITES = 4
MAX_SITES = 64  # PaceConfig's default max_sites: the row layout the engine uses


def _three_ways(
    h: Harness, bench: str, case: dict, fn, *, inner: int, reps: int, stream: Any
) -> dict[str, float]:
    """Records host, eager (device) and graph times per call of `fn`; returns their p50s."""
    host = gc.host_time(fn, inner=inner, warmup=5, repeats=reps)
    eager = gc.device_time(fn, inner=inner, warmup=5, repeats=reps, host_us=float(np.median(host)))
    g = gc.capture(fn, inner=inner, stream=stream)
    graph = gc.graph_time(g, inner=inner, warmup=3, repeats=reps)
    out = {}
    for mode, s in (("host", host), ("eager", eager), ("graph", graph)):
        out[mode] = h.record(bench, {**case, "mode": mode}, s)["p50"]
    return out


def bench_stamp(h: Harness) -> None:
    why = gc.missing(
        "cuda",
        "triton",
        "gpupace.kernels.stamp:stamp",
        "gpupace.kernels.stamp:exit_stamper",
        "gpupace.kernels.stamp:row_finisher",
        "gpupace.kernels.spin:enterer",
    )
    if why:
        h.skip("stamp", why)
        return
    import torch

    from gpupace.kernels import spin, stamp

    dev = torch.device("cuda", torch.cuda.current_device())
    m = MAX_SITES
    row = torch.zeros(2 + 2 * m, dtype=torch.float32, device=dev)
    stamps = torch.zeros(m, 3, dtype=torch.int64, device=dev)
    clk = torch.zeros(2, dtype=torch.int64, device=dev)
    out = torch.zeros(64, dtype=torch.int64, device=dev)
    delay = torch.zeros(m, dtype=torch.float32, device=dev)  # zero delay: the fused kernel's floor
    usual = torch.full((m,), float("nan"), dtype=torch.float32, device=dev)
    # The engine's launchers (after their first call, no JIT): what a paced step pays.
    enter = spin.enterer(delay, usual, row, stamps, clk, cap_us=50_000.0)
    leave = stamp.exit_stamper(row, stamps, clk)
    kernels = {
        "stamp": lambda: stamp.stamp(out, 0, clk),
        "enter (arrive+spin(0)+enter)": lambda: enter(0),
        "exit_stamp": lambda: leave(0),
        "finish_row (once a step)": stamp.row_finisher(row, stamps, clk),
    }
    inner, reps = (20, 20) if h.quick else (50, 100)
    summary = {}
    with gc.side_stream() as s:
        for name, fn in kernels.items():
            fn()  # compile on this stream before any capture
            summary[name] = _three_ways(
                h, "stamp_kernels", {"kernel": name}, fn, inner=inner, reps=reps, stream=s
            )
    h.extras["stamp_kernels_p50_us"] = summary
    try:
        from gpupace.kernels.clock import measure_tick

        h.extras["timer_tick_ns"] = measure_tick(dev)
        h.progress(f"%globaltimer tick: {h.extras['timer_tick_ns']} ns")
    except Exception as e:  # noqa: BLE001 - the tick is context, not this benchmark's job
        h.progress(f"timer tick not measured: {type(e).__name__}: {e}")


def bench_spin(h: Harness) -> None:
    why = gc.missing("cuda", "triton", "gpupace.kernels.spin:spin")
    if why:
        h.skip("spin", why)
        return
    reps = 20 if h.quick else 200
    cap = 2 * max(SPIN_REQUESTS_US)
    table: dict[float, dict[str, np.ndarray]] = {}
    with gc.side_stream():
        gc.timed_spins(1.0, reps, cap)  # untimed: kernels loaded, the GPU's clocks up
        for req in SPIN_REQUESTS_US:
            t = table[req] = gc.timed_spins(req, reps, cap)
            case = {"requested_us": req}
            h.record("spin", {**case, "what": "applied (device clock)"}, t["applied"])
            h.record("spin", {**case, "what": "kernel time (events)"}, t["wall"])
            h.record("spin", {**case, "what": "error applied-requested"}, t["applied"] - req)
    tick_us = float(h.extras.get("timer_tick_ns", float("nan"))) * 1e-3
    # Judged on the events: the applied delay comes from the clock the spin stops on, so its
    # error stays within a tick by construction. Kernel time less the zero-delay spins' of the
    # same batch (the launch and the events' own cost) less the request.
    for req, t in table.items():
        h.record("spin", {"requested_us": req, "what": "error by events"},
                 gc.spin_event_error(t, req))
    worst = max(float(np.percentile(np.abs(gc.spin_event_error(t, r)), 99))
                for r, t in table.items() if r > 0)
    limit = (tick_us if np.isfinite(tick_us) else 1.0) + 1.0
    h.check(
        "spin-wait error p99, 1 to 1000 us (worst request), timed by CUDA events",
        worst,
        limit,
        "us",
        detail="limit: one timer tick + 1 us; error: kernel time less the same batch's "
        "zero-delay spins', less the request" + ("" if np.isfinite(tick_us) else " (tick unknown: taken as 1 us)"),
    )
    h.extras["spin"] = {
        str(r): {k: float(np.median(v)) for k, v in t.items()} for r, t in table.items()
    }
    h.plot("spin_requested_vs_applied", lambda fig: _draw_spin(fig, table))


def _draw_spin(fig, table: dict[float, dict[str, np.ndarray]]) -> None:
    ax = fig.add_subplot(1, 1, 1)
    req = np.array([r for r in table if r > 0])
    for key, marker, label in (
        ("applied", "o", "applied (device clock)"),
        ("wall", "s", "kernel time (CUDA events)"),
    ):
        med = np.array([np.median(table[r][key]) for r in req])
        lo = np.array([np.percentile(table[r][key], 1) for r in req])
        hi = np.array([np.percentile(table[r][key], 99) for r in req])
        ax.errorbar(req, med, yerr=[med - lo, hi - med], marker=marker, capsize=3, label=label)
    ax.plot(req, req, color="0.4", lw=0.8, ls="--", label="requested = applied")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("requested delay (us)")
    ax.set_ylabel("us (median, bars p1-p99)")
    z = table[0.0]
    ax.set_title(
        f"Spin-wait: requested against applied; at 0 us the kernel takes "
        f"{np.median(z['wall']):.2f} us (p50)"
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")


def _gathered(n: int, s: int, m: int, seed: int = 0):
    """A plausible gathered timing matrix [n, 2 + 2m] (float32) with `s` sites filled."""
    rng = np.random.default_rng(seed)
    g = np.full((n, 2 + 2 * m), np.nan, dtype=np.float32)
    g[:, 0] = s
    g[:, 1] = rng.normal(20_000.0, 500.0, n)
    g[:, 2 : 2 + s] = 300.0 + rng.exponential(400.0, (n, s))
    g[:, 2 + m : 2 + 2 * m] = 0.0
    return g


def bench_update(h: Harness) -> None:
    why = gc.missing(
        "cuda",
        "triton",
        "cupy",
        "gpupace.kernels.update:updater",
        "gpupace.kernels.reduce:reduce_rows",
        "gpupace.backends.device:DeviceEngine",
    )
    if why:
        h.skip("update", why)
        return
    import cupy
    import torch

    from gpupace import PaceConfig
    from gpupace.backends.device import DeviceEngine
    from gpupace.kernels import reduce, update

    worlds = [2, 64, 4096] if h.quick else UPDATE_WORLDS
    inner, reps = (10, 20) if h.quick else (20, 100)
    summary: dict[str, dict[str, float]] = {}
    with gc.side_stream() as s:
        stream_ptr = torch.cuda.current_stream().cuda_stream
        for n in worlds:
            # The engine allocates every buffer as the paced loop would; no process group is
            # needed to make them (world size n, this process plays rank 0).
            eng = DeviceEngine(PaceConfig(mode="pace"), None, 0, n)
            eng.gathered.copy_(torch.from_numpy(_gathered(n, UPDATE_SITES, eng.max_sites)))
            views = {k: cupy.from_dlpack(v) for k, v in eng.red.items()}
            gathered = cupy.from_dlpack(eng.gathered)
            dev_index = eng.device.index or 0
            reduce.warmup(stream_ptr, dev_index)

            def red(v=views, g=gathered, d=dev_index) -> None:
                reduce.reduce_rows(g, v, n_sites=UPDATE_SITES, stream_ptr=stream_ptr, device=d)

            # The engine's own launcher: after its first call, no JIT.
            launch = update.updater(eng.gathered, eng.row, eng.red, eng.state, eng.ring,
                                    eng.ring_step, eng.params, rank=0)

            def upd(launch=launch) -> None:
                launch(UPDATE_SITES)

            def both() -> None:
                red()
                upd()

            for name, fn in (
                ("cupy reduction", red),
                ("update kernel", upd),
                ("reduction + update", both),
            ):
                fn()
                p50 = _three_ways(
                    h,
                    "step_kernels",
                    {"world": n, "sites": UPDATE_SITES, "kernel": name},
                    fn,
                    inner=inner,
                    reps=reps,
                    stream=s,
                )
                summary[f"{n} {name}"] = p50
    h.extras["step_kernels_p50_us"] = summary
