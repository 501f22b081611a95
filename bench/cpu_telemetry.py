"""Telemetry cost per step on the host: building the step record from a policy update
(`make_record`), keeping it in the in-memory ring, and writing it to a JSON-lines file
(`TelemetryWriter.write`, which flushes and fsyncs every `telemetry_interval` records, so
its p99 shows the flush). A record holds per-rank lists, so the cost grows with the world.
A Pacer writes in the background (`background=True`). Its rows:
  per step, training thread's call (background)  `make_record`, the ring and the queueing
      alone: the encoding runs on the writer's thread, outside this figure;
  background thread, per record                the thread's own time per record (closing
      drains of 10 queued records, each one sample);
  added to a 20 ms step of Python work (background)  what a step of 20 ms of pure-Python
      work (it holds the GIL, as a training loop's Python does) takes longer with the
      background telemetry than without, over blocks of 10 steps that end once the writer
      has written them all: the GIL its thread takes, and what it has not done by then.
Every part runs after `cool()` (bench/cpu_policy), as after the rest of a training step:
interleaved alone, each found the caches the part before it left, and ran slower than
after itself.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from .cpu_policy import cool
from .harness import Harness, interleave

WORLDS = [2, 64, 1024, 4096]
QUICK_WORLDS = [2, 256]
N_SITES = 4


def repeats_for(world: int, quick: bool) -> int:
    # A 4096-rank record is ~0.14 MB of JSON: fewer repeats keep the temporary file small.
    if quick:
        return 20
    return 300 if world <= 64 else 150 if world <= 1024 else 60


def _parts(n: int, path: Path, rng: np.random.Generator) -> tuple[dict, dict, list, int]:
    """The timed callables for an `n`-rank record (plain, then with the background writer),
    the writers to close (plain, background), and the record size."""
    from gpupace import PaceConfig, policy
    from gpupace.telemetry import Ring, TelemetryWriter, make_header, make_record

    cfg = PaceConfig(mode="pace")
    w = 300.0 + rng.exponential(400.0, size=(n, N_SITES))
    d = np.zeros_like(w)
    steps = rng.normal(20_000.0, 500.0, size=n)
    params = policy.PolicyParams.from_config(cfg, n)
    _, stats = policy.update(params, policy.init_state(n, N_SITES), w, d, steps)
    header = make_header(source="bench", world_size=n)
    writer = TelemetryWriter(path, header, cfg.telemetry_interval)
    queued = TelemetryWriter(path.with_suffix(".bg.jsonl"), header, cfg.telemetry_interval,
                             background=True)
    ring = Ring(cfg.ring_size)
    rec = make_record(0, 0.0, stats, steps, 0)
    count = 0

    def whole(out) -> None:
        # What `Pacer.step()` does for telemetry once the policy has run.
        nonlocal count
        count += 1
        r = make_record(count, 1.0, stats, steps, 0)
        ring.append(r)
        out.write(r)

    parts = {
        "make_record": lambda: make_record(1, 1.0, stats, steps, 0),
        "ring.append": lambda: ring.append(rec),
        "to_json": rec.to_json,
        "writer.write": lambda: writer.write(rec),
        "per step total": lambda: whole(writer),
    }
    # Timed in a loop of their own: the thread they feed holds the GIL while it encodes, which
    # would otherwise slow the parts above (make_record at 4096 ranks: ~140 -> ~1200 us).
    background = {
        "writer.write (background): queueing alone": lambda: queued.write(rec),
        "per step, training thread's call (background)": lambda: whole(queued),
    }
    return parts, background, [writer, queued], len(rec.to_json()) + 1


def _busy(iterations: int) -> int:
    """Pure-Python work that holds the GIL, as a training loop's Python does."""
    total = 0
    for i in range(iterations):
        total += i & 7
    return total


def _beside_work(rec, n: int, path: Path, blocks: int, steps: int = 10,
                 work_ms: float = 20.0) -> np.ndarray:
    """What a step of `work_ms` of GIL-holding Python work takes longer with the background
    telemetry than without (us a step): blocks of `steps` steps without it and with it, in
    turn, each block with it ending once its writer has written every record (a fresh
    writer, closed: the encoding that spills past a step, or past the block, is counted).
    Pairs of single steps cannot tell it: a record's encoding lands in the steps after it.
    The baseline blocks open and close an empty writer too (a header, a thread, two fsyncs:
    1-4 ms a block, which a Pacer pays once a run, not once every 10 steps)."""
    from gpupace.telemetry import Ring

    t0 = time.perf_counter()
    _busy(200_000)
    iterations = max(1, int(200_000 * work_ms / ((time.perf_counter() - t0) * 1e3)))
    ring = Ring(64)

    def plain() -> None:
        empty = _background_writer(path.with_suffix(".empty.jsonl"), n)
        for _ in range(steps):
            _busy(iterations)
        empty.close()

    def with_telemetry() -> None:
        queued = _background_writer(path, n)
        for _ in range(steps):
            _busy(iterations)
            ring.append(rec)
            queued.write(rec)
        queued.close()

    s = interleave({"work": plain, "work + telemetry": with_telemetry}, warmup=1,
                   repeats=blocks)
    return (s["work + telemetry"] - s["work"]) / steps


