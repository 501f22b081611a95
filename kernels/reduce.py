"""The CuPy reduction over the gathered timing matrix: which ranks' rows are usable, and per
site the earliest exit-relative arrival, its argmin (the straggler), the spread, the transfer
estimate, the residual entry spread and the mean earliness; per rank the sums of its waits and
delays; the range of the site counts; the median step time.

One NVRTC-compiled kernel (`_reduce_kernel`), one block of 256 to 1024 threads (more for more
ranks): phase 1, the one pass over every row, gives each lane a row: marks it valid (every w
and d finite, >= 0 and < ABSURD_US, as `gpupace.policy.update` does) in a bit mask in shared
memory, sums it, and puts its step time into the median's sort, in shared memory too; phase 2
gives each site a warp, or a group of warps where its ranks fill more (all of them for one site
of a thousand ranks), that reduce over ranks with warp shuffles and meet in shared memory.
Each phase waits on memory once (on the H200 a version that read validity and the step times
back from memory took 3.25 us at 2 ranks, this one 3.1-3.2: no gain measurable at that size). It is launched on torch's current stream through
CuPy's view of it, into preallocated outputs, so it can be captured in a CUDA graph once
`warmup` has compiled it. `reduce_reference` is its NumPy twin (float32, same tie
rule: the lowest rank wins an argmin), which CPU tests check against the policy and GPU tests
check the kernel against.

Gathered matrix: float32 [N, 2 + 2M], rows as in `spin.py`. Outputs (`outputs` makes them):
  valid      int32 [N]
  n_valid    int32 [1]
  site       float32 [5, M]: earliest = min (w + d), spread = max (w + d) - earliest,
             transfer = min w, residual = max w - min w, mean earliness; over valid ranks
  straggler  int32 [M]: argmin (w + d), -1 with fewer than two valid ranks
  median     float32 [1]: median of the known step times (finite, > 0, < ABSURD_US), NaN if
             none; one block sorts them in shared memory (N up to 8192: 32 KB)
  sums       float32 [2, N]: each rank's waits and delays summed over the sites, NaNs skipped
  counts     int32 [2]: the least and the most sites a rank counted (-1 for a non-finite count)
With fewer than two valid ranks spread, residual and mean are NaN (transfer is the one valid
rank's w, or NaN), as in the policy.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

ABSURD_US = 1e9  # gpupace.policy.ABSURD_US (a test holds them equal): no numba import here
N_SITE_STATS = 5
MAX_SORT = 8192  # 32 KB of shared memory, under the 48 KB a block gets without opting in

_SOURCE = f"#define MAX_SORT {MAX_SORT}\n" + r"""
__device__ __forceinline__ void keep_min(float& a, int& i, float b, int j) {
  if (b < a || (b == a && j < i)) { a = b; i = j; }  // the lowest rank wins a tie
}

