"""A virtual cluster on one GPU: N CUDA streams in one process as N ranks, each with injected
compute skew, pacing kernels of its own and a device-side barrier (`kernels.barrier`) standing
in for the collective, optionally spinning on K CTAs as NCCL channels do. All stamps share one
device clock, so the true arrival spread is known and the clock-free estimator can be checked
against it; `spin_coupling` measures what spinning CTAs cost concurrent compute.

Limits: every wait is bounded by a timeout (a timed-out barrier raises `flag`, checked by
`results()`); N * (K + 1) must stay below the SM count so that every rank's kernels can be
resident at once. Eager only: the host launches each rank's kernels every step. Needs CUDA,
triton and cupy; nothing here runs on a CPU.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from . import policy
from .config import PaceConfig

MAX_RANKS = 32  # torch.cuda.Stream() cycles through a pool of 32 streams per priority


@dataclass(slots=True)
class ClusterResults:
    """Per step and site (us): the true arrival spread from shared-clock stamps, the estimate
    from the clock-free estimator, the entry spread after pacing, the exit spread, and the
    delays applied. The estimator takes every rank to leave a collective at once, so its error
    is at most that site's exit spread (README, "How it measures")."""

    true_spread: np.ndarray  # [steps, sites]
    est_spread: np.ndarray  # [steps, sites]
    true_entry_spread: np.ndarray  # [steps, sites]
    exit_spread: np.ndarray  # [steps, sites]
    n_valid: np.ndarray  # [steps]: rows the reduction found usable (a negative wait is not)
    delay: np.ndarray  # [steps, ranks, sites]
    timed_out: bool


