"""`gpupace demo` for every scenario and wait, as a user runs it, in one table: what the README's
demo table and its noise figures come from.

Each case is the CLI itself in a process of its own (`python -m gpupace demo --scenario S
--wait W --json ...`, the demo's defaults otherwise), run one after another, `--repeats` times
in turn, so that a drift of the machine spreads over every case. Per run: throughput of each
side, the change, step-time CV and p99, entry spread, the delay per rank-step and the share of
steps with a delay; the run's own noise gauge (how far its two baseline phases, the same code
at the run's two ends, differ in throughput; each paced phase against the baseline phase
beside it); and the run's wall time with the install's start-up.

    python bench/demo_matrix.py [--scenarios persistent,locality] [--waits sleep,spin]
                                [--repeats N] [--out DIR]

Writes demo_<machine>_<date>.json and .md under DIR (default: print only). 25-38 s a case on
a 2-core VM (2026-12-01): about 5 minutes for the 8 cases once.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import Machine, description, require_positive  # noqa: E402
from gpupace.demo import SCENARIOS, WAITS  # noqa: E402

CASE_TIMEOUT_S = 900  # the demo's own --timeout is 600 s for its ranks
# Run from here: this checkout's gpupace, the commit the results name (from elsewhere `python
# -m gpupace` finds the installed one). Its gpupace.kernels comes from kernels/ through the
# editable install (`pip install -e .`), as the README installs it.
ROOT = Path(__file__).resolve().parent.parent


def run_case(scenario: str, wait: str) -> dict:
    """One `gpupace demo` run; its JSON with the wall time ("wall_s") added."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "demo.json"
        t0 = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "gpupace", "demo", "--scenario", scenario, "--wait", wait,
             "--json", str(out)], capture_output=True, text=True, timeout=CASE_TIMEOUT_S,
            cwd=ROOT)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise RuntimeError(f"gpupace demo --scenario {scenario} --wait {wait} failed "
                               f"(exit {proc.returncode}): {proc.stderr.strip()[-2000:]}")
        result = json.loads(out.read_text())
    result["wall_s"] = wall
    return result


def _f(x, fmt: str, scale: float = 1.0) -> str:
    """A figure of the demo's JSON (None where it was not finite), scaled and formatted."""
    return "n/a" if x is None else fmt.format(x * scale)


def row(r: dict) -> str:
    b, p = r["baseline"], r["paced"]
    return "| " + " | ".join([
        r["scenario"], r["wait"], _f(b["throughput"], "{:.0f}"), _f(p["throughput"], "{:.0f}"),
        _f(r["throughput_gain_pct"], "{:+.1f}%"),
        f"{_f(b['step_time_cv'], '{:.3f}')} -> {_f(p['step_time_cv'], '{:.3f}')}",
        f"{_f(b['step_time_p99'], '{:.0f}', 1e-3)} -> {_f(p['step_time_p99'], '{:.0f}', 1e-3)}",
        f"{_f(b['entry_spread_mean'], '{:.1f}', 1e-3)} -> "
        f"{_f(p['entry_spread_mean'], '{:.1f}', 1e-3)}",
        _f(p["delay_mean"], "{:.1f}", 1e-3), _f(p["delayed_fraction"], "{:.0f}%", 100.0),
        _f(r["phase_spread_pct"]["baseline"], "{:.1f}%"),
        ", ".join(_f(g, "{:+.1f}%") for g in r["pair_gain_pct"]),
        f"{r['wall_s']:.0f}"]) + " |"


