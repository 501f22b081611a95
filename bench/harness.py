"""The benchmark harness: timing loops with warm-up and repeats, quantiles, the machine's
description, and the result files (CSV, JSON, Markdown, PNG plots) under `bench/results/`.

A benchmark is a small setup function `fn(h: Harness) -> None` that builds its inputs, times
them with `time_calls` / `interleave` (or inside ranks, then passes the samples to
`h.record`), and may state a target with `h.check` and draw with `h.plot`. Every result row
carries the machine (CPU, cores, GPU), library versions, date and the run's note, so a row
copied out of its file still says where it came from. Every row is the quantiles
p20/p50/p80/p99 of its samples and says how many (n): many, but for the few figures that are
one by nature (a peak RSS over several runs), whose rows say n=1.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import math
import os
import platform
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from gpupace.telemetry import json_safe

ROOT = Path(__file__).resolve().parent.parent  # the checkout
RESULTS_DIR = ROOT / "bench" / "results"
QUANTILES = (20, 50, 80, 99)
# Column order of the CSV and the keys of every JSON row; tests check it.
SCHEMA = (
    "suite",
    "bench",
    "case",
    "metric",
    "unit",
    "n",
    "p20",
    "p50",
    "p80",
    "p99",
    "mean",
    "cpu",
    "cores",
    "gpu",
    "versions",
    "date",
    "note",
)
_PACKAGES = (
    "torch",
    "numpy",
    "gpupace",
    "numba",
    "matplotlib",
    "triton",
    "cupy-cuda12x",
    "cupy-cuda13x",
)


# -- the machine --------------------------------------------------------------------------------
@dataclass(slots=True)
class Machine:
    """What the numbers were measured on. `note` is free text for what the code cannot see
    (a shared VM, a busy neighbour); the load average at start is recorded for the same reason."""

    cpu: str
    cores: int
    gpu: str
    versions: dict[str, str]
    date: str  # UTC, ISO 8601, when the run started
    load_avg: float
    note: str = ""
    uncommitted: list[str] = field(default_factory=list)  # library files differing from HEAD

    @classmethod
    def probe(cls, note: str = "") -> Machine:
        versions = library_versions()
        sha, dirty = git_state()
        if sha:
            versions["git"] = sha + ("+uncommitted" if dirty else "")
        versions["code_sha256"] = code_hash()
        if queues := os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS"):  # changes GPU figures
            versions["cuda_device_max_connections"] = queues
        # Two VMs both named "AMD EPYC" read 127 and 50 us for one benchmark: what tells them
        # apart, as far as the guest sees
        versions["kernel"] = platform.release()
        if mhz := cpu_mhz():
            versions["cpu_mhz"] = mhz
        return cls(
            cpu=cpu_name(),
            cores=os.cpu_count() or 0,
            gpu=gpu_name(),
            versions=versions,
            date=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            load_avg=os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
            note=note,
            uncommitted=dirty,
        )

    def slug(self, suite: str) -> str:
        """A short hardware name for file names: the GPU for the GPU suite, else the CPU."""
        if suite == "gpu" and self.gpu != "none":
            return _slugify(self.gpu)
        return f"{_slugify(self.cpu)}-{self.cores}c"

    def versions_str(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self.versions.items())


def _cpuinfo(field: str) -> str:
    """The first core's `field` in /proc/cpuinfo ("" where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_name() -> str:
    return _cpuinfo("model name") or platform.processor() or platform.machine() or "unknown-cpu"


def cpu_mhz() -> str:
    """The first core's clock as /proc/cpuinfo gives it ("" where it does not)."""
    try:
        return f"{float(_cpuinfo('cpu MHz')):.0f}"
    except ValueError:  # none, or not a number
        return ""


def gpu_name() -> str:
    """The first CUDA device's name, or "none". Never initialises CUDA when it is absent."""
    try:
        import torch
    except ImportError:
        return "none"
    if not torch.cuda.is_available():
        return "none"
    return torch.cuda.get_device_name(0)


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in _PACKAGES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    try:
        import torch

        if torch.version.cuda:
            out["cuda"] = str(torch.version.cuda)
            if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
                v = torch.cuda.nccl.version()  # a tuple in recent torch, an int in old ones
                out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # noqa: BLE001 - versions are informative, never fatal
        pass
    return out