class VirtualCluster:
    """N ranks as N streams on one GPU. `step(skew_us)` runs one training step: per rank a
    compute stand-in (a one-warp spin that ends `skew_us[i]` after the first rank's began, so
    that the host's launches, one rank after another, do not add to the skew), then for each
    site enter (arrive stamp, paced delay, enter stamp), the barrier, the exit stamp; then each
    rank's row from its stamps, the exchange (the rows already sit in one matrix), the CuPy
    reduction and the Triton update, as on a real rank."""

    def __init__(self, n_ranks: int, config: PaceConfig | None = None, *, n_sites: int = 1,
                 ctas: int = 1, timeout_us: float = 200_000.0, max_steps: int = 1024,
                 device: int | None = None):
        if not torch.cuda.is_available():
            raise RuntimeError("the virtual cluster needs CUDA")
        from gpupace.kernels import barrier, reduce, spin, stamp, update

        self._k = {"barrier": barrier, "reduce": reduce, "spin": spin, "stamp": stamp,
                   "update": update}
        self.device = torch.device("cuda", torch.cuda.current_device() if device is None else device)
        if self.device.index != torch.cuda.current_device():  # Triton launches on the current one
            raise ValueError(f"the virtual cluster runs on the current CUDA device, "
                             f"cuda:{torch.cuda.current_device()}; got device={device}: call "
                             f"torch.cuda.set_device({device}) first")
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        if n_ranks < 2 or n_ranks * (ctas + 1) >= sms:
            raise ValueError(f"need 2 <= n_ranks and n_ranks * (ctas + 1) < {sms} SMs so every "
                             f"rank's kernels are resident at once; got {n_ranks} ranks, {ctas} CTAs")
        if n_ranks > MAX_RANKS:
            raise ValueError(f"at most {MAX_RANKS} ranks: torch hands out {MAX_RANKS} streams per "
                             f"priority in turn, and two ranks on one stream deadlock at the "
                             f"barrier; got {n_ranks}")
        cfg = config if config is not None else PaceConfig(mode="observe")
        self.config, self.n, self.m, self.n_sites = cfg, n_ranks, cfg.max_sites, n_sites
        if not 1 <= n_sites <= self.m:
            raise ValueError(f"n_sites must be in [1, {self.m}], got {n_sites}")
        self.ctas, self.timeout_us, self.max_steps = ctas, float(timeout_us), max_steps
        self.params = policy.PolicyParams.from_config(cfg, n_ranks)
        n, m, dev = n_ranks, self.m, self.device
        f32, i32, i64 = torch.float32, torch.int32, torch.int64
        self.gathered = torch.zeros(n, 2 + 2 * m, dtype=f32, device=dev)
        self._reset_rows()
        self.scratch_row = torch.zeros(2 + 2 * m, dtype=f32, device=dev)
        self.clk = torch.zeros(n, 2, dtype=i64, device=dev)
        self.count = torch.zeros(m, dtype=i32, device=dev)
        self.flag = torch.zeros(1, dtype=i32, device=dev)
        self.applied = torch.zeros(n, dtype=f32, device=dev)
        self.reads = torch.zeros(n, dtype=i32, device=dev)
        self.red = reduce.outputs(n, m, dev)
        self.state = update.new_state(n, m, dev)  # every rank's, one program each
        self.stamps, self.usual = self.state["stamps"], self.state["usual"]
        self.ring = torch.zeros(16, update.record_len(n, m), dtype=f32, device=dev)
        self.ring_step = torch.full((16,), -1, dtype=i64, device=dev)
        self.arrive_hist = torch.zeros(max_steps, n, n_sites, dtype=i64, device=dev)
        self.enter_hist = torch.zeros(max_steps, n, n_sites, dtype=i64, device=dev)
        self.exit_hist = torch.zeros(max_steps, n, n_sites, dtype=i64, device=dev)
        self.est_hist = torch.zeros(max_steps, n_sites, dtype=f32, device=dev)
        self.valid_hist = torch.zeros(max_steps, dtype=i32, device=dev)
        self.delay_hist = torch.zeros(max_steps, n, n_sites, dtype=f32, device=dev)
        # each step's common start of the ranks' compute (kernels.spin.skew_spin), in rows of
        # two: each step's slot 16-byte aligned, as Triton specialises a pointer on that (an
        # odd step would compile another kernel between the ranks' launches)
        self.start_hist = torch.full((max_steps, 2), torch.iinfo(i64).max, dtype=i64, device=dev)
        self.streams = [torch.cuda.Stream(device=dev) for _ in range(n)]
        self._views = reduce.views({"gathered": self.gathered, **self.red})
        self.steps = 0

    def _reset_rows(self) -> None:
        m = self.m
        self.gathered[:, 0] = 0.0
        self.gathered[:, 1:2 + m] = float("nan")
        self.gathered[:, 2 + m:] = 0.0

    def step(self, skew_us: torch.Tensor) -> None:
        """One step. `skew_us`: float32 [N] on the device, each rank's compute time (us)."""
        if self.steps >= self.max_steps:
            raise RuntimeError(f"the history holds {self.max_steps} steps; make a new cluster")
        k, n, m = self._k, self.n, self.m
        main = torch.cuda.current_stream(self.device)
        start = main.record_event()
        cap = float(self.config.max_delay_us)
        ranks = list(enumerate(self.streams))
        # Phase by phase across ranks, not rank by rank: streams may share a hardware queue,
        # and a rank's exit stamp queued ahead of another rank's barrier would wait for a
        # barrier that cannot complete. It also compiles every kernel variant before the first
        # barrier of its phase is launched, so no barrier spins through a compile.
        common = self.start_hist[self.steps, :1]
        for i, s in ranks:
            s.wait_event(start)
            skew_us.record_stream(s)  # the caller's tensor stays alive until the spin has read it
            with torch.cuda.stream(s):
                k["spin"].skew_spin(skew_us[i:i + 1], common, self.applied[i:i + 1],
                                    self.reads[i:i + 1], self.clk[i], cap_us=1e6)
        for site in range(self.n_sites):
            for i, s in ranks:
                with torch.cuda.stream(s):
                    k["spin"].enter(self.state["delay"], self.usual[i], self.gathered[i],
                                    self.stamps[i], self.clk[i], site, delay_offset=i * m,
                                    cap_us=cap)
            for i, s in ranks:
                with torch.cuda.stream(s):
                    k["barrier"].barrier(self.count[site:site + 1], n * (self.steps + 1),
                                         self.flag, self.clk[i], ctas=self.ctas,
                                         timeout_us=self.timeout_us)
            for i, s in ranks:
                with torch.cuda.stream(s):
                    k["stamp"].exit_stamp(self.gathered[i], self.stamps[i], self.clk[i], site)
        for i, s in ranks:  # each rank's row from its stamps, as a rank's step() begins
            with torch.cuda.stream(s):
                k["stamp"].finish_row(self.gathered[i], self.stamps[i], self.clk[i])
        done = [s.record_event() for s in self.streams]
        for ev in done:
            main.wait_event(ev)
        ns = self.n_sites
        self.arrive_hist[self.steps].copy_(self.stamps[:, :ns, 0])
        self.enter_hist[self.steps].copy_(self.stamps[:, :ns, 1])
        self.exit_hist[self.steps].copy_(self.stamps[:, :ns, 2])
        self.delay_hist[self.steps].copy_(self.gathered[:, 2 + m:2 + m + ns])
        v = self._views
        k["reduce"].reduce_rows(v["gathered"], v, n_sites=ns, stream_ptr=main.cuda_stream,
                                device=self.device.index or 0)
        self.est_hist[self.steps].copy_(self.red["site"][1, :ns])
        self.valid_hist[self.steps].copy_(self.red["n_valid"][0])
        k["update"].update(self.gathered, self.scratch_row, self.red, self.state, self.ring,
                           self.ring_step, self.params, n_sites=ns, rank=0)
        self._reset_rows()
        self.steps += 1

    def results(self) -> ClusterResults:
        """Synchronises and returns the history of the steps run so far."""
        torch.cuda.synchronize(self.device)
        s = self.steps
        # Differences first, in int64: `%globaltimer` counts ns since 1970 (~1.8e18), where a
        # float64 holds only multiples of 256 ns. Converted before subtracting, the stamps
        # made the truth up to ~0.5 us wrong, most likely the estimate's 0.25-0.32 us "excess"
        # over its exact bound on the H200 of 2026-11-30 (not yet rerun on a GPU).
        base = self.arrive_hist[:s].min() if s else 0

        def us(hist: torch.Tensor) -> np.ndarray:
            return (hist[:s] - base).double().cpu().numpy() / 1e3

        a, e, x = us(self.arrive_hist), us(self.enter_hist), us(self.exit_hist)
        return ClusterResults(
            true_spread=a.max(axis=1) - a.min(axis=1),
            est_spread=self.est_hist[:s].double().cpu().numpy(),
            true_entry_spread=e.max(axis=1) - e.min(axis=1),
            exit_spread=x.max(axis=1) - x.min(axis=1),
            n_valid=self.valid_hist[:s].cpu().numpy(),
            delay=self.delay_hist[:s].double().cpu().numpy(),
            timed_out=bool(self.flag.item()),
        )