HEADER = ("| scenario | wait | baseline samples/s | paced samples/s | change | step-time CV | "
          "p99 (ms) | entry spread (ms) | delay per rank-step (ms) | steps with a delay | "
          "baseline phases apart | paced vs baseline beside it | wall (s) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def noise_summary(runs: list[dict]) -> dict:
    """The noise the runs gauged: the baseline phases' spread over every run, and the change of
    the runs in which pacing delayed nobody (the two sides ran the same code)."""
    spread = [r["phase_spread_pct"]["baseline"] for r in runs
              if r["phase_spread_pct"]["baseline"] is not None]
    idle = [r["throughput_gain_pct"] for r in runs
            if r["paced"]["delayed_fraction"] == 0 and r["throughput_gain_pct"] is not None]
    return {"baseline_phases_apart_pct": [min(spread), max(spread)] if spread else None,
            "change_without_delays_pct": [min(idle), max(idle)] if idle else None,
            "wall_s": [min(r["wall_s"] for r in runs), max(r["wall_s"] for r in runs)]}


def markdown(machine: Machine, runs: list[dict], noise: dict) -> str:
    m = machine
    lines = [
        "# gpupace demo on the CPU: baseline against paced, every scenario", "",
        f"- Machine: {m.cpu}, {m.cores} cores; load average at start {m.load_avg:.2f}"
        + (f"; {m.note}" if m.note else ""),
        f"- Date (UTC): {m.date}; versions: {m.versions_str()}",
        "- Each row is one `gpupace demo --scenario S --wait W` with its defaults (4 gloo ranks, "
        "four alternating phases, baseline-paced-paced-baseline), from `python "
        "bench/demo_matrix.py`; statistics over the steps of each phase after the pacer has "
        "settled, on both sides.",
        f"- Pacer settings from the environment: "
        f"{', '.join(runs[0].get('env_settings') or []) or 'none'}.",
        "- Read the rows with no delay first: both sides ran the same code there, so their "
        "change is this machine's noise, as is how far the two baseline phases of a run "
        "differ. A gain or loss of that size is not a finding.", "",
        HEADER, *(row(r) for r in runs), ""]
    apart, idle, wall = (noise[k] for k in ("baseline_phases_apart_pct",
                                            "change_without_delays_pct", "wall_s"))
    if apart:
        lines.append(f"Baseline phases apart: {apart[0]:.1f}% to {apart[1]:.1f}% over "
                     f"{len(runs)} runs.")
    if idle:
        lines.append(f"Change where pacing delayed nobody: {idle[0]:+.1f}% to {idle[1]:+.1f}%.")
    lines.append(f"Wall time a run, with start-up: {wall[0]:.0f}-{wall[1]:.0f} s.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=description(__doc__))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS),
                    help=f"comma-separated, of {', '.join(SCENARIOS)} (default all)")
    ap.add_argument("--waits", default=",".join(WAITS),
                    help=f"comma-separated, of {', '.join(WAITS)} (default both)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each case (default 1)")
    ap.add_argument("--note", default="", help="free text for the results (a busy machine)")
    ap.add_argument("--out", type=Path, default=None, help="write result files to this folder")
    args = ap.parse_args(argv)
    require_positive(ap, args, "repeats")
    picked = {}
    for name, allowed in (("scenarios", SCENARIOS), ("waits", WAITS)):
        given = [s.strip() for s in getattr(args, name).split(",") if s.strip()]
        bad = [s for s in given if s not in allowed]
        if not given or bad:
            ap.error(f"--{name} must name some of {', '.join(allowed)}, got "
                     f"{', '.join(map(repr, bad)) or 'none'}")
        picked[name] = given
    if args.out is not None:
        try:
            args.out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            ap.error(f"--out must be a folder that can be written, got {str(args.out)!r}: {e}")
    machine = Machine.probe(args.note)
    cases = [(s, w) for s in picked["scenarios"] for w in picked["waits"]] * args.repeats
    runs = []
    for i, (scenario, wait) in enumerate(cases, 1):
        print(f"[demo_matrix] {i}/{len(cases)}: --scenario {scenario} --wait {wait}",
              file=sys.stderr, flush=True)
        runs.append(run_case(scenario, wait))
        print(row(runs[-1]), file=sys.stderr, flush=True)
    noise = noise_summary(runs)
    text = markdown(machine, runs, noise)
    print(text)
    if args.out is not None:
        stem = args.out / f"demo_{machine.slug('cpu')}_{machine.date[:10].replace('-', '')}"
        stem.with_suffix(".md").write_text(text)
        payload = {"machine": asdict(machine),
                   "noise": noise, "runs": runs}
        stem.with_suffix(".json").write_text(json.dumps(payload, indent=1) + "\n")
        print(f"wrote {stem}.md and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
