"""`gpupace report` on a large telemetry file: wall time and peak memory of reading it
(`load_runs`) and of the whole report (diagnosis, plots, page), each in a fresh process.

The file is written first, untimed, by the pacer's own `TelemetryWriter` from real policy
updates: 4096 ranks x 2000 steps x 4 sites by default, rank 7 late by 3 ms in every step.

    python bench/report_load.py [--ranks N] [--steps N] [--repeats N] [--out DIR]

Built on `bench/harness.py`: `--out` writes CSV, JSON and Markdown there.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (  # noqa: E402
    RESULTS_DIR,
    Harness,
    Machine,
    description,
    require_positive,
)

SITES = 4
LATE_RANK, LATE_US = 7, 3000.0
COMMANDS = {
    "load_runs": "from gpupace.report import load_runs; load_runs([{path!r}])",
    "gpupace report": "from gpupace.cli import main; raise SystemExit(main(['report', "
                      "{path!r}, '--out', {out!r}, '--quiet']))",
}


def write_file(path: Path, ranks: int, steps: int, seed: int = 0) -> None:
    """A telemetry file as a pacer in observe mode writes it."""
    from gpupace import PaceConfig, policy
    from gpupace.telemetry import TelemetryWriter, make_header, make_record

    cfg = PaceConfig(mode="observe")
    rng = np.random.default_rng(seed)
    params = policy.PolicyParams.from_config(cfg, ranks)
    state = policy.init_state(ranks, SITES)
    header = make_header(source="pacer", world_size=ranks, label="large", config=cfg.to_dict())
    writer = TelemetryWriter(path, header, background=True)
    for k in range(steps):
        w = 300.0 + rng.exponential(400.0, size=(ranks, SITES))
        w[min(LATE_RANK, ranks - 1)] += LATE_US  # waits longest: the others are late for it
        d = np.zeros_like(w)
        step_us = rng.normal(20_000.0, 500.0, size=ranks)
        stats = policy.update_in_place(params, state, w, d, step_us)
        writer.write(make_record(k, 0.02 * k, stats, step_us, 0))
    writer.close()


def run_child(code: str) -> tuple[float, float]:
    """(wall seconds, peak RSS of the children so far in MB) of `code` in a fresh Python."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    seconds = time.perf_counter() - t0
    return seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024.0


def bench_report(h: Harness, ranks: int, steps: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gpupace-report-") as tmp:
        path = Path(tmp) / "large.jsonl"
        h.progress(f"writing {ranks} ranks x {steps} steps x {SITES} sites (untimed)")
        write_file(path, ranks, steps)
        mb = path.stat().st_size / 1e6
        h.extras["file_mb"] = mb
        case = {"ranks": ranks, "steps": steps, "file_mb": round(mb)}
        for name, code in COMMANDS.items():
            seconds, peak = [], 0.0
            for r in range(repeats):
                h.progress(f"{name}, run {r + 1}/{repeats}")
                s, peak = run_child(code.format(path=str(path), out=str(Path(tmp) / "report")))
                seconds.append(s)
            h.record("report_load", {**case, "command": name}, seconds, unit="s")
            # The children's peak RSS only grows: taken after each command's runs, the load's
            # figure is its own, the report's the larger of the two.
            h.record("report_load", {**case, "command": name}, [peak], metric="peak RSS",
                     unit="MB")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--ranks", type=int, default=4096, help="ranks (default 4096)")
    ap.add_argument("--steps", type=int, default=2000, help="steps (default 2000)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each command (default 2)")
    ap.add_argument("--out", type=Path, default=None, help="write result files to this folder")
    args = ap.parse_args(argv)
    require_positive(ap, args, "ranks", "steps", "repeats")
    h = Harness("report_load", machine=Machine.probe(),
                out_dir=args.out or RESULTS_DIR)
    bench_report(h, args.ranks, args.steps, args.repeats)
    return h.finish(write=args.out is not None)


if __name__ == "__main__":
    sys.exit(main())