def _background_writer(path: Path, n: int):
    """A Pacer's writer for `n` ranks: the JSON encoding on a thread of its own."""
    from gpupace.telemetry import TelemetryWriter, make_header

    return TelemetryWriter(path, make_header(source="bench", world_size=n), background=True)


def _thread_time_us(rec, n: int, path: Path, records: int = 10) -> float:
    """The background thread's own time per record: `records` writes of `rec` queued at once,
    then the wall time until `close()` has written them all, per record."""
    queued = _background_writer(path, n)
    t0 = time.perf_counter()
    for _ in range(records):
        queued.write(rec)
    queued.close()
    return (time.perf_counter() - t0) * 1e6 / records


def bench_telemetry(h: Harness) -> None:
    from gpupace import PaceConfig

    worlds = QUICK_WORLDS if h.quick else WORLDS
    interval = PaceConfig().telemetry_interval
    h.progress(f"telemetry per step, worlds {worlds}, {N_SITES} sites, flush every {interval}")
    rng = np.random.default_rng(0)
    sizes = h.extras.setdefault("telemetry_record_bytes", {})
    med: dict[str, dict[int, tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="gpupace-bench-") as tmp:
        for n in worlds:
            parts, background, (writer, queued), nbytes = _parts(n, Path(tmp) / f"t{n}.jsonl",
                                                                  rng)
            reps = repeats_for(n, h.quick)
            try:
                s = interleave(parts, warmup=5, repeats=reps, prepare={k: cool for k in parts})
                s.update(interleave(background, warmup=5, repeats=reps,
                                    prepare={k: cool for k in background}))
            finally:
                writer.close()
                queued.close()
            s["added to a 20 ms step of Python work (background)"] = _beside_work(
                parts["make_record"](), n, Path(tmp) / f"w{n}.jsonl", 3 if h.quick else 10)
            s["background thread, per record"] = np.array(
                [_thread_time_us(parts["make_record"](), n, Path(tmp) / f"d{n}_{i}.jsonl")
                 for i in range(3 if h.quick else 7)])
            for k, v in s.items():
                row = h.record("telemetry", {"world": n, "sites": N_SITES, "part": k}, v)
                med.setdefault(k, {})[n] = (row["p20"], row["p50"], row["p80"])
            sizes[str(n)] = nbytes
        to_json_parts(h, max(worlds))
    h.plot("telemetry_per_step", lambda fig: _draw(fig, worlds, med))


def _draw(fig, worlds: list[int], med: dict[str, dict[int, tuple[float, float, float]]]) -> None:
    ax = fig.add_subplot(1, 1, 1)
    x = np.asarray(worlds)
    floored = False
    for part, by_n in med.items():
        q = np.array([by_n[n] for n in worlds])
        # A difference of two noisy times can be <= 1 us, or negative, which a log axis drops
        # (a series then began at 1024 ranks): drawn at 1 us, as open triangles
        p50 = np.maximum(q[:, 1], 1.0)
        line, = ax.plot(x, p50, marker="o", label=part)
        low = q[:, 1] < 1.0
        if low.any():
            floored = True
            ax.plot(x[low], p50[low], "v", mfc="none", ms=9, color=line.get_color())
        ax.fill_between(x, np.maximum(q[:, 0], 1.0), np.maximum(q[:, 2], 1.0), alpha=0.15)
    if floored:
        ax.plot([], [], "v", mfc="none", color="0.3", label="p50 < 1 us (or < 0): drawn at 1")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(worlds, [str(n) for n in worlds])
    ax.set_xlabel(f"world size (ranks), {N_SITES} sites")
    ax.set_ylabel("us per step (p50, band p20-p80)")
    ax.set_title("Telemetry cost per step on the host (JSON-lines writer)")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))  # off the lines
    ax.grid(alpha=0.3, which="both")


def to_json_parts(h: Harness, n: int) -> None:
    """Where `StepRecord.to_json` spends its time at `n` ranks, the steps it takes re-timed
    one by one: the arrays as rounded lists, the JSON encoding of them, the whole call, and
    the background writer's chunked call (`to_json(chunk=...)`, which lets the training
    thread run between chunks)."""
    import dataclasses
    import json

    from gpupace import telemetry

    rng = np.random.default_rng(2)
    rec = telemetry.StepRecord(
        step=1,
        time_s=1.0,
        step_time_us=2e4,
        spread_us=500.0,
        residual_us=20.0,
        transfer_us=300.0,
        straggler=3,
        active=True,
        earliness_us=rng.uniform(0, 900, n),
        wait_us=rng.uniform(300, 1200, n),
        delay_us=rng.uniform(0, 500, n),
        step_times_us=rng.normal(2e4, 500, n),
        site_spread_us=rng.uniform(0, 900, N_SITES),
    )
    fields = {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)}

    def as_lists() -> dict:
        return {k: telemetry._as_list(v) for k, v in fields.items()}

    lists = as_lists()
    parts = {
        "arrays to rounded lists": as_lists,
        "json.dumps": lambda: json.dumps(lists, separators=(",", ":")),
        "to_json (all)": rec.to_json,
        f"to_json(chunk={telemetry.GIL_CHUNK}) (background writer)":
            lambda: rec.to_json(chunk=telemetry.GIL_CHUNK),
    }
    s = interleave(parts, warmup=3, repeats=20 if h.quick else 60)
    for k, v in s.items():
        h.record("telemetry_to_json_parts", {"world": n, "part": k}, v)
