"""Cost of one policy update for world sizes 8 to 4096 and 1 to 16 sites: what a pacer runs
once per step on the gathered matrix (`gpupace.policy.update_in_place` for its own rank), the
simulator's every-rank update, the pure `update` and the NumPy twin `update_reference`.

Inputs look like a paced job: waits of a few hundred us with a few late ranks, so the spread
stays above the threshold and the full path runs (floors, hysteresis on, clamps, the per-rank
cap). The state is carried from call to call as in a real loop, past the warm-up steps.
Each call gets views of a gathered matrix written just before it (untimed), as the host
backend's all_gather writes it, after `cool()`, a stand-in for the rest of a training step:
code, state and everything else start cold. (The interleaved variants alone would not do it:
each always runs after the same other one, and found its code warm.)
When the 4096 x 4 target is missed, a cProfile of that case is kept in the JSON extras.
"""

from __future__ import annotations

import cProfile
import io
import pstats
from collections.abc import Callable

import numpy as np

from .harness import Harness, interleave

WORLDS = [8, 4096]
WORLDS_FULL = [8, 16, 64, 256, 1024, 4096]
SITES = [1, 4]
SITES_FULL = [1, 2, 4, 8, 16]
TARGET_US = 100.0


# What each timed implementation calls.
CALLS = {
    "own_rank": "gpupace.policy.update_in_place(..., rank=0): the host backend, one pacer",
    "all_ranks": "gpupace.policy.update_in_place(...): the simulator, every rank's state",
    "update": "gpupace.policy.update(...): pure, one copy of the state more",
    "update_reference": "gpupace.policy.update_reference(...): the NumPy reference",
}


def implementations() -> dict[str, Callable]:
    """The update functions to time (see CALLS), each called as `fn(params, state, w, d,
    steps)` and returning the state to carry."""
    from gpupace import policy

    def in_place(rank):
        def fn(params, state, w, d, steps):
            policy.update_in_place(params, state, w, d, steps, rank=rank)
            return state
        return fn

    return {"own_rank": in_place(0), "all_ranks": in_place(None),
            "update": lambda *a: policy.update(*a)[0],
            "update_reference": lambda *a: policy.update_reference(*a)[0]}


def make_case(n_ranks: int, n_sites: int, seed: int = 0, fn: Callable | None = None):
    """Returns `(prepare, step, box)`: `prepare()` writes the next inputs into a gathered
    matrix [N, 2 + 2 S] laid out as the host backend's (count, step time, waits, delays), as
    its all_gather does once a step; `step()` runs one policy update (`fn` from
    `implementations()`, default the host backend's) on views of that matrix, as the backend
    passes them, with the state carried over in `box`. Time `step` alone: between calls the
    rest of a training step runs, so all but the freshly written inputs is cold in a real loop
    too. The first calls (JIT compile, warm-up) are untimed."""
    from gpupace import PaceConfig, policy

    fn = implementations()["own_rank"] if fn is None else fn
    rng = np.random.default_rng(seed)
    params = policy.PolicyParams.from_config(PaceConfig(mode="pace"), n_ranks)
    n_inputs = 64
    # Arrival earliness up to ~2 ms, a transfer of ~300 us; a random rank is the straggler.
    early = rng.exponential(400.0, size=(n_inputs, n_ranks, n_sites))
    early[np.arange(n_inputs), rng.integers(0, n_ranks, n_inputs)] = 0.0
    inputs = np.zeros((n_inputs, n_ranks, 2 + 2 * n_sites))
    inputs[:, :, 0] = n_sites
    inputs[:, :, 1] = rng.normal(20_000.0, 500.0, size=(n_inputs, n_ranks))
    inputs[:, :, 2:2 + n_sites] = 300.0 + early + rng.uniform(0, 5, size=early.shape)
    rows = np.empty((n_ranks, 2 + 2 * n_sites))
    box = {"state": policy.init_state(n_ranks, n_sites), "i": 0}

    def prepare() -> None:
        rows[:] = inputs[box["i"] % n_inputs]

    def step() -> None:
        w, d = rows[:, 2:2 + n_sites], rows[:, 2 + n_sites:]
        box["state"] = fn(params, box["state"], w, d, rows[:, 1])
        box["i"] += 1

    for _ in range(params.warmup_steps + params.on_steps + 2):  # past warm-up, pacing on
        prepare()
        step()
    return prepare, step, box


def cool() -> None:
    """What the rest of a training step leaves in the caches: 8 MB of other data written and
    other Python and NumPy code run (a NumPy policy update at 8 ranks, ~0.4 ms)."""
    from gpupace import PaceConfig, policy

    global _cool
    if _cool is None:
        params = policy.PolicyParams.from_config(PaceConfig(mode="pace"), 8)
        _cool = (np.empty(1 << 20), params, policy.init_state(8, 4), np.full((8, 4), 300.0),
                 np.zeros((8, 4)), np.full(8, 2e4))
    junk, params, state, w, d, steps = _cool
    junk.fill(1.0)
    policy.update_reference(params, state, w, d, steps)


_cool = None


