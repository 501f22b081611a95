"""`Scenario`: every parameter of a simulated cluster, validated, each default with its source.

Times are in microseconds. The four failure modes of the study are explicit groups of fields:
runtime jitter (noise, spikes, regimes), locality (fixed per-rank offsets), fabric
(hierarchical oversubscribed network with correlated contention per leaf switch) and
amplification (bucketed all-reduce overlapping the backward pass, plus the spin coupling).
The coupling figures the coupled presets take are the device check's measurements on an H200
(`NCCL_COUPLING` and `SPIN_COUPLING` beside batched matmuls, the `PERSISTENT_` pair beside a
persistent one); the scenario's own defaults are 0, an uncoupled cluster.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from statistics import median
from typing import Any

# Most paced sites the simulator models; matches PaceConfig.max_sites' default.
MAX_BUCKETS = 64
MAX_RANKS = 65_536
MAX_SPIKE_CLIP = 1e6  # the longest stall, in units of the Pareto scale
# The spin coupling as the device check measured it (`gpupace.vcluster.spin_coupling`): the
# share of a bf16 load's throughput lost while spinners run beside it on another stream, in
# five device checks on one H200 within 43 minutes of 2026-11-30
# (bench/results/2026-11-30-nvidia-h200.json of commits 0d92b12, fdf5bba, c1a3d0a, 5750240 and
# e6efad0, in that order). Two loads: batched small matmuls, which take whatever SMs are free
# (the optimistic choice for a backward); and one large matmul, whose cuBLAS kernel is
# persistent (one CTA per SM): it lost a fifth of its throughput beside one warp, though the
# spinner outlasted it 3x (waiting for that SM would have cost at least two thirds), so most
# likely its CTAs beside the spinners ran slower and became its tail. Each batched figure is
# one timing of ~1 ms against one timing alone: the one-warp figures (0.012-0.060) overlap the
# one-CTA ones (0.027-0.047). Measured on CTAs that spin; a transfer's CTAs copy, and the
# engine applies `coupling` to the transfer too.
H200_BMM_COUPLING: dict[str, tuple[float, ...]] = {
    "one_warp": (0.059, 0.014, 0.012, 0.031, 0.060),  # gpupace's pacing spin
    "8_ctas": (0.048, 0.031, 0.057, 0.038, 0.075),  # 512-thread CTAs on a barrier: NCCL's
    "32_ctas": (0.088, 0.042, 0.056, 0.045, 0.081),  # waiting kernel, one CTA per channel
}
H200_MM_COUPLING: dict[str, tuple[float, ...]] = {
    "one_warp": (0.205, 0.194, 0.187, 0.193, 0.194),
    "8_ctas": (0.317, 0.315, 0.299, 0.306, 0.313),
    "32_ctas": (0.390, 0.391, 0.371, 0.379, 0.382),
}


def _couplings(runs: dict[str, tuple[float, ...]]) -> tuple[float, float]:
    """(a waiting NCCL kernel's coupling, a pacing spin's): the median of the ten 8- and
    32-CTA figures (8 to 32 channels; for the persistent load it falls between the two
    clusters, 0.30-0.32 and 0.37-0.39), and of the one-warp figures."""
    return (round(median(runs["8_ctas"] + runs["32_ctas"]), 3),
            round(median(runs["one_warp"]), 3))


# The batched load's: 0.052 and 0.031. The coupled presets take these but `amplification`.
NCCL_COUPLING, SPIN_COUPLING = _couplings(H200_BMM_COUPLING)
# The persistent matmul's: 0.344 and 0.194, the strongest coupling measured; `amplification`'s.
PERSISTENT_NCCL_COUPLING, PERSISTENT_SPIN_COUPLING = _couplings(H200_MM_COUPLING)

# Pacing's own cost as the device check measured it on an H200 (bench/results/
# 2026-11-30-nvidia-h200.json, code of 975f711, `figures.overhead`): the time a step with 1 and
# with 8 paced collectives added per collective, p50 of 9 windows, in a CUDA graph (GPU time)
# and eager (host time: launches). The step's own work there is its exchange (a one-rank
# all_gather's launch, no network), reduction and update at one rank: at scale the reduction
# and update take 9 us more at 512 ranks and 64 us at 4096 (the kernels' own benchmark, same
# run), and the exchange its network time (not measured), which these leave out.
H200_GRAPH_ADDED_US = {1: 11.403, 8: 3.099}
H200_EAGER_ADDED_US = {1: 184.19, 8: 72.16}


def _pacing_costs(added: dict[int, float]) -> tuple[float, float]:
    """(a paced collective's own cost, a step's) from the added time per collective at 1 and
    8 a step, which is linear in the collectives: step + sites x site."""
    site = (8 * added[8] - added[1]) / 7
    return round(site, 2), round(added[1] - site, 2)


# 1.91 and 9.49 us: a Scenario's default.
GRAPH_SITE_US, GRAPH_STEP_US = _pacing_costs(H200_GRAPH_ADDED_US)
# 56.16 and 128.03 us: a host-bound job's, whose GPU waits for the host's launches (a GPU-bound
# one hides them; not yet measured inside a real training step).
EAGER_SITE_US, EAGER_STEP_US = _pacing_costs(H200_EAGER_ADDED_US)


@dataclass(kw_only=True, slots=True, frozen=True)
class Scenario:
    """A simulated data-parallel job. All defaults give a quiet, uncoupled cluster; presets
    (`gpupace.sim.presets`) switch failure modes on one at a time or together."""

    name: str = "custom"
    """Label carried into results and telemetry (a preset's name)."""

    # -- cluster ------------------------------------------------------------------------------
    nodes: int = 8
    """Nodes in the job."""
    gpus_per_node: int = 8
    """Ranks per node (8: DGX/HGX H100, vendor figure)."""
    nodes_per_leaf: int = 16
    """Nodes under one leaf switch (assumption: a 64-port leaf with 8 NIC ports per node and
    half its ports up, 1:1; `oversubscription` thins the uplinks)."""
    samples_per_rank: float = 8.0
    """Samples per rank per step; throughput = ranks x this / step time (assumption)."""

    # -- compute --------------------------------------------------------------------------------
    forward_us: float = 100_000.0
    """Forward pass per step at full speed (assumption: a 100 ms forward)."""
    backward_ratio: float = 2.0
    """Backward time / forward time: 2 (backward costs twice the forward's FLOPs,
    Kaplan et al. 2020, 6N = 2N forward + 4N backward FLOPs per token)."""
    optimizer_us: float = 5_000.0
    """Optimizer step after the last all-reduce, not overlapped (assumption)."""
    grad_mb: float = 100.0
    """Gradient bytes per step, MB (assumption: ~25 M fp32 parameters, ResNet-50 scale,
    He et al. 2016)."""
    bucket_mb: float = 25.0
    """DDP bucket size, MB (PyTorch DDP's default `bucket_cap_mb=25`). One bucket = one site."""

    # -- runtime jitter (failure mode 4) ---------------------------------------------------------
    noise_sigma: float = 0.0
    """Log-normal sigma of each rank's compute per bucket and per forward (0: none)."""
    spike_prob: float = 0.0
    """Chance per rank per step of a heavy-tailed stall (OS noise, allocator, launch delay)."""
    spike_us: float = 1_000.0
    """Pareto scale (minimum) of a stall, us (assumption)."""
    spike_alpha: float = 1.5
    """Pareto shape of stalls; < 2 means infinite variance, the heavy tail the study describes
    (assumption; OS-noise amplification at scale: Petrini et al., SC'03)."""
    spike_clip: float = 100.0
    """The longest stall, in units of `spike_us`: with alpha < 2 one draw would otherwise
    dominate a whole run (assumption, a model limit). A fit sets it to the longest stall its
    file holds: a tail fitted to a handful of stalls has no business reaching past them."""
    regime_on_prob: float = 0.0
    """Chance per step that the job enters the communication-bound regime (0: never)."""
    regime_off_prob: float = 0.1
    """Chance per step that it leaves it (mean stay 1/this steps; assumption)."""
    regime_comm_factor: float = 1.0
    """Transfer-time multiplier in the communication-bound regime (1: no effect)."""

    # -- locality (failure mode 3) -------------------------------------------------------------
    locality_pattern_us: tuple[float, ...] = ()
    """Fixed extra compute per step (us) of rank i is `pattern[i % len(pattern)]`: GPUs with a
    far NIC or a NUMA hop keep a handicap. Empty: none. Presets build it per node."""
    input_pattern_us: tuple[float, ...] = ()
    """Fixed extra forward time (us) of rank i is `pattern[i % len(pattern)]`: an input
    pipeline on a slow NUMA node or disk makes a rank late from the first bucket on, while a
    `locality_pattern_us` handicap grows through the backward. Empty: none."""
    rank_speed_sigma: float = 0.0
    """Log-normal sigma of a fixed per-rank speed factor (chip-to-chip variation; Sinha et al.,
    SC'22, report several percent across GPUs of one cluster)."""

    # -- fabric (failure mode 2) ---------------------------------------------------------------
    nic_gbps: float = 400.0
    """NIC line rate per GPU, Gb/s (ConnectX-7, one per GPU in DGX H100: vendor figure)."""
    nvlink_gbs: float = 450.0
    """NVLink bandwidth per GPU per direction, GB/s (H100 SXM 900 GB/s bidirectional: vendor)."""
    link_efficiency: float = 0.8
    """Achieved fraction of line rate in NCCL bus bandwidth (assumption)."""
    oversubscription: float = 1.0
    """Leaf uplink oversubscription; traffic that crosses leaves gets 1/this of the NIC rate."""
    hop_latency_us: float = 5.0
    """Latency per algorithm step of a collective, us (assumption)."""
    contention_mean: float = 0.0
    """Mean extra load on a switch from other traffic, relative to the job's own: a transfer
    across it takes 1 + load times as long (`fabric.contention_factor`; 1 doubles it)."""
    contention_sigma: float = 0.0
    """Log-normal sigma of that load (0: constant)."""
    contention_rho: float = 0.95
    """Step-to-step correlation of each switch's load (time-varying, correlated; assumption)."""

    # -- amplification (failure mode 1) --------------------------------------------------------
    coupling: float = 0.0
    """Fraction of compute throughput lost while this rank's collective kernel is resident,
    waiting or transferring (NCCL holds one CTA per channel). Coupled presets use
    `NCCL_COUPLING` (`amplification`: `PERSISTENT_NCCL_COUPLING`), measured on an H200 with
    spinning CTAs (a transfer's CTAs copy, which may cost otherwise). 0 here so that the
    defaults describe an uncoupled cluster."""
    paced_coupling: float = 0.0
    """Fraction lost while gpupace's one-warp spin holds the stream. Coupled presets use
    `SPIN_COUPLING` (`amplification`: `PERSISTENT_SPIN_COUPLING`), measured on an H200."""

    # -- pacing's own cost (paid by the `gpupace` and `oracle` policies, not by `none`) --------
    pacing_site_us: float = GRAPH_SITE_US
    """Time a paced collective's own kernels hold its stream (the stamps around the spin, the
    exit stamp), added to every rank's entry, delay or none: 1.91 us, measured in a CUDA graph
    on an H200 (`GRAPH_SITE_US`); eager, `EAGER_SITE_US` of host time."""
    pacing_step_us: float = GRAPH_STEP_US
    """Time a paced step's own work (its row, the exchange of rows, the reduction and the
    update, on the compute stream after the optimizer) delays the next step: 9.49 us, measured
    in a CUDA graph on an H200 at one rank, without the network (`GRAPH_STEP_US`)."""

    def __post_init__(self) -> None:
        for name, (lo, hi, kind) in _RANGES.items():
            _check(name, getattr(self, name), lo, hi, kind)
        if not isinstance(self.name, str):
            raise ValueError(f"name must be a string, got {self.name!r}")
        for name in ("locality_pattern_us", "input_pattern_us"):
            pat = getattr(self, name)
            if not isinstance(pat, tuple):
                object.__setattr__(self, name, tuple(pat))
            for v in getattr(self, name):
                ok = isinstance(v, (int, float)) and not isinstance(v, bool)
                if not (ok and math.isfinite(v) and 0 <= v <= 1e8):
                    raise ValueError(f"{name} entries must be finite numbers in [0, 1e8], got {v!r}")
        if self.ranks > MAX_RANKS:
            raise ValueError(f"nodes x gpus_per_node must be <= {MAX_RANKS}, got {self.ranks}")
        if self.buckets > MAX_BUCKETS:
            raise ValueError(f"grad_mb / bucket_mb must give <= {MAX_BUCKETS} buckets, got "
                             f"{self.buckets} (grad_mb={self.grad_mb}, bucket_mb={self.bucket_mb})")

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def buckets(self) -> int:
        return max(1, math.ceil(self.grad_mb / self.bucket_mb - 1e-9))

    @property
    def leaves(self) -> int:
        return math.ceil(self.nodes / self.nodes_per_leaf)

    def replace(self, **changes: Any) -> Scenario:
        """A validated copy with `changes`; unknown names raise ValueError."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown Scenario fields {sorted(unknown)}; known: {sorted(known)}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["locality_pattern_us"] = list(self.locality_pattern_us)
        d["input_pattern_us"] = list(self.input_pattern_us)
        return d

    def failure_modes(self) -> list[str]:
        """Which of the study's failure modes this scenario switches on (labels for test data)."""
        modes = []
        if self.noise_sigma > 0 or self.spike_prob > 0 or (
                self.regime_on_prob > 0 and self.regime_comm_factor != 1.0):
            modes.append("jitter")
        # an offset that every rank carries alike is slower compute, not locality
        if (any(p and max(p) > min(p) for p in (self.locality_pattern_us, self.input_pattern_us))
                or self.rank_speed_sigma > 0):
            modes.append("locality")
        if self.contention_mean > 0 or (self.oversubscription > 1 and self.leaves > 1):
            modes.append("fabric")
        if self.coupling > 0:
            modes.append("amplification")
        return modes


# name -> (low, high, kind); kind "int", "float" (closed range) or "pos" (low is open).
_RANGES: dict[str, tuple[float, float, str]] = {
    "nodes": (1, 4096, "int"),
    "gpus_per_node": (1, 64, "int"),
    "nodes_per_leaf": (1, 4096, "int"),
    "samples_per_rank": (0.0, 1e9, "pos"),
    "forward_us": (0.0, 1e8, "pos"),
    "backward_ratio": (0.0, 100.0, "pos"),
    "optimizer_us": (0.0, 1e8, "float"),
    "grad_mb": (0.0, 1e6, "pos"),
    "bucket_mb": (0.0, 1e6, "pos"),
    "noise_sigma": (0.0, 2.0, "float"),
    "spike_prob": (0.0, 1.0, "float"),
    "spike_us": (0.0, 1e8, "pos"),
    "spike_alpha": (1.0, 10.0, "pos"),
    "spike_clip": (1.0, MAX_SPIKE_CLIP, "float"),
    "regime_on_prob": (0.0, 1.0, "float"),
    "regime_off_prob": (0.0, 1.0, "pos"),
    "regime_comm_factor": (1.0, 100.0, "float"),
    "rank_speed_sigma": (0.0, 1.0, "float"),
    "nic_gbps": (0.0, 1e5, "pos"),
    "nvlink_gbs": (0.0, 1e5, "pos"),
    "link_efficiency": (0.0, 1.0, "pos"),
    "oversubscription": (1.0, 64.0, "float"),
    "hop_latency_us": (0.0, 1e6, "float"),
    "contention_mean": (0.0, 100.0, "float"),
    "contention_sigma": (0.0, 5.0, "float"),
    "contention_rho": (0.0, 1.0, "float"),
    "coupling": (0.0, 0.95, "float"),
    "paced_coupling": (0.0, 0.95, "float"),
    "pacing_site_us": (0.0, 1e6, "float"),
    "pacing_step_us": (0.0, 1e6, "float"),
}


def _check(name: str, v: Any, lo: float, hi: float, kind: str) -> None:
    if kind == "int":
        ok = isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
        if not ok:
            raise ValueError(f"{name} must be an integer in [{lo}, {hi}], got {v!r}")
        return
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    ok = ok and (v > lo if kind == "pos" else v >= lo) and v <= hi
    if not ok:
        left = "(" if kind == "pos" else "["
        raise ValueError(f"{name} must be a finite number in {left}{lo}, {hi}], got {v!r}")