def code_hash(root: Path | None = None) -> str:
    """sha256 (12 hex digits) of the library's, the benchmarks' and the GPU tests' Python
    sources (gpupace/, kernels/, bench/ less its results, tests/gpu/, whose figures the device
    check records), by path and content: where the commit cannot be
    checked (`GPUPACE_COMMIT` on the lent GPU machine), the same hash computed on a checkout
    of the named commit says whether the run measured that code."""
    import hashlib

    root = root or ROOT
    h = hashlib.sha256()
    for folder in ("gpupace", "kernels", "bench", "tests/gpu"):
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if "/results/" in rel or "__pycache__" in rel:
                continue
            h.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def git_state() -> tuple[str, list[str]]:
    """The checkout's commit and the files of the library and the benchmarks (gpupace/,
    kernels/, bench/) that differ from it, so a result can be traced to the code that
    measured it; ("", []) outside a git checkout. `GPUPACE_COMMIT`, where set, names the
    commit instead: the lent GPU machine's copy of the tree carries the .git of the session's
    first commit, not of the tree it was sent."""
    import os
    import subprocess

    if os.environ.get("GPUPACE_COMMIT"):
        return os.environ["GPUPACE_COMMIT"], []

    root = ROOT
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            text=True,
            capture_output=True,
            timeout=10,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--", "gpupace", "kernels", "bench"],
            cwd=root,
            text=True,
            capture_output=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return "", []
    dirty = [line[3:] for line in status.splitlines() if line[3:].endswith(".py")]
    return sha, dirty


