"""Calibration: a scenario fitted to a recorded telemetry file, and the `paper` preset's fit.

`fit_telemetry(path)` reads a run (from `gpupace demo`, a real job or the simulator), leaves
out the warm-up steps its header names (`telemetry.first_measured_step`: compilation, DDP's
bucket rebuild; read as stalls, they made a review's demo fit predict CV 0.45 for a run of 0.13),
and fits:
  sites              the most common site count per step (DDP's step 0 shows one bucket);
  exposed comm       the median transfer (the last rank's wait at the site of largest
                     spread), kept as a fixed cost per step;
  locality           each rank's median lateness behind the earliest rank (spread - earliness
                     at the site of largest spread), as a per-rank fixed offset;
  jitter             the robust spread (MAD) of each rank's lateness about its median, as
                     log-normal compute noise of that sd, and lateness beyond 6 robust sigmas
                     as Pareto stalls from that threshold (rate, and shape by Hill's estimator);
  before backward    the share of those offsets from before the backward (an input pipeline:
                     the spread is there in full at the first site) rather than through it
                     (it grows site by site), one share for every rank, where noise lets the
                     file's profile tell (`_input_share`);
  compute per step   the fastest rank's, set so that the fitted job simulated at its own size
                     has the file's median step time (up to 64 ranks, one simulated node);
  samples per rank   the header's `samples_per_step` / world size.
Limits, bluntly: fabric contention, regimes and the coupling are not fitted (a few ranks on
one host show none of them; a coupling given to `fit_telemetry` is matched with); the
gradient size is not in the file, so buckets keep `bucket_mb` and their number is the file's
site count; the exposed communication does not grow with node count; noise on a host with more ranks than cores is neither log-normal nor Pareto,
and variation of the collectives themselves is not fitted. On 8 demo files (4 ranks on 2
cores, 2026-11-30) the fit at the job's own size gave throughput within 9% of the file's and
step-time CV within 0.15 of it (0.15-0.55 for files of 0.21-0.50). Ranks past the file's
world size reuse its offsets by `rank % world_size`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..telemetry import (
    StepRecord,
    comm_backend,
    first_measured_step,
    header_batch,
    read_telemetry,
    unended,
)
from .scenario import MAX_SPIKE_CLIP, Scenario

SPIKE_SIGMAS = 6.0  # lateness beyond this many robust sigmas counts as a stall
# The Scenario fields `TelemetryFit.scenario` sets from the fit: not `given` (a given one
# overrode the fit: forward_us moved nothing the matching of compute moved).
FITTED_FIELDS = ("name", "nodes", "gpus_per_node", "samples_per_rank", "forward_us",
                 "backward_ratio", "optimizer_us", "grad_mb", "bucket_mb", "noise_sigma",
                 "spike_prob", "spike_us", "spike_alpha", "spike_clip", "locality_pattern_us",
                 "input_pattern_us")
PAPER_TARGET_CV = 0.22  # the study's baseline step-time CV at 64 nodes
PAPER_TARGET_THROUGHPUT = 8200.0  # the study's baseline samples/s at 64 nodes
DEFAULT_SAMPLES_PER_RANK = Scenario.__dataclass_fields__["samples_per_rank"].default
DEFAULT_SPIKE_ALPHA = Scenario.__dataclass_fields__["spike_alpha"].default
# Below this a fitted Pareto shape from a handful of stalls has no usable mean (alpha 1 none).
MIN_SPIKE_ALPHA = 1.2
MAX_GPUS_PER_NODE = 64  # Scenario's limit: the job is simulated at its size as one node
MATCH_ROUNDS = 2  # a second round takes up the noise refitted to the first's compute
MATCH_STEPS = 400  # ~0.1 s at 4 ranks
PROFILE_STEPS = 1000  # each of the two profiles simulated: ~0.2 s at 8 ranks x 4 sites
# The most a share may be uncertain (standard error) to be fitted. On 16 simulated files of 8
# ranks x 4 sites, 300 steps (noise 0-0.2, one rank 2 or 8 ms late before or through the
# backward), the 9 within it read their side (before: 1.00-1.41, clipped to 1; through:
# 0.00-0.14); of the 7 beyond it (0.20 to 4.7), 4 read the wrong side.
PROFILE_SE = 0.15


@dataclass(slots=True)
class TelemetryFit:
    """What `fit_telemetry` measured; `scenario(nodes, gpus_per_node)` simulates it at scale."""

    source: str
    world_size: int
    sites: int
    steps: int
    warmup_steps: int  # steps at the start left out of the fit
    samples_per_rank: float
    compute_us: float  # the fastest rank's, forward and backward
    exposed_comm_us: float  # one collective's median time, a fixed cost per simulated step
    offsets_us: tuple[float, ...]
    noise_sigma: float
    spike_prob: float
    spike_us: float
    spike_alpha: float
    spike_clip: float = 100.0  # the longest stall in the file, in units of spike_us
    input_share: float = 0.0  # of each offset, the part from before the backward (0 to 1)
    stamped: str = "stream"  # where the file's arrivals were stamped (`stamps`)
    notes: list[str] = field(default_factory=list)
    given: dict[str, Any] = field(default_factory=dict)  # Scenario fields given, not fitted

    def scenario(self, nodes: int, gpus_per_node: int = 8, **changes: Any) -> Scenario:
        """The fitted job at `nodes` x `gpus_per_node` ranks, with the fields it was fitted
        with (`given`); `changes` set any other `Scenario` field."""
        return Scenario(**self.fitted(nodes, gpus_per_node)).replace(**{**self.given, **changes})

    def fitted(self, nodes: int, gpus_per_node: int) -> dict[str, Any]:
        """The `Scenario` fields the fit sets (FITTED_FIELDS)."""
        return dict(
            name=f"fit:{self.source}", nodes=nodes, gpus_per_node=gpus_per_node,
            samples_per_rank=self.samples_per_rank,
            forward_us=self.compute_us / 3.0, backward_ratio=2.0,
            # the file's exposed communication stays a fixed cost after the last collective
            # (the fabric model's own transfers come on top): the file cannot say how it
            # would grow with the node count
            optimizer_us=self.exposed_comm_us,
            grad_mb=25.0 * self.sites, bucket_mb=25.0,
            noise_sigma=min(self.noise_sigma, 2.0), spike_prob=self.spike_prob,
            spike_us=max(self.spike_us, 1.0), spike_alpha=self.spike_alpha,
            spike_clip=self.spike_clip,
            locality_pattern_us=tuple((1.0 - self.input_share) * v for v in self.offsets_us),
            input_pattern_us=tuple(self.input_share * v for v in self.offsets_us),
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def late(self) -> np.ndarray:
        """Which ranks are steadily late, bool per rank: at fewer than SMALL_WORLD ranks, an
        offset of MIN_OFFSET_US or more (a lower half of 2 gives no noise to cut by); else 6 sd
        above the lower half of the offsets, the on-time ranks' (their noise from that half's
        spread: a half-normal's sd is 0.603 of the whole's). Not the noise every rank's median
        lateness behind the earliest one holds (75 "late" of 128 with 32 truly so, by a cut at
        100 us); not a median-based cut, which sat between the groups with half the ranks late
        and named none; not the lower tail's quantiles alone, which named some in 1 seed of 100
        of noise alone."""
        offsets = np.asarray(self.offsets_us, dtype=np.float64)
        if offsets.size < SMALL_WORLD:
            return offsets >= MIN_OFFSET_US
        low = offsets[offsets <= np.median(offsets)]
        sd = float(np.std(low)) / 0.603
        return offsets >= max(MIN_OFFSET_US, float(low.max()) + 6.0 * sd)

    def describe(self) -> str:
        """The fit in one line (`to_dict` holds every rank's offset: 10 KB at 512 ranks)."""
        offsets = np.asarray(self.offsets_us, dtype=np.float64)
        late = offsets[self.late()]
        if offsets.size < SMALL_WORLD:  # each offset said
            named = [f"rank {r} {_us(offsets[r])}" for r in np.flatnonzero(self.late())]
            ranks = ("steady offsets behind the earliest rank: " + ", ".join(named)) if named \
                else "no steady offset"
        else:
            ranks = (f"{late.size} rank{'s' if late.size != 1 else ''} steadily late (up to "
                     f"{late.max() / 1e3:.1f} ms)") if late.size else "no steadily late rank"
        stalls = (f"stalls on {100 * self.spike_prob:.2f}% of rank-steps (from "
                  f"{_us(self.spike_us)} to {_us(self.spike_us * self.spike_clip)}, tail "
                  f"{self.spike_alpha:.1f})") if self.spike_prob > 0 else "no stalls"
        if round(100 * self.input_share) > 0 and late.size:
            how = "" if self.given.get("coupling") else ", read without a coupling"
            ranks += f" ({100 * self.input_share:.0f}% of it from before the backward{how})"
        return (f"{self.world_size} ranks, {self.sites} site{'s' if self.sites != 1 else ''}, "
                f"{self.steps} steps ("
                f"{self.warmup_steps} of warm-up left out): compute {self.compute_us / 1e3:.1f} ms, "
                f"exposed communication {self.exposed_comm_us / 1e3:.1f} ms, compute noise "
                f"{100 * self.noise_sigma:.1f}% (log-normal sigma), {stalls}, {ranks}")


# Fewer ranks: the fit's description gives each rank's offset. At 4, the on-time half was 2
# offsets, and their spread put the cut for "late" at 23 ms, above a rank modelled 17 ms late.
SMALL_WORLD = 8
MIN_OFFSET_US = 100.0  # an offset below this is not called steady (the file's noise)


def _us(v: float) -> str:
    return f"{v / 1e3:.1f} ms" if v >= 1000.0 else f"{v:.0f} us"


def fit_telemetry(path: str | os.PathLike, **given: Any) -> TelemetryFit:
    """Fits compute, locality offsets and jitter from a telemetry file (see the module doc).
    `given`: `Scenario` fields the job has that no file shows, e.g. `coupling=NCCL_COUPLING,
    paced_coupling=SPIN_COUPLING` (measured on an H200): the compute is matched to the file's
    step time with them (fitted without, a noisy 4-rank job given the persistent coupling ran
    1.1-1.7% slower than its file), and the fit's scenarios keep them. Raises ValueError when
    the file has too few usable steps or ranks, or naming a bad field."""
    fitted = sorted(set(given) & set(FITTED_FIELDS))
    if fitted:
        raise ValueError(f"fit_telemetry fits or sets {', '.join(fitted)} itself; give it only "
                         "what no file shows (a coupling, pacing's cost, the fabric), or pass "
                         "changes to the fit's scenario()")
    Scenario().replace(**given)  # a bad field or value, before the file is read
    tel = read_telemetry(path)
    warmup = first_measured_step(tel.header)
    # the steps left out, as the report counts them: a resumed job's file starts past 0
    left_out = max(0, warmup - min((r.step for r in tel.records), default=warmup))
    recs = [r for r in tel.records if r.step >= warmup]
    recs = [r for r in recs if len(r.earliness_us) >= 2 and math.isfinite(r.spread_us)]
    if len(recs) < 10:
        why = (f"; {len(tel.skipped)} lines skipped, first: {tel.skipped[0]}"
               if tel.skipped else "")
        raise ValueError(f"{path}: need at least 10 steps with 2+ ranks after the warm-up "
                         f"(steps before {warmup}) to fit, got {len(recs)}{why}")
    n = len(recs[-1].earliness_us)
    recs = [r for r in recs if len(r.earliness_us) == n and len(r.wait_us) == n]
    step = np.array([r.step_time_us for r in recs], dtype=np.float64)
    step = step[np.isfinite(step) & (step > 0)]
    if step.size < 5:
        raise ValueError(f"{path}: need at least 5 finite step times to fit, got {step.size}")
    # one collective's time, the last rank's wait at one site: what a step exposes after its
    # last bucket when the backward hides the others, as the simulator models it (the sum over
    # sites, 60 ms of a 93 ms demo step, left the compute and its noise no room)
    transfer = np.array([r.transfer_us for r in recs], dtype=np.float64)
    transfer = transfer[np.isfinite(transfer)]
    exposed = float(np.median(transfer)) if transfer.size else 0.0
    spread = np.array([r.spread_us for r in recs], dtype=np.float64)
    early = np.array([r.earliness_us for r in recs], dtype=np.float64)
    late = spread[:, None] - early  # [K, N], how far behind the earliest rank
    known = np.isfinite(late).any(axis=0)
    if not known.any():
        raise ValueError(f"{path}: no rank's earliness is known in any step: nothing to fit")
    with warnings.catch_warnings():  # a rank never known: All-NaN slice, offset 0 below
        warnings.simplefilter("ignore", RuntimeWarning)
        med = np.nanmedian(late, axis=0)
    offsets = np.where(known, np.maximum(med - np.nanmin(med), 0.0), 0.0)
    # a step ends with its last rank: the fastest rank's compute is the rest (a first guess)
    compute = max(float(np.median(step)) - exposed - float(offsets.max()), 1.0)
    notes = []  # the warm-up left out is in `describe()`
    if not known.all():
        never = np.flatnonzero(~known)
        notes.append(f"{never.size} rank(s) never known (invalid rows), given no offset: "
                     f"{', '.join(map(str, never[:8]))}{' ...' if never.size > 8 else ''}")
    if n == 2:
        notes.append("2 ranks: each is the earliest in about half of the steps, where its "
                     "lateness reads 0, so the noise fits low and the two medians can differ by "
                     "an offset that is noise; fit from a run of 4 ranks or more where you can")
    if tel.skipped:
        notes.append(f"{len(tel.skipped)} unreadable lines skipped, first: {tel.skipped[0]}")
    if header_batch(tel.header) is None:
        notes.append(f"the file gives no batch size (samples_per_step): samples/s assume "
                     f"{DEFAULT_SAMPLES_PER_RANK:g} samples a rank a step; the changes hold")
    if tel.header.get("end_mark") and tel.end is None:  # as the report says it
        notes.append(unended(tel.records[-1].step))
    elif tel.end is not None and str(tel.end.get("how", "")).startswith("error"):
        notes.append(f"the run ended on an error ({str(tel.end['how']).removeprefix('error: ')})")
    if tel.header.get("source") == "pacer":
        notes.append("recorded by a Pacer, whose stamps and step exchange run in observe mode "
                     "too: the file's job paid their cost, which the fitted job keeps in its "
                     "none row; its gpupace and oracle rows pay --pacing-cost's on top")
    stamped = stamps(tel.header)
    if stamped == "hook":
        notes.append("a host backend's file: each collective's time (the last rank's wait) "
                     "counts its wait behind the collectives before it, so the exposed "
                     "communication may read long and the compute short")
    calm = calm_steps(recs, notes)
    fit = TelemetryFit(
        source=str(tel.header.get("label") or tel.header.get("source") or "telemetry"),
        world_size=n, sites=steady_site_count(recs, tel.header), steps=len(recs),
        warmup_steps=left_out, samples_per_rank=samples_per_rank(tel.header, n),
        compute_us=compute, exposed_comm_us=exposed,
        offsets_us=tuple(float(v) for v in offsets), noise_sigma=0.0, spike_prob=0.0,
        spike_us=1000.0, spike_alpha=DEFAULT_SPIKE_ALPHA, notes=notes, given=dict(given),
        stamped=stamped,
    )
    resid = late - med[None, :]
    fit = _with_compute(fit, compute, resid)
    share = _input_share(fit, site_spreads(calm, fit.sites))
    fit = dataclasses.replace(fit, input_share=share)
    return _match_median(fit, resid, float(np.median(step)))


def calm_steps(records: list[StepRecord], notes: list[str]) -> list[StepRecord]:
    """The steps to read the share of lateness from before the backward from: those without a
    delay where they are half or more, else all (a delay moves the compute and arrivals after
    it: a demo's paced files read 1.7-2.0 of the way to 'before'; a paced run's 10 undelayed
    warm-up steps of 300 read 0.90 where all read 0.98). A paced run is said in `notes`."""
    delayed = [bool(np.nansum(r.delay_us) > 0) for r in records]
    calm = [r for r, d in zip(records, delayed, strict=True) if not d]
    calm = calm if len(calm) >= max(10, len(records) / 2) else records
    if any(delayed):
        read = "its steps without one" if calm is not records else \
            "all its steps, which may read past it (then taken as all from before)"
        notes.append(f"a paced run (delays in {sum(delayed)} of its {len(records)} steps): the "
                     "delays moved the compute and arrivals after them; the share of lateness "
                     f"from before the backward is read from {read}; a run of the job unpaced "
                     "(observe mode, as the demo's baseline) fits the job itself")
    return calm


def _with_compute(fit: TelemetryFit, compute: float, resid: np.ndarray) -> TelemetryFit:
    """`fit` with `compute` us per step and its jitter refitted to it (noise is relative)."""
    sigma, prob, scale, alpha, clip = _fit_jitter(resid, compute, fit.sites)
    return dataclasses.replace(fit, compute_us=compute, noise_sigma=sigma, spike_prob=prob,
                               spike_us=scale, spike_alpha=alpha, spike_clip=clip)


def site_spreads(records: list[StepRecord], sites: int) -> np.ndarray | None:
    """[steps, sites]: the arrival spread at each site of the steps with `sites` sites (and
    every one measured), or None for fewer than 10 such steps."""
    rows = [r.site_spread_us for r in records if len(r.site_spread_us) == sites]
    rows = np.asarray(rows, dtype=np.float64).reshape(-1, sites)
    rows = rows[np.isfinite(rows).all(axis=1)]
    return rows if len(rows) >= 10 else None


def _slope(spreads: np.ndarray) -> float:
    """How fast the median spread grows from site to site (least squares), [steps, sites]."""
    profile = np.median(spreads, axis=0)
    return float(np.polyfit(np.arange(profile.size), profile, 1)[0])


def stamps(header: dict[str, Any]) -> str:
    """Where a file's arrivals were stamped (`simulate`'s `stamped`): "hook" for the host
    backend's and a simulated run's stamped so, else "stream" (the device backend's). A
    pacer's header from before `pacer_backend` (2026-11-30) is the host backend's where its
    group was gloo or its torch a CPU build, as the device backend needs neither."""
    backend = header.get("pacer_backend")
    if backend is None and header.get("source") == "pacer" and comm_backend(header) == "gloo":
        backend = "host"
    sim = header.get("sim")
    hook = backend == "host" or (isinstance(sim, dict) and sim.get("stamped") == "hook")
    return "hook" if hook else "stream"


def _input_share(fit: TelemetryFit, spreads: np.ndarray | None) -> float:
    """Of each late rank's offset, the share from before the backward (an input pipeline),
    from how the file's spread grows over the sites. A handicap through the backward makes a
    late rank fall behind site by site (1000, 1333, 1667, 2000 us at 4 sites for 2 ms);
    lateness from before it is there in full from the first site (2000 at each where arrivals
    are stamped at DDP's hook, as the host backend does; on the stream an early rank's arrival
    waits for the collective before, so a rank later than a bucket's compute shows about that
    after the first site). Noise grows the spread too, so the two are simulated
    with the fitted noise, stamped as the file's were, and the file's growth is placed between
    theirs. 0 (a handicap), with a note, where that place is uncertain (a bootstrap's standard
    error over PROFILE_SE of the way: the file's noise). Read with the coupling the fit was
    given, or none: a coupling slows the early ranks that wait, which moves the profiles (a
    stream-stamped file of one rank 2 ms late from its input, no noise, read 1.00 without one
    and 0.73 with the batched one measured on an H200; a hook-stamped one, 1.00 and 0.82)."""
    from .simulate import simulate

    if fit.sites < 2 or not fit.late().any():
        return 0.0  # one site: the two arrive alike there, and nothing overlaps after it
    unread = "late ranks simulated as falling behind through the backward: "
    if spreads is None:
        fit.notes.append(unread + "fewer than 10 steps measured the spread at every site")
        return 0.0
    if fit.world_size > MAX_GPUS_PER_NODE:
        fit.notes.append(unread + f"{fit.world_size} ranks do not fit one simulated node (at "
                         f"most {MAX_GPUS_PER_NODE}) to tell lateness from before it")
        return 0.0
    rng = np.random.default_rng(0)
    se = float(np.std([_slope(spreads[rng.integers(0, len(spreads), len(spreads))])
                       for _ in range(200)]))
    growth = []
    for share in (0.0, 1.0):
        sc = dataclasses.replace(fit, input_share=share).scenario(1, fit.world_size)
        res = simulate(sc, "none", steps=PROFILE_STEPS, seed=0, stamped=fit.stamped)
        growth.append(_slope(res.spread_us[PROFILE_STEPS // 10:]))
    way = growth[0] - growth[1]
    if way <= 0 or se > PROFILE_SE * way:
        fit.notes.append(unread + "the file's noise hides whether the late ranks are late from "
                         "before it (a slow input pipeline, whose wait the peers' collectives "
                         "turn into lateness under a coupling) or fall behind through it")
        return 0.0
    return float(min(max((growth[0] - _slope(spreads)) / way, 0.0), 1.0))


def _match_median(fit: TelemetryFit, resid: np.ndarray, target_us: float) -> TelemetryFit:
    """Moves compute until the fitted job, simulated at its own size, has the file's median
    step: the first guess counts the slowest rank's noise once in the median and the
    simulation adds it again (+5.7% at 4 ranks, noise sigma 0.1, no offsets)."""
    from .simulate import simulate

    if fit.world_size > MAX_GPUS_PER_NODE:
        fit.notes.append(f"median step not matched by simulation: {fit.world_size} ranks do "
                         f"not fit one simulated node (at most {MAX_GPUS_PER_NODE})")
        return fit
    for _ in range(MATCH_ROUNDS):
        res = simulate(fit.scenario(1, fit.world_size), "none", steps=MATCH_STEPS, seed=0)
        got = float(np.nanmedian(res.step_us))
        fit = _with_compute(fit, max(fit.compute_us + target_us - got, 1.0), resid)
    return fit


def steady_site_count(records: list[StepRecord], header: dict[str, Any]) -> int:
    """Paced sites per step, the most common count once warmed up: DDP rebuilds its buckets
    after the first step, so step 0 shows one site where the demo paces three."""
    counts = Counter(len(r.site_spread_us) for r in records if len(r.site_spread_us))
    if counts:
        return max(counts.most_common(1)[0][0], 1)
    return max(len(header.get("sites") or []), 1)


def samples_per_rank(header: dict[str, Any], world_size: int) -> float:
    """The header's batch size a rank (`telemetry.header_batch`); Scenario's default without
    one."""
    known = header_batch(header)
    if known is None:
        return DEFAULT_SAMPLES_PER_RANK
    per, value = known
    return value / world_size if per == "step" else value


def _fit_jitter(resid: np.ndarray, compute: float,
                sites: int) -> tuple[float, float, float, float, float]:
    """(noise sigma, spike probability, spike scale, spike alpha, spike clip) from each
    rank's lateness about its median, [K, N]: the robust spread as log-normal noise, the
    outliers as Pareto stalls, none longer than the longest in the file (Hill's shape from a
    handful of stalls is loose: unclipped past them, a 50 ms demo job drew 5 s stalls at 256
    ranks, and its CV moved from 0.95 to 0.78 with the seed)."""
    mad = float(np.nanmedian(np.abs(resid - np.nanmedian(resid))))
    sd_step = 1.4826 * mad
    # a step's lateness sums 1 forward and `sites` backward buckets, each log-normal with
    # mean 1 and relative sd r = sqrt(exp(sigma^2) - 1): matched exactly, not as sigma ~ r,
    # which overstates a noisy host's spread (sigma = 1 gives r = 1.31, sigma = 2 gives 7.3)
    fwd, bucket = compute / 3.0, 2.0 * compute / 3.0 / sites
    r = sd_step / math.sqrt(fwd ** 2 + sites * bucket ** 2)
    sigma = math.sqrt(math.log1p(r * r))
    # a floor of 0.1% of compute, so a noise-free run does not read rounding as stalls
    threshold = max(SPIKE_SIGMAS * sd_step, 1e-3 * compute)
    big = resid[resid > threshold]
    if big.size == 0:
        return float(sigma), 0.0, 1000.0, DEFAULT_SPIKE_ALPHA, 1.0
    # Pareto from the threshold, its shape by maximum likelihood (Hill): on three demo files
    # of CV 0.50, 0.21 and 0.37 the fitted shape gave 0.55, 0.15 and 0.22, a shape fixed at
    # 1.5 gave 0.88, 0.31 and 0.37 (2-core VM, 2026-11-30)
    alpha = big.size / float(np.sum(np.log(big / threshold)))
    alpha = min(max(alpha, MIN_SPIKE_ALPHA), 10.0)
    # at most Scenario's bound: one 100 s checkpoint write in a 30 ms job is 2.8e6 scales
    clip = min(float(big.max() / threshold), MAX_SPIKE_CLIP)
    return float(sigma), big.size / resid.size, threshold, alpha, clip


def fit_paper(steps: int = 3000, seed: int = 0, lo: float = 0.2, hi: float = 3.0,
              iters: int = 8) -> dict[str, float]:
    """Bisects the `paper` preset's scale until the BASELINE (policy none) step-time CV at 64
    nodes is PAPER_TARGET_CV, then sets samples per rank so that its throughput is the study's
    8200 samples/s. Only the baseline is fitted. Returns the fitted figures; copy them into
    `presets.PAPER_SCALE` and `PAPER_SAMPLES`. Takes minutes."""
    from .presets import paper
    from .simulate import simulate

    def cv(scale: float) -> tuple[float, float]:
        s = simulate(paper(64, scale=scale), "none", steps=steps, seed=seed).summary(skip=0)
        return s["step_time_cv"], s["step_time_mean"]

    for _ in range(iters):  # CV rises with the scale
        mid = 0.5 * (lo + hi)
        if cv(mid)[0] < PAPER_TARGET_CV:
            lo = mid
        else:
            hi = mid
    scale = 0.5 * (lo + hi)
    got_cv, mean_us = cv(scale)
    samples = PAPER_TARGET_THROUGHPUT * mean_us / 1e6 / (64 * 8)
    return {"scale": scale, "cv": got_cv, "step_time_mean_us": mean_us,
            "samples_per_rank": samples, "steps": steps, "seed": seed}