extern "C" __global__ void gpupace_reduce(
    const float* __restrict__ g, const int n_ranks, const int row_len, const int max_sites,
    const int n_sites, const float absurd, const int sort_len, int* __restrict__ valid,
    int* __restrict__ n_valid, float* __restrict__ site, int* __restrict__ straggler,
    float* __restrict__ median, float* __restrict__ sums, int* __restrict__ counts) {
  extern __shared__ float sorted[];  // sort_len floats: the step times, known first
  __shared__ unsigned valid_bits[MAX_SORT / 32];  // phase 2 reads validity here, not in memory
  __shared__ int part_n[32], part_lo[32], part_hi[32], part_arg[32], part_known[32];
  __shared__ float part_amin[32], part_amax[32], part_wmin[32], part_wmax[32], part_sum[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_warps = blockDim.x >> 5;
  const float nan = __int_as_float(0x7fc00000), inf = __int_as_float(0x7f800000);
  // Phase 1, a lane a row, a warp 32 rows in a row: usable when all its waits and delays are
  // sane; its sums; its site count; its step time into the sort (unknown: +inf). One read of
  // the matrix; every lane of a warp runs every pass, for the ballot.
  int mine = 0, known = 0, lo = 0x7fffffff, hi = -0x7fffffff - 1;
  const int rows = max(sort_len, (n_ranks + 31) & ~31);
  for (int base = warp * 32; base < rows; base += blockDim.x) {
    const int i = base + lane;
    int ok = 0;
    if (i < n_ranks) {
      const float* r = g + (long long)i * row_len;
      float ws = 0.f, ds = 0.f;
      ok = 1;
      for (int s = 0; s < n_sites; ++s) {
        const float w = r[2 + s], d = r[2 + max_sites + s];
        ok &= isfinite(w) && isfinite(d) && w >= 0.f && d >= 0.f && w < absurd && d < absurd;
        ws += isnan(w) ? 0.f : w;
        ds += isnan(d) ? 0.f : d;
      }
      valid[i] = ok;
      sums[i] = ws;
      sums[n_ranks + i] = ds;
      const float cf = r[0], x = r[1];
      const int c = isfinite(cf) ? (int)cf : -1;  // (int) saturates out of range
      const bool step_known = x > 0.f && x < absurd;  // false for NaN
      sorted[i] = step_known ? x : inf;
      mine += ok; known += step_known; lo = min(lo, c); hi = max(hi, c);
    } else if (i < sort_len) {
      sorted[i] = inf;
    }
    const unsigned word = __ballot_sync(0xffffffffu, ok);
    if (lane == 0 && base < MAX_SORT) valid_bits[base >> 5] = word;
  }
  for (int o = 16; o > 0; o >>= 1) {
    mine += __shfl_down_sync(0xffffffffu, mine, o);
    known += __shfl_down_sync(0xffffffffu, known, o);
    lo = min(lo, __shfl_down_sync(0xffffffffu, lo, o));
    hi = max(hi, __shfl_down_sync(0xffffffffu, hi, o));
  }
  if (lane == 0) {
    part_n[warp] = mine; part_known[warp] = known; part_lo[warp] = lo; part_hi[warp] = hi;
  }
  __syncthreads();  // the bits, the sort's input and the partials are the block's after this
  int nv = 0, n_known = 0;
  for (int w = 0; w < n_warps; ++w) { nv += part_n[w]; n_known += part_known[w]; }
  if (tid == 0) {
    for (int w = 1; w < n_warps; ++w) { lo = min(lo, part_lo[w]); hi = max(hi, part_hi[w]); }
    n_valid[0] = nv; counts[0] = lo; counts[1] = hi;
  }
  // Median of the known step times (finite, > 0, < absurd): bitonic sort, unknowns as +inf.
  for (int k = 2; k <= sort_len; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = tid; i < sort_len; i += blockDim.x) {
        const int p = i ^ j;
        if (p > i) {
          const float a = sorted[i], b = sorted[p];
          if ((a > b) == ((i & k) == 0)) { sorted[i] = b; sorted[p] = a; }
        }
      }
      __syncthreads();
    }
  }
  if (tid == 0) {
    median[0] = n_known > 0 ? (sorted[(n_known - 1) / 2] + sorted[n_known / 2]) * 0.5f : nan;
  }
  // Phase 2: `groups` sites at a time, `per` warps a site (as many as its ranks fill, while
  // every site of a round gets as many); one warp a site writes its result itself, several
  // meet in shared memory.
  const int fill = max(1, min(n_warps, n_sites));
  const int per = max(1, min(n_warps / fill, (n_ranks + 31) / 32));
  const int groups = n_warps / per;
  const int gi = warp / per, sub = warp % per;
  const bool two = nv >= 2;
  for (int s0 = 0; s0 < n_sites; s0 += groups) {  // the same trip count for every thread
    const int s = s0 + gi;
    const bool mine_site = gi < groups && s < n_sites;
    float amin = inf, amax = -inf, wmin = inf, wmax = -inf, asum = 0.f;
    int arg = 0x7fffffff;
    if (mine_site) {
      for (int i = sub * 32 + lane; i < n_ranks; i += per * 32) {
        if (!((valid_bits[i >> 5] >> (i & 31)) & 1u)) continue;
        const float* r = g + (long long)i * row_len;
        const float w = r[2 + s], a = w + r[2 + max_sites + s];
        keep_min(amin, arg, a, i);
        amax = fmaxf(amax, a); wmin = fminf(wmin, w); wmax = fmaxf(wmax, w); asum += a;
      }
      for (int o = 16; o > 0; o >>= 1) {
        keep_min(amin, arg, __shfl_down_sync(0xffffffffu, amin, o),
                 __shfl_down_sync(0xffffffffu, arg, o));
        amax = fmaxf(amax, __shfl_down_sync(0xffffffffu, amax, o));
        wmin = fminf(wmin, __shfl_down_sync(0xffffffffu, wmin, o));
        wmax = fmaxf(wmax, __shfl_down_sync(0xffffffffu, wmax, o));
        asum += __shfl_down_sync(0xffffffffu, asum, o);
      }
    }
    if (per > 1) {  // the same for every thread: the barriers are reached by all or none
      if (mine_site && lane == 0) {
        part_amin[warp] = amin; part_arg[warp] = arg; part_amax[warp] = amax;
        part_wmin[warp] = wmin; part_wmax[warp] = wmax; part_sum[warp] = asum;
      }
      __syncthreads();
      if (mine_site && sub == 0 && lane == 0) {
        for (int w = warp + 1; w < warp + per; ++w) {
          keep_min(amin, arg, part_amin[w], part_arg[w]);
          amax = fmaxf(amax, part_amax[w]); wmin = fminf(wmin, part_wmin[w]);
          wmax = fmaxf(wmax, part_wmax[w]); asum += part_sum[w];
        }
      }
      __syncthreads();  // the partials are read before the next sites overwrite them
    }
    if (mine_site && sub == 0 && lane == 0) {
      site[0 * max_sites + s] = two ? amin : nan;
      site[1 * max_sites + s] = two ? amax - amin : nan;
      site[2 * max_sites + s] = nv >= 1 ? wmin : nan;
      site[3 * max_sites + s] = two ? wmax - wmin : nan;
      site[4 * max_sites + s] = two ? asum / (float)nv - amin : nan;
      straggler[s] = two ? arg : -1;
    }
  }
}
"""


@functools.cache
def _reduce_kernel() -> Any:
    """The compiled kernel (NVRTC, on first use; `warmup` calls this before any capture)."""
    import cupy

    kernel = cupy.RawKernel(_SOURCE, "gpupace_reduce")
    kernel.compile()
    return kernel


class _StreamRef:
    """A raw stream handle in the CUDA stream protocol (`__cuda_stream__`)."""

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.ptr)


@functools.cache
def _external_stream(ptr: int, device: int) -> Any:
    """CuPy's view of torch's stream, cached per handle (made once, before any capture).
    Never evicted: CuPy 14's `Stream.from_external` makes a `Stream`, whose `__del__`
    destroys the handle it holds, which is torch's stream."""
    import cupy

    from_external = getattr(cupy.cuda.Stream, "from_external", None)
    if from_external is not None:  # CuPy >= 14; ExternalStream is deprecated there
        return from_external(_StreamRef(ptr))
    return cupy.cuda.ExternalStream(ptr, device)