def _slugify(text: str) -> str:
    text = re.sub(r"\(r\)|\(tm\)|\bcpu\b|@.*$|\bprocessor\b", "", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "unknown"


# -- timing -------------------------------------------------------------------------------------
def _finite(samples: Iterable[float]) -> np.ndarray:
    """The finite samples as a flat float64 array."""
    a = np.asarray(list(samples) if not isinstance(samples, np.ndarray) else samples,
                   dtype=np.float64).ravel()
    return a[np.isfinite(a)]


def median_ci(samples: Iterable[float], level: float = 0.95, resamples: int = 2000,
              seed: int = 0) -> tuple[float, float]:
    """Bootstrap interval of the median of the finite samples: how far the median of pairs
    could move on a rerun, the noise a verdict on it must be read against."""
    a = _finite(samples)
    if a.size < 2:
        return math.nan, math.nan
    draws = np.random.default_rng(seed).choice(a, size=(resamples, a.size))
    med = np.median(draws, axis=1)
    tail = 50.0 * (1.0 - level)
    return float(np.percentile(med, tail)), float(np.percentile(med, 100.0 - tail))


def quantiles(samples: Iterable[float]) -> dict[str, float]:
    """p20/p50/p80/p99, mean and count of the finite samples (NaN quantiles when none)."""
    a = _finite(samples)
    if a.size == 0:
        return {**{f"p{q}": math.nan for q in QUANTILES}, "mean": math.nan, "n": 0}
    qs = np.percentile(a, QUANTILES)
    return {
        **{f"p{q}": float(v) for q, v in zip(QUANTILES, qs, strict=True)},
        "mean": float(a.mean()),
        "n": int(a.size),
    }


def time_calls(
    fn: Callable[[], Any], *, warmup: int, repeats: int, sync: Callable[[], Any] | None = None
) -> np.ndarray:
    """Microseconds per call of `fn`, one sample per call after `warmup` untimed calls.
    `sync` (e.g. `torch.cuda.synchronize`) runs before each clock read: a host clock says
    nothing about queued device work."""
    return interleave({"_": fn}, warmup=warmup, repeats=repeats, sync=sync)["_"]


def interleave(
    fns: Mapping[str, Callable[[], Any]],
    *,
    warmup: int,
    repeats: int,
    sync: Callable[[], Any] | None = None,
    before: Callable[[], Any] | None = None,
    prepare: Mapping[str, Callable[[], Any]] | None = None,
) -> dict[str, np.ndarray]:
    """Times several variants in one loop, rotating their order every repeat, so that noise
    from a shared machine hits all of them alike and sample i of each variant is a fair pair.
    `prepare[k]` runs untimed before each call of variant k (e.g. writing its inputs afresh,
    as a collective would), then `before`, untimed, before every timed call (e.g. a barrier:
    last, so that every timed collective starts with the ranks aligned; a prepare between
    the barrier and the call, a pacer's step() with uneven host work, had one rank wait for
    the other inside the timed call: an A/A pair of plain all_reduces read 1.02-1.05x, the
    review's reproduction, 2026-11-30). The rotation depends only
    on the repeat index, so ranks running the same loop issue the same collectives in order.
    It moves where a round starts, not the cycle: each variant always runs right after the
    same other one, whose code and data it may find warm. Where that matters, `prepare` must
    cool the cache itself (bench/cpu_policy does)."""
    names = list(fns)
    out = {k: np.empty(repeats) for k in names}
    clock = time.perf_counter_ns
    for r in range(-warmup, repeats):
        shift = r % len(names)
        for k in names[shift:] + names[:shift]:
            if prepare is not None and k in prepare:
                prepare[k]()
            if before is not None:
                before()
            if sync is not None:
                sync()
            t0 = clock()
            fns[k]()
            if sync is not None:
                sync()
            t1 = clock()
            if r >= 0:
                out[k][r] = (t1 - t0) * 1e-3
    return out


# -- results ------------------------------------------------------------------------------------
@dataclass(slots=True)
class Check:
    """A target stated by a benchmark: met when `value <op> limit`."""

    name: str
    value: float
    limit: float
    unit: str
    op: str = "<="
    detail: str = ""
    interval: tuple[float, float] | None = None  # the value's 95% interval, when known

    @property
    def met(self) -> bool:
        return self._under(self.value)

    @property
    def settled(self) -> bool:
        """Whether the whole interval is on the value's side of the limit (none: taken so). A
        median of 1.099x against 1.10 with an interval of 1.02-1.15 read MET; a rerun can
        read MISSED."""
        return self.interval is None or self._under(self.interval[0]) == \
            self._under(self.interval[1])

    def _under(self, x: float) -> bool:
        if not math.isfinite(x):
            return False
        return x <= self.limit if self.op == "<=" else x < self.limit

    @property
    def verdict(self) -> str:
        if not self.settled:  # which side the median fell on, and that a rerun may cross
            return f"AT THE EDGE (median {'met' if self.met else 'missed'})"
        return "MET" if self.met else "MISSED"


@dataclass(slots=True)
class Harness:
    """Collects the rows, checks, skips and plots of one suite run and writes them out."""

    suite: str
    quick: bool = False
    out_dir: Path = RESULTS_DIR
    only: tuple[str, ...] = ()  # the benchmarks run, when not all of them
    machine: Machine = field(default_factory=Machine.probe)
    rows: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    skips: list[dict[str, str]] = field(default_factory=list)
    plots: list[Path] = field(default_factory=list)
    extras: dict[str, Any] = field(default_factory=dict)  # free-form per-bench facts (JSON only)

    def __post_init__(self) -> None:
        self.out_dir = Path(self.out_dir)

    @property
    def stem(self) -> str:
        """`<run>_<hardware>_<YYYYMMDD>`: dated, hardware-named result files; `run` names a
        partial one (`cpu-quick`, `cpu-only-policy`), which must not write over the full
        suite's files of the day."""
        day = self.machine.date[:10].replace("-", "")
        return f"{self.run}_{self.machine.slug(self.suite)}_{day}"

    @property
    def run(self) -> str:
        """The suite, and what made this run partial: `cpu`, `cpu-quick-only-policy`, ..."""
        return self.suite + ("-quick" if self.quick else "") + \
            "".join(f"-only-{n}" for n in sorted(self.only))

    def progress(self, msg: str) -> None:
        print(f"[bench {self.suite}] {msg}", file=sys.stderr, flush=True)

    def record(
        self,
        bench: str,
        case: Mapping[str, Any] | str,
        samples: Iterable[float],
        *,
        metric: str = "time",
        unit: str = "us",
    ) -> dict[str, Any]:
        """Adds one row: the quantiles of `samples` for `case` of `bench`."""
        case_str = case if isinstance(case, str) else " ".join(f"{k}={v}" for k, v in case.items())
        m = self.machine
        row = {
            "suite": self.run,  # a quick or partial run's rows say so, in the CSV too
            "bench": bench,
            "case": case_str,
            "metric": metric,
            "unit": unit,
            **quantiles(samples),
            "cpu": m.cpu,
            "cores": m.cores,
            "gpu": m.gpu,
            "versions": m.versions_str(),
            "date": m.date,
            "note": m.note,
        }
        row = {k: row[k] for k in SCHEMA}
        self.rows.append(row)
        self.progress(
            f"{bench} {case_str} {metric}: p50 {_fmt(row['p50'])} {unit} "
            f"(p20 {_fmt(row['p20'])}, p99 {_fmt(row['p99'])}, n={row['n']})"
        )
        return row

    def check(
        self, name: str, value: float, limit: float, unit: str, *, op: str = "<=", detail: str = "",
        interval: tuple[float, float] | None = None,
    ) -> Check:
        """States a target and prints whether it was met (never raises: a missed target is a
        result to report, not a crash); "AT THE EDGE" where the value's 95% `interval` holds
        the limit."""
        c = Check(name, float(value), float(limit), unit, op, detail,
                  None if interval is None else (float(interval[0]), float(interval[1])))
        self.checks.append(c)
        verdict = c.verdict
        if self.quick:  # a smoke run's few samples: a hint, not a verdict
            verdict += " (quick run: a few samples, indicative only)"
        print(
            f"TARGET {verdict}: {name}: {_fmt(c.value)} {unit} (target {op} {_fmt(limit)} {unit})"
            + (f"; {detail}" if detail else ""),
            file=sys.stderr,
            flush=True,
        )
        return c

    def skip(self, bench: str, reason: str) -> None:
        """Records that `bench` did not run here, with a one-line reason."""
        self.skips.append({"bench": bench, "reason": reason})
        self.progress(f"SKIP {bench}: {reason}")

    def plot(self, name: str, draw: Callable[[Any], None]) -> Path:
        """Draws with `draw(fig)` on a fresh matplotlib figure (Agg) and saves a PNG named
        after the result files."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig = plt.figure(figsize=(7.5, 4.5), dpi=110)
        try:
            draw(fig)
            fig.text(
                0.99,
                0.005,
                f"{self._hw_line()}  {self.machine.date[:10]}"
                + ("  QUICK RUN: a few samples" if self.quick else ""),
                ha="right",
                va="bottom",
                fontsize=6.5,
                color="0.4",
            )
            fig.tight_layout(rect=(0, 0.02, 1, 1))
            self.out_dir.mkdir(parents=True, exist_ok=True)
            path = self.out_dir / f"{self.stem}_{name}.png"
            fig.savefig(path)
        finally:
            plt.close(fig)
        self.plots.append(path)
        return path

    def _hw_line(self) -> str:
        m = self.machine
        gpu = f", GPU {m.gpu}" if m.gpu != "none" else ""
        return f"CPU {m.cpu} ({m.cores} cores){gpu}"

    def write(self) -> list[Path]:
        """Writes `<stem>.csv`, `.json` and `.md` (only when there is something to write) and
        returns every path written, plots included."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        paths = list(self.plots)
        base = self.out_dir / self.stem
        table = io.StringIO(newline="")
        w = csv.DictWriter(table, fieldnames=SCHEMA)
        w.writeheader()
        w.writerows(self.rows)
        write_whole(base.with_suffix(".csv"), table.getvalue())
        doc = {
            "suite": self.suite,
            "quick": self.quick,
            "only": sorted(self.only),
            "machine": asdict(self.machine),
            "rows": self.rows,
            "checks": [{**asdict(c), "met": c.met, "settled": c.settled} for c in self.checks],
            "skips": self.skips,
            "plots": [p.name for p in self.plots],
            "extras": self.extras,
        }
        write_whole(base.with_suffix(".json"), json.dumps(json_safe(doc), indent=1))
        write_whole(base.with_suffix(".md"), self.markdown())
        paths += [base.with_suffix(s) for s in (".csv", ".json", ".md")]
        return paths

    def finish(self, write: bool) -> int:
        """The end of a standalone script's `main`: the result files when `write` (their paths
        printed), then the Markdown on stdout. Returns 0, the exit status."""
        if write:
            for p in self.write():
                print(p)
        print(self.markdown())
        return 0

    def markdown(self) -> str:
        m = self.machine
        lines = [
            f"# gpupace benchmarks: {self.suite} suite{' (quick)' if self.quick else ''}"
            + (f", only {', '.join(sorted(self.only))}" if self.only else ""),
            "",
            f"- Machine: {self._hw_line()}; load average at start {m.load_avg:.2f}",
            f"- Date (UTC): {m.date}",
            f"- Versions: {m.versions_str()}",
        ]
        if m.note:
            lines.append(f"- Note: {m.note}")
        if m.uncommitted:
            lines.append(f"- Measured with uncommitted changes to: {', '.join(m.uncommitted)}")
        lines.append(
            "- Every figure is a quantile (or the mean) over the n samples of its row; "
            "times in microseconds unless the unit says otherwise."
        )
        if self.checks:
            lines += [
                "",
                "## Targets",
                "",
                "| target | value | limit | met | detail |",
                "|---|---|---|---|---|",
            ]
            lines += [
                f"| {c.name} | {_fmt(c.value)} {c.unit} | {c.op} {_fmt(c.limit)} {c.unit} "
                f"| {('yes' if c.met else 'NO') + ('' if c.settled else ', at the edge')} "
                f"| {c.detail} |"
                for c in self.checks
            ]
        if self.skips:
            lines += ["", "## Skipped", ""]
            lines += [f"- `{s['bench']}`: {s['reason']}" for s in self.skips]
        benches = list(dict.fromkeys(r["bench"] for r in self.rows))
        for b in benches:
            lines += [
                "",
                f"## {b}",
                "",
                "| case | metric | unit | n | p20 | p50 | p80 | p99 | mean |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            lines += [
                f"| {r['case']} | {r['metric']} | {r['unit']} | {r['n']} | {_fmt(r['p20'])} "
                f"| {_fmt(r['p50'])} | {_fmt(r['p80'])} | {_fmt(r['p99'])} | {_fmt(r['mean'])} |"
                for r in self.rows
                if r["bench"] == b
            ]
        if self.plots:
            lines += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in self.plots]
        return "\n".join(lines) + "\n"


def description(doc: str) -> str:
    """A script's --help description: the first sentence of its docstring's first paragraph
    (its first line stopped mid-sentence)."""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    m = re.match(r"(.*?\.)(\s|$)", para)
    return m.group(1) if m else para


def require_positive(ap: Any, args: Any, *names: str) -> None:
    """A standalone script's integer options that must be >= 1: `ap.error` (exit 2, the
    option and its value named) for the first that is not."""
    for name in names:
        value = getattr(args, name)
        if value < 1:
            ap.error(f"--{name} must be >= 1, got {value}")


def write_whole(path: Path, text: str) -> None:
    """Writes `text` to a temporary file beside `path`, then renames it over `path`: a kill
    mid-write (the device check's deadlines) leaves the previous version, never half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8", newline="")
    os.replace(tmp, path)


def _fmt(v: float) -> str:
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return "nan"
    a = abs(v)
    if a == 0 or 0.01 <= a < 1e5:  # 3 decimals below 10: a ratio of 1.104 is not "1.1"
        return f"{v:.3f}" if a < 10 else f"{v:.1f}" if a < 1000 else f"{v:.0f}"
    return f"{v:.3g}"

