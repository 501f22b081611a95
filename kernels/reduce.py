"""The CuPy reduction over the gathered timing matrix: which ranks' rows are usable, and per
site the earliest exit-relative arrival, its argmin (the straggler), the spread, the transfer
estimate, the residual entry spread and the mean earliness.

One NVRTC-compiled kernel (`_reduce_kernel`), one block: phase 1 marks each rank's row valid
(every w and d finite, >= 0 and < ABSURD_US, as `gpupace.policy.update` does); phase 2 gives
each warp whole sites and reduces over ranks with warp shuffles. It is launched on torch's
current stream through `cupy.cuda.ExternalStream`, into preallocated outputs, so it can be
captured in a CUDA graph once `warmup` has compiled it. `reduce_reference` is its NumPy twin
(float32, same tie rule: the lowest rank wins an argmin), which CPU tests check against the
policy and GPU tests check the kernel against.

Gathered matrix: float32 [N, 2 + 2M], rows as in `spin.py`. Outputs:
  valid      int32 [N]
  n_valid    int32 [1]
  site       float32 [5, M]: earliest = min (w + d), spread = max (w + d) - earliest,
             transfer = min w, residual = max w - min w, mean earliness; over valid ranks
  straggler  int32 [M]: argmin (w + d), -1 with fewer than two valid ranks
  median     float32 [1]: median of the known step times (finite, > 0, < ABSURD_US), NaN if
             none; one block sorts them in shared memory (N up to 8192: 32 KB)
With fewer than two valid ranks spread, residual and mean are NaN (transfer is the one valid
rank's w, or NaN), as in the policy.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

ABSURD_US = 1e9  # gpupace.policy.ABSURD_US; kernels do not import the library
N_SITE_STATS = 5
BLOCK = 256
MAX_SORT = 8192  # 32 KB of shared memory, under the 48 KB a block gets without opting in

_SOURCE = r"""
extern "C" __global__ void gpupace_reduce(
    const float* __restrict__ g, const int n_ranks, const int row_len, const int max_sites,
    const int n_sites, const float absurd, const int sort_len, int* __restrict__ valid,
    int* __restrict__ n_valid, float* __restrict__ site, int* __restrict__ straggler,
    float* __restrict__ median) {
  extern __shared__ float sorted[];  // sort_len floats: the step times, known first
  __shared__ int counts[32];
  __shared__ int n_known;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, n_warps = blockDim.x >> 5;
  // Phase 1: a rank's row is usable when all its waits and delays are sane.
  int mine = 0;
  for (int i = tid; i < n_ranks; i += blockDim.x) {
    const float* r = g + (long long)i * row_len;
    int ok = 1;
    for (int s = 0; s < n_sites; ++s) {
      const float w = r[2 + s], d = r[2 + max_sites + s];
      ok &= isfinite(w) && isfinite(d) && w >= 0.f && d >= 0.f && w < absurd && d < absurd;
    }
    valid[i] = ok;
    mine += ok;
  }
  for (int o = 16; o > 0; o >>= 1) mine += __shfl_down_sync(0xffffffffu, mine, o);
  if (lane == 0) counts[warp] = mine;
  __syncthreads();  // valid[] and counts[] are visible to the whole block after this
  int nv = 0;
  for (int w = 0; w < n_warps; ++w) nv += counts[w];
  if (tid == 0) n_valid[0] = nv;
  const float nan = __int_as_float(0x7fc00000), inf = __int_as_float(0x7f800000);
  // Median of the known step times (finite, > 0, < absurd): bitonic sort, unknowns as +inf.
  if (tid == 0) n_known = 0;
  __syncthreads();
  for (int i = tid; i < sort_len; i += blockDim.x) {
    const float x = i < n_ranks ? g[(long long)i * row_len + 1] : nan;
    const bool known = x > 0.f && x < absurd;  // false for NaN
    sorted[i] = known ? x : inf;
    if (known) atomicAdd(&n_known, 1);
  }
  __syncthreads();
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
    const int c = n_known;
    median[0] = c > 0 ? (sorted[(c - 1) / 2] + sorted[c / 2]) * 0.5f : nan;
  }
  // Phase 2: one warp per site.
  for (int s = warp; s < n_sites; s += n_warps) {
    float amin = inf, amax = -inf, wmin = inf, wmax = -inf, asum = 0.f;
    int arg = 0x7fffffff;
    for (int i = lane; i < n_ranks; i += 32) {
      if (!valid[i]) continue;
      const float* r = g + (long long)i * row_len;
      const float w = r[2 + s], a = w + r[2 + max_sites + s];
      if (a < amin) { amin = a; arg = i; }  // ranks rise along a lane: first minimum kept
      amax = fmaxf(amax, a); wmin = fminf(wmin, w); wmax = fmaxf(wmax, w); asum += a;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float oa = __shfl_down_sync(0xffffffffu, amin, o);
      const int oi = __shfl_down_sync(0xffffffffu, arg, o);
      if (oa < amin || (oa == amin && oi < arg)) { amin = oa; arg = oi; }
      amax = fmaxf(amax, __shfl_down_sync(0xffffffffu, amax, o));
      wmin = fminf(wmin, __shfl_down_sync(0xffffffffu, wmin, o));
      wmax = fmaxf(wmax, __shfl_down_sync(0xffffffffu, wmax, o));
      asum += __shfl_down_sync(0xffffffffu, asum, o);
    }
    if (lane == 0) {
      const bool two = nv >= 2;
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
    """CuPy's view of torch's stream, cached per handle (made once, before any capture)."""
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


def reduce_rows(gathered: Any, valid: Any, n_valid: Any, site: Any, straggler: Any,
                median: Any, *,
                n_sites: int, stream_ptr: int, device: int = 0) -> None:
    """Launches the reduction over the first `n_sites` sites of `gathered` (a CuPy view of the
    float32 [N, 2 + 2M] matrix) on the CUDA stream `stream_ptr` (torch's current stream), into
    the preallocated CuPy outputs described in the module docstring."""
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
        kernel((1,), (BLOCK,), (gathered, _np.int32(n_ranks), _np.int32(row_len),
                                _np.int32(max_sites), _np.int32(n_sites),
                                _np.float32(ABSURD_US), _np.int32(sort_len), valid, n_valid, site,
                                straggler, median), shared_mem=4 * sort_len)


def reduce_reference(gathered: np.ndarray, n_sites: int) -> dict[str, np.ndarray]:
    """The NumPy twin of the kernel, in float32: returns valid, n_valid, site, straggler and
    median."""
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
    return {"valid": valid.astype(np.int32), "n_valid": np.array([nv], dtype=np.int32),
            "site": site, "straggler": straggler, "median": np.array([med], dtype=np.float32)}