def spin_coupling(ctas: tuple[int, ...] = (1, 8, 32), size: int = 4096, reps: int = 20,
                  warps: int = 16, device: int | None = None,
                  backoffs_ns: tuple[int, ...] = (256, 2048), rounds: int = 5,
                  window_ms: float = 10.0) -> dict[str, float]:
    """Compute throughput (TFLOP/s, bf16 on one stream) alone, while a barrier that nobody
    else reaches spins on K CTAs of `warps` warps on another stream (an early rank's NCCL
    kernel: one 512-thread CTA per channel by default), and while a one-warp spin of the same
    length runs instead (a paced rank), tight or sleeping each of `backoffs_ns` between its
    clock reads (`kernels.spin.spin`'s backoff: does the tight loop cost more than one warp's
    share of the SMs?); and the couplings the simulator takes
    (`gpupace.sim.scenario.H200_BMM_COUPLING` and `H200_MM_COUPLING`, of five runs), the
    fraction of throughput lost, 1 - with / alone. Each throughput is the median of `rounds`
    timings of at least `window_ms` (`reps` loads or more), the rounds taking every case in
    turn, each round from another case, each case after the same rest (the GPU idle for the
    length of a spinner's hold, as after a spinner: a rested GPU may run faster), and `nothing`
    is a control: a timing with no spinner, taken as "alone" is, whose coupling says how far
    timings alone scatter (the runs of 2026-11-30 took one timing of ~1 ms a case: the
    one-warp coupling scattered 1.2-6.0% over five runs). `{load}spinners_held` says whether
    every spinner outlasted the window timed beside it (a spin's applied delay, a barrier's
    timeout): a load slowed more than 3x would outlast it.
    Two loads, keys prefixed by theirs: `mm`, [size x size] matmuls, whose cuBLAS kernels on
    Hopper may be persistent (one CTA per SM, each looping over tiles), so that a CTA slowed
    beside a spinner becomes the kernel's tail; and `bmm`, batched small matmuls whose grid is
    many times the SM count, which take what SMs are free: the premise's figure. Also
    `spin_hold_us` and `reps` per load: each spinner outlasts its load's window 3x.
    Synchronises."""
    from gpupace.kernels import barrier, spin

    dev = torch.device("cuda", torch.cuda.current_device() if device is None else device)
    if dev.index != torch.cuda.current_device():  # Triton launches on the current device
        raise ValueError(f"spin_coupling runs on the current CUDA device, "
                         f"cuda:{torch.cuda.current_device()}; got device={device}")
    if rounds < 1 or reps < 1 or not window_ms > 0:
        raise ValueError(f"rounds and reps must be >= 1 and window_ms > 0, got {rounds}, "
                         f"{reps}, {window_ms}")
    side = torch.cuda.Stream(device=dev)
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    batch, small = 512, 256  # 512 x 64 tiles of 32 x 32 at least: many times any SM count
    p = torch.randn(batch, small, small, device=dev, dtype=torch.bfloat16)
    q = torch.randn(batch, small, small, device=dev, dtype=torch.bfloat16)
    from gpupace.kernels.spin import HARD_CAP_US

    loads = {"mm": (lambda: torch.mm(a, b), 2.0 * size ** 3),
             "bmm": (lambda: torch.bmm(p, q), 2.0 * batch * small ** 3)}  # flops a call
    clk = torch.zeros(2, dtype=torch.int64, device=dev)
    applied = torch.zeros(1, dtype=torch.float32, device=dev)
    reads = torch.zeros(1, dtype=torch.int32, device=dev)
    out: dict[str, float] = {}
    for name, (load, flops_per_call) in loads.items():
        def timed(n: int, load=load) -> float:
            t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            t0.record()
            for _ in range(n):
                load()
            t1.record()
            t1.synchronize()
            return t0.elapsed_time(t1) * 1e-3

        timed(reps)  # warm-up: cuBLAS handles, clocks
        calls = max(reps, math.ceil(window_ms * 1e-3 * reps / timed(reps)))
        flops = flops_per_call * calls
        window_s = timed(calls)
        hold_us = 3 * window_s * 1e6  # the spinner outlasts the load
        if hold_us >= HARD_CAP_US:
            raise ValueError(f"a spinner must outlast its window 3x within the spin's hard cap "
                             f"({HARD_CAP_US:.0f} us): window_ms must be under "
                             f"{HARD_CAP_US / 3e3:.0f}, got {window_ms} ({name}: "
                             f"{window_s * 1e3:.1f} ms)")
        delay = torch.tensor([hold_us], dtype=torch.float32, device=dev)
        # Each spinner's start returns how long it spun (us, on the device): a spinner held
        # when that outlasted the window timed beside it, which a slowed load lengthens.

        def barrier_of(k: int, hold_us: float = hold_us):
            def start() -> torch.Tensor:
                count = torch.zeros(1, dtype=torch.int32, device=dev)
                flag = torch.zeros(1, dtype=torch.int32, device=dev)  # 1: held to its timeout
                barrier.barrier(count, 1 << 30, flag, clk, ctas=k, warps=warps,
                                timeout_us=hold_us)
                return flag.float() * hold_us
            return start

        def spin_of(backoff: int, delay: torch.Tensor = delay, hold_us: float = hold_us):
            def start() -> torch.Tensor:
                spin.spin(delay, applied, reads, clk, cap_us=hold_us, backoff_ns=backoff)
                return applied.clone()
            return start

        cases = {"alone": None, "with_nothing": None}  # the second: the control
        cases.update({f"with_{k}_cta_spin": barrier_of(k) for k in ctas})
        cases["with_one_warp_spin"] = spin_of(0)
        cases.update({f"with_one_warp_spin_sleep_{ns}ns": spin_of(ns) for ns in backoffs_ns})
        for launch in cases.values():  # compiled before any timing
            if launch is not None:
                launch()
        torch.cuda.synchronize(dev)
        held: list[bool] = []  # per spinner timing: it outlasted its window
        keys = list(cases)
        times: dict[str, list[float]] = {key: [] for key in keys}
        for r in range(rounds):
            for key in keys[r % len(keys):] + keys[:r % len(keys)]:
                time.sleep(hold_us * 1e-6)  # the same rest before every case
                launch, spun_us = cases[key], None
                if launch is not None:
                    with torch.cuda.stream(side):
                        spun_us = launch()
                window = timed(calls)
                times[key].append(window)
                torch.cuda.synchronize(dev)  # the spinner ends before the next case
                if spun_us is not None:
                    held.append(float(spun_us.item()) >= window * 1e6)
        got = {key: flops / float(np.median(t)) / 1e12 for key, t in times.items()}
        prefix = "" if name == "mm" else f"{name}_"  # the mm keys as before
        out[f"{prefix}spin_hold_us"] = hold_us
        out[f"{prefix}reps"] = calls
        out[f"{prefix}spinners_held"] = all(held)
        out.update({f"{prefix}matmul_{k}_tflops": v for k, v in got.items()})
        out.update({f"{prefix}coupling_{k[5:]}": 1.0 - v / got["alone"]
                    for k, v in got.items() if k.startswith("with_")})
    return out
