"""Paced against plain gloo all_reduce on 2 local ranks, 4 KB to 64 MB: what a paced
collective costs on the host backend, and what the per-step exchange (`Pacer.step()`) adds.

Six variants run interleaved in one loop (order rotated every repeat, a barrier before each
timed call, so noise hits all of them alike and repeat i of each is a fair pair):
  plain   `dist.all_reduce`
  plain2  `dist.all_reduce` again: the control, whose ratio to plain is the pairing's noise
          alone (what a paced/plain ratio must be read against)
  paced   `pacer.all_reduce` (the site: stamps, delay, bookkeeping), its pacer's `step()`
          untimed before each call (then the barrier). Both ranks start each call aligned, so
          the policy delays nobody: this is the mechanism's cost at zero delay
  step    `step()` of a pacer whose one paced call runs untimed just before it: one site
          per step, the worst case (its own pacer: with the order rotated, the paced
          variant's calls do not always fall between two of its steps)
  paced8  a second pacer's `all_reduce`, with `step()` after every 8th call (a step of 8
          buckets), timed together, so the exchange is amortised as in a DDP step
  exchange  a plain all_gather of a timing row (what step() sends), so that step - exchange
          is the host work of a step
Ratios are taken pair by pair; `paced+step` is paced_i + step_i against plain_i, and `paced8`
is compared over windows of 8 consecutive repeats. Rank 0's clock is reported.
"""

from __future__ import annotations

import sys

import numpy as np

from .harness import Harness, interleave, median_ci

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [4 << 10, 1 << 20]
WINDOW = 8  # sites per step of the amortised variant
CONTROL = "plain2/plain (control)"
LABELS = {
    CONTROL: "plain call again (control: the pairing's noise)",
    "paced/plain": "paced call (the site)",
    "(paced+step)/plain": "paced call + step() every call (1 site per step)",
    f"paced8/plain (windows of {WINDOW})": f"paced call, step() every {WINDOW} calls",
}


def repeats_for(nbytes: int, quick: bool) -> int:
    """Enough pairs for stable medians in ~5 s per size on a 2-core VM (1 MB: ~2 ms a call);
    1 MB gets the most because it carries the target."""
    if quick:
        return WINDOW
    if nbytes == 1 << 20:
        return 600
    if nbytes <= 4 << 20:
        return 240
    return 40 if nbytes <= 16 << 20 else 24


def human(nbytes: int) -> str:
    return f"{nbytes >> 20}MB" if nbytes >= 1 << 20 else f"{nbytes >> 10}KB"


def _variants(t, rank: int, delays: dict[str, list[float]]) -> tuple[dict, dict, dict]:
    """The six timed callables for one message size, each pacer fresh, and what runs untimed
    before a variant's calls: the paced variant's step() (closing the step of its previous
    call: a pacer without steps stops timing past `max_sites` calls), the step variant's paced
    collective; and the pacers that must step once a call."""
    import torch
    import torch.distributed as dist

    import gpupace

    cfg = gpupace.PaceConfig(mode="pace")
    paced, stepped, paced8 = gpupace.Pacer(cfg), gpupace.Pacer(cfg), gpupace.Pacer(cfg)
    calls8 = 0

    def close_paced_step() -> None:  # untimed, before each paced call: one site a step
        rec = paced.step()
        if rec is not None:
            delays["paced"].append(rec.delay_us[rank])

    def run8() -> None:
        nonlocal calls8
        paced8.all_reduce(t)
        calls8 += 1
        if calls8 % WINDOW == 0:
            rec = paced8.step()
            if rec is not None:
                delays["paced8"].append(rec.delay_us[rank])

    # The exchange alone: the all_gather that step() makes, of a timing row of the same size,
    # so that step - exchange is the host work of a step (policy update, record).
    row = torch.zeros(2 + 2 * cfg.max_sites, dtype=torch.float64)
    gathered = [torch.zeros_like(row) for _ in range(dist.get_world_size())]
    fns = {
        "plain": lambda: dist.all_reduce(t),
        "plain2": lambda: dist.all_reduce(t),
        "paced": lambda: paced.all_reduce(t),
        "step": stepped.step,
        "paced8": run8,
        "exchange": lambda: dist.all_gather(gathered, row),
    }
    untimed = {"step": lambda: stepped.all_reduce(t), "paced": close_paced_step}
    return fns, untimed, {"paced": paced, "step": stepped}


def _rank(rank: int, world_size: int, sizes: list[int], quick: bool) -> dict:
    """Runs on every rank (spawned by `run_ranks`); returns rank-local samples in us."""
    import torch
    import torch.distributed as dist

    out: dict = {}
    for k, nbytes in enumerate(sizes):
        if rank == 0:  # the sizes take ~5 s each: said, as the caller waits for all of them
            print(f"  gloo all_reduce {human(nbytes)} ({k + 1}/{len(sizes)})", file=sys.stderr,
                  flush=True)
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        delays: dict[str, list[float]] = {"paced": [], "paced8": []}
        # Full runs warm up one whole window, so paced8's steps fall on the same repeats each size;
        # a barrier before every timed call, so each starts with both ranks aligned.
        fns, untimed, stepping = _variants(t, rank, delays)
        repeats = repeats_for(nbytes, quick)
        samples = interleave(
            fns,
            warmup=2 if quick else WINDOW,
            repeats=repeats,
            before=dist.barrier,
            prepare=untimed,
        )
        for name, pacer in stepping.items():  # a pacer left without steps stops timing
            if pacer.steps < repeats:
                raise RuntimeError(f"bench bug: the {name} variant's pacer stepped "
                                   f"{pacer.steps} times in {repeats} repeats")
        out[nbytes] = {
            "samples": samples,
            "delay_us": {k: np.asarray(v) for k, v in delays.items()},
        }
    return out