def warmup(stream_ptr: int | None = None, device: int = 0) -> None:
    """Compiles and loads the kernel, and makes CuPy's view of the stream: neither is allowed
    inside a graph capture."""
    _reduce_kernel()
    if stream_ptr is not None:
        _external_stream(int(stream_ptr), int(device))


def sort_len_for(n_ranks: int) -> int:
    """The bitonic sort's length: the next power of two >= N (at least 2)."""
    return max(2, 1 << (int(n_ranks) - 1).bit_length())


def threads_for(n_ranks: int) -> int:
    """The block's size: 256 threads up to 256 ranks, then one a rank, up to 1024 (phase 1 and
    the sort then take a few rows a thread, not a dozen)."""
    return min(1024, max(256, sort_len_for(n_ranks)))


def outputs(n_ranks: int, max_sites: int, device: Any = None) -> dict[str, Any]:
    """The reduction's output buffers as torch tensors (zeros), by name, as `reduce_rows` and
    the update kernel take them."""
    import torch

    # Every dtype named: the CUDA kernel writes float32 and int32 whatever torch's default
    # dtype is (float64 or bfloat16 there would be read as garbage, or written past the end).
    i32, f32 = torch.int32, torch.float32
    return {"valid": torch.zeros(n_ranks, dtype=i32, device=device),
            "n_valid": torch.zeros(1, dtype=i32, device=device),
            "site": torch.zeros(N_SITE_STATS, max_sites, dtype=f32, device=device),
            "straggler": torch.zeros(max_sites, dtype=i32, device=device),
            "median": torch.zeros(1, dtype=f32, device=device),
            "sums": torch.zeros(2, n_ranks, dtype=f32, device=device),
            "counts": torch.zeros(2, dtype=i32, device=device)}


OUTPUTS = ("valid", "n_valid", "site", "straggler", "median", "sums", "counts")