def bench_policy(h: Harness) -> None:
    from gpupace import policy

    policy.prepare_fused()  # as the host backend does when it starts: every size fused
    worlds, sites = (WORLDS, SITES) if h.quick else (WORLDS_FULL, SITES_FULL)
    reps, warm = (30, 5) if h.quick else (400, 30)
    impls = implementations()
    h.progress(f"policy {list(impls)}, worlds {worlds}, sites {sites}")
    med: dict[str, dict[int, dict[int, float]]] = {k: {s: {} for s in sites} for k in impls}
    active = {}
    for s in sites:
        for n in worlds:
            # The implementations run interleaved on the same inputs: noise hits both alike.
            cases = {name: make_case(n, s, fn=fn) for name, fn in impls.items()}
            samples = interleave({k: c[1] for k, c in cases.items()}, warmup=warm, repeats=reps,
                                 prepare={k: cooled(c[0]) for k, c in cases.items()})
            for name, (_, _, box) in cases.items():
                case = {"impl": name, "world": n, "sites": s}
                med[name][s][n] = h.record("policy_update", case, samples[name])["p50"]
                active[f"{name} {n}x{s}"] = bool(box["state"].active.any())
    h.extras["policy_update"] = {
        "impls": {k: CALLS[k] for k in impls},
        "p50_us": {f"{k} {n}x{s}": med[k][s][n] for k in impls for s in sites for n in worlds},
        "pacing_active_in_case": active,
    }
    if 4096 in worlds and 4 in sites:
        v = med["own_rank"][4][4096]
        c = h.check(
            "policy update (update_in_place for its own rank, as the host backend calls it), "
            "4096 ranks x 4 sites, p50",
            v,
            TARGET_US,
            "us",
            op="<",
            detail=CALLS["own_rank"],
        )
        if not c.met:
            h.extras["policy_update_profile_4096x4"] = profile(4096, 4, 50 if h.quick else 300)
            h.progress("target missed: cProfile of 4096x4 kept in the JSON extras")
            reduction_layout(h, 4096, 4, reps)
    h.plot("policy_update", lambda fig: _draw(fig, worlds, sites, med))


def cooled(prepare: Callable[[], None]) -> Callable[[], None]:
    """`prepare` after `cool()`: each timed call starts with the caches a training step leaves."""
    def run() -> None:
        cool()
        prepare()
    return run


def profile(n_ranks: int, n_sites: int, calls: int = 300) -> str:
    """cProfile of `calls` updates, top entries by own time: where the microseconds go."""
    prepare, step, _ = make_case(n_ranks, n_sites)
    prof = cProfile.Profile()
    for _ in range(calls):
        prepare()
        prof.enable()
        step()
        prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(18)
    return buf.getvalue()


def reduction_layout(h: Harness, n_ranks: int, n_sites: int, reps: int) -> None:
    """The NumPy update (`update_reference`) reduces over ranks (axis 0 of [N, S]) several
    times per call; at small S NumPy walks that axis slowly. Times the same reductions on both
    layouts, the median of the step times and one tiny NumPy call (the per-call floor), to show
    where a NumPy update's time goes. The fused Numba path cannot be profiled this way."""
    a = np.random.default_rng(1).uniform(0, 1000, size=(n_ranks, n_sites))
    at = np.ascontiguousarray(a.T)
    steps = a[:, 0].copy()
    small = a[:8, :1].copy()
    ops = {
        "min over ranks, [N,S] axis 0 (as in update_reference)": lambda: a.min(axis=0),
        "min over ranks, [S,N] axis 1 (transposed)": lambda: at.min(axis=1),
        "nanmin over ranks, [N,S] axis 0": lambda: np.nanmin(a, axis=0),
        "argmin over ranks, [N,S] axis 0": lambda: a.argmin(axis=0),
        "median of N step times": lambda: np.median(steps),
        "elementwise [N,S] (a + a)": lambda: a + a,
        # The floor under any NumPy update: the fixed cost of one call on a tiny array.
        "elementwise [8,1] (a + a)": lambda: small + small,
    }
    s = interleave(ops, warmup=10, repeats=reps)
    for k, v in s.items():
        h.record("policy_update_parts", {"world": n_ranks, "sites": n_sites, "op": k}, v)


def _draw(fig, worlds: list[int], sites: list[int], med: dict) -> None:
    ax = fig.add_subplot(1, 1, 1)
    colors = {}
    for name, style in zip(med, ("-", "--", "-.", ":"), strict=False):
        for s in sites:
            (line,) = ax.plot(
                worlds,
                [med[name][s][n] for n in worlds],
                style,
                marker="o",
                ms=4,
                color=colors.get(s),
                label=f"{name}, {s} site(s)",
            )
            colors.setdefault(s, line.get_color())
    ax.axhline(TARGET_US, color="tab:red", lw=0.8, ls=":", label="target at 4096x4: 100 us")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(worlds, [str(n) for n in worlds])
    ax.set_xlabel("world size (ranks)")
    ax.set_ylabel("p50 time per update (us)")
    ax.set_title("Policy update per step (gpupace.policy)")
    ax.legend(fontsize=6.5, ncol=2)
    ax.grid(alpha=0.3, which="both")