def window_ratio(num: np.ndarray, den: np.ndarray, width: int) -> np.ndarray:
    """sum(num)/sum(den) over consecutive windows of `width` repeats (the tail is dropped)."""
    n = (min(num.size, den.size) // width) * width
    return num[:n].reshape(-1, width).sum(1) / den[:n].reshape(-1, width).sum(1)


def bench_allreduce(h: Harness) -> None:
    from gpupace.launch import run_ranks

    sizes = QUICK_SIZES if h.quick else SIZES
    h.progress(f"gloo all_reduce, 2 ranks, sizes {[human(s) for s in sizes]}")
    res = run_ranks(_rank, 2, sizes, h.quick, timeout_s=900.0, collective_timeout_s=120.0)[0]
    summary = {}
    for nbytes in sizes:
        s, dl = res[nbytes]["samples"], res[nbytes]["delay_us"]
        size = human(nbytes)
        for k in ("plain", "plain2", "paced", "step", "paced8", "exchange"):
            h.record("gloo_all_reduce", {"size": size, "variant": k}, s[k])
        pairs = {
            CONTROL: s["plain2"] / s["plain"],
            "paced/plain": s["paced"] / s["plain"],
            "(paced+step)/plain": (s["paced"] + s["step"]) / s["plain"],
            f"paced8/plain (windows of {WINDOW})": window_ratio(s["paced8"], s["plain"], WINDOW),
        }
        for name, r in pairs.items():
            h.record(
                "gloo_all_reduce_ratio", {"size": size, "ratio": name}, r, metric="ratio", unit="x"
            )
        h.record(
            "gloo_all_reduce",
            {"size": size, "variant": "paced-plain"},
            s["paced"] - s["plain"],
            metric="overhead",
        )
        h.record(
            "gloo_all_reduce",
            {"size": size, "variant": "plain2-plain (control)"},
            s["plain2"] - s["plain"],
            metric="overhead",
        )
        h.record(
            "gloo_all_reduce",
            {"size": size, "variant": "step-exchange (host work of a step)"},
            s["step"] - s["exchange"],
            metric="overhead",
        )
        summary[size] = {
            "bytes": nbytes,
            **{name: float(np.median(r)) for name, r in pairs.items()},
            "ratio_ci95": {n: median_ci(r) for n, r in pairs.items()},
            "added_us_ci95": median_ci(s["paced"] - s["plain"]),  # the site's cost, in us
            "control_added_us_ci95": median_ci(s["plain2"] - s["plain"]),
            "ratio_p20": {n: float(np.percentile(r, 20)) for n, r in pairs.items()},
            "ratio_p80": {n: float(np.percentile(r, 80)) for n, r in pairs.items()},
            "steps_with_delay": {k: int((v > 0).sum()) for k, v in dl.items()},
            "steps": {k: int(v.size) for k, v in dl.items()},
            "delay_us_total": {k: float(v.sum()) for k, v in dl.items()},
        }
    h.extras["gloo_all_reduce"] = summary
    if 1 << 20 in sizes:
        one = summary["1MB"]
        ci = one["ratio_ci95"]
        h.check(
            "paced 1 MB gloo all_reduce / plain, median of pairs",
            one["paced/plain"],
            1.10,
            "x",
            detail="the paced call itself (site); step() shown separately; median's 95% "
            "bootstrap interval [{:.3f}, {:.3f}]: a rerun can move it that much; the control "
            "(plain again / plain) {:.3f} [{:.3f}, {:.3f}]".format(
                *ci["paced/plain"], one[CONTROL], *ci[CONTROL]),
            interval=ci["paced/plain"],
        )
        name8 = f"paced8/plain (windows of {WINDOW})"
        h.check(
            "context: (paced 1 MB + step() every call) / plain, median of pairs",
            one["(paced+step)/plain"],
            1.10,
            "x",
            detail="one site per step: the exchange is not amortised",
            interval=ci["(paced+step)/plain"],
        )
        h.check(
            f"context: paced 1 MB with step() every {WINDOW} calls / plain, median of windows",
            one[name8],
            1.10,
            "x",
            interval=ci[name8],
        )
    h.plot("overhead_vs_size", lambda fig: _draw(fig, sizes, summary))


def _draw(fig, sizes: list[int], summary: dict) -> None:
    ax = fig.add_subplot(1, 1, 1)
    x = np.asarray(sizes, dtype=float)
    names = list(summary[human(sizes[0])]["ratio_p20"])
    for name, marker in zip(names, "xosd", strict=False):
        med = np.array([summary[human(n)][name] for n in sizes])
        lo = np.array([summary[human(n)]["ratio_p20"][name] for n in sizes])
        hi = np.array([summary[human(n)]["ratio_p80"][name] for n in sizes])
        ax.plot(x, med, marker=marker, label=LABELS.get(name, name))
        ax.fill_between(x, lo, hi, alpha=0.15)
    ax.axhline(1.0, color="0.3", lw=0.8)
    ax.axhline(1.10, color="tab:red", lw=0.8, ls="--", label="target 1.10x")
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [human(n) for n in sizes])
    # Log ratios: the step-every-call band spans up to ~7x, the paced call sits near 1.
    ax.set_yscale("log")
    ticks = [0.5, 0.75, 1.0, 1.5, 2, 3, 5, 8]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("message size (float32 all_reduce, 2 gloo ranks)")
    ax.set_ylabel("time ratio to plain all_reduce")
    ax.set_title("Pacing overhead against message size: median of pairs, band p20-p80")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