def views(buffers: dict[str, Any]) -> dict[str, Any]:
    """CuPy views (DLPack, no copy) of torch CUDA tensors, by name: the gathered matrix and the
    outputs as `reduce_rows` takes them. Made once, before any capture."""
    import cupy

    return {k: cupy.from_dlpack(v) for k, v in buffers.items()}


def reduce_rows(gathered: Any, out: dict[str, Any], *, n_sites: int, stream_ptr: int,
                device: int = 0) -> None:
    """Launches the reduction over the first `n_sites` sites of `gathered` (a CuPy view of the
    float32 [N, 2 + 2M] matrix) on the CUDA stream `stream_ptr` (torch's current stream), into
    `out`, CuPy views of the buffers that `outputs` makes."""
    import numpy as _np

    n_ranks, row_len = gathered.shape
    max_sites = (row_len - 2) // 2
    if not 0 <= n_sites <= max_sites:
        raise ValueError(f"n_sites must be in [0, {max_sites}], got {n_sites}")
    sort_len = sort_len_for(n_ranks)
    if sort_len > MAX_SORT:
        raise ValueError(f"the reduction sorts at most {MAX_SORT} ranks in one block, got {n_ranks}")
    kernel = _reduce_kernel()
    with _external_stream(int(stream_ptr), int(device)):
        kernel((1,), (threads_for(n_ranks),),
               (gathered, _np.int32(n_ranks), _np.int32(row_len), _np.int32(max_sites),
                _np.int32(n_sites), _np.float32(ABSURD_US), _np.int32(sort_len),
                *(out[k] for k in OUTPUTS)), shared_mem=4 * sort_len)


def reduce_reference(gathered: np.ndarray, n_sites: int) -> dict[str, np.ndarray]:
    """The NumPy twin of the kernel, in float32: returns its outputs by name."""
    g = np.asarray(gathered, dtype=np.float32)
    n_ranks, row_len = g.shape
    m = (row_len - 2) // 2
    w, d = g[:, 2:2 + n_sites], g[:, 2 + m:2 + m + n_sites]
    with np.errstate(invalid="ignore", over="ignore"):
        ok = np.isfinite(w) & np.isfinite(d) & (w >= 0) & (d >= 0) & (w < ABSURD_US) & (d < ABSURD_US)
        valid = ok.all(axis=1)
        nv = int(valid.sum())
        a = (w + d).astype(np.float32)
    site = np.full((N_SITE_STATS, m), np.nan, dtype=np.float32)
    straggler = np.full(m, -1, dtype=np.int32)
    if nv >= 1:
        site[2, :n_sites] = w[valid].min(axis=0)
    if nv >= 2:
        av, wv = a[valid], w[valid]
        amin = av.min(axis=0)
        site[0, :n_sites] = amin
        site[1, :n_sites] = av.max(axis=0) - amin
        site[3, :n_sites] = wv.max(axis=0) - wv.min(axis=0)
        site[4, :n_sites] = av.sum(axis=0, dtype=np.float32) / np.float32(nv) - amin
        straggler[:n_sites] = np.flatnonzero(valid)[av.argmin(axis=0)]
    with np.errstate(invalid="ignore"):
        st = g[:, 1]
        known = st[(st > 0) & (st < ABSURD_US)]
    med = np.float32((np.sort(known)[(known.size - 1) // 2] + np.sort(known)[known.size // 2])
                     * np.float32(0.5)) if known.size else np.float32(np.nan)
    with np.errstate(invalid="ignore", over="ignore"):
        # left to right in float32, as the kernel adds (nansum pairs its terms: other roundings)
        sums = np.stack([np.cumsum(np.where(np.isnan(x), np.float32(0), x), axis=1,
                                   dtype=np.float32)[:, -1] if n_sites else
                         np.zeros(n_ranks, np.float32) for x in (w, d)]).astype(np.float32)
        c = g[:, 0].astype(np.float64)  # truncated and saturated, as CUDA's (int)
        c = np.where(np.isfinite(c), np.clip(np.trunc(c), -2.0**31, 2.0**31 - 1), -1).astype(np.int32)
    counts = np.array([c.min(), c.max()], dtype=np.int32)
    return {"valid": valid.astype(np.int32), "n_valid": np.array([nv], dtype=np.int32),
            "site": site, "straggler": straggler, "median": np.array([med], dtype=np.float32),
            "sums": sums, "counts": counts}
