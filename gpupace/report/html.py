"""The report page: one self-contained `report.html` and the findings as JSON.

The plots are embedded as base64 data URIs, so the page is a single file that still shows
every plot when it is mailed, attached to an issue or opened from an archive; the same PNGs
are also written next to it, for slides and for tools that want the images alone.
"""

from __future__ import annotations

import base64
import html
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..summary import summarize
from .compare import CHANGES, comparisons, fmt_change, pairs, summary_change
from .diagnose import (
    LOST_DEFINITION,
    MIN_CONFIDENCE,
    SUMMARY_KEYS,
    Diagnosis,
    _clean,
    measured,
    scaling,
)
from .load import Run
from .text import cost_line, headline, lost_line, split_line

SUMMARY_ROWS = (  # key, label, scale, format
    ("steps", "steps read", 1, "{:.0f}"),
    ("warmup_steps_left_out", "warm-up steps left out", 1, "{:.0f}"),
    ("measured_steps", "measured steps (all figures)", 1, "{:.0f}"),
    ("throughput", "throughput", 1, "{:,.1f}"),
    ("step_time_mean", "step time mean (ms)", 1e-3, "{:.2f}"),
    ("step_time_cv", "step time CV", 1, "{:.3f}"),
    ("step_time_p50", "step time p50 (ms)", 1e-3, "{:.2f}"),
    ("step_time_p99", "step time p99 (ms)", 1e-3, "{:.2f}"),
    ("step_time_max", "step time max (ms)", 1e-3, "{:.2f}"),
    ("spread_mean", "arrival spread mean (ms)", 1e-3, "{:.2f}"),
    ("spread_p99", "arrival spread p99 (ms)", 1e-3, "{:.2f}"),
    ("entry_spread_mean", "entry spread mean, after delays (ms)", 1e-3, "{:.2f}"),
    # In % of the steps, as their change column's points (0.00 -> 1.00 read "+100.0 pts")
    ("active_fraction", "pacing armed (% of steps)", 100, "{:.0f}"),
    ("delayed_fraction", "steps with a delay (%)", 100, "{:.0f}"),
    ("delay_mean", "delay per rank per step, over its collectives (ms)", 1e-3, "{:.3f}"),
    ("lost_fraction", "time lost (share of the measured time)", 100, "{:.1f}%"),
    ("unattributed_share", "of which unattributed", 100, "{:.0f}%"),
    ("ideal_step_us", "ideal step (ms)", 1e-3, "{:.2f}"),
    ("skipped_lines", "unreadable lines skipped", 1, "{:.0f}"),
)

CSS = """
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1000px;color:#222;padding:0 1em}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;
text-align:right;font-size:.9em}th{background:#f3f3f3}td.l,th.l{text-align:left}
.warn{background:#fff4e0;border-left:4px solid #f0a020;padding:.4em .8em;margin:.5em 0}
figure{margin:1.2em 0}img{max-width:100%;border:1px solid #eee}figcaption{font-size:.85em;color:#555}
.likely{color:#a00;font-weight:600}.possible{color:#b60}.none{color:#888}code{font-size:.9em}
"""


def run_summary(run: Run, diag: Diagnosis) -> dict[str, Any]:
    """The summary table's figures for one run: telemetry.summarize plus the diagnosis."""
    spp = run.samples_per_step
    recs = _records_view(run)
    s = summarize(recs, run.world_size, spp or 1.0)
    s["throughput_unit"] = "samples/s" if spp and spp != 1 else "steps/s"  # as summary.py
    s["steps"] = run.steps  # all read; the figures leave out the warm-up
    s.pop("units", None)
    s.update({k: v for k, v in diag.summary.items() if k not in s})
    s.update(label=run.label, file=str(run.path), source=run.header.get("source", ""),
             mode=run.mode, notes=list(run.notes))
    return s


def _records_view(run: Run) -> list[Any]:
    """Light StepRecords for `summarize`, which reads the scalars and the sum of the delays:
    no per-rank lists (4096 ranks x 100k steps would be 400 M Python floats)."""
    from ..telemetry import StepRecord

    delay_sum = np.nansum(run.delay, axis=1) if run.delay.size else np.zeros(run.steps)
    return [StepRecord(step=int(run.step[k]), time_s=float(run.time_s[k]),
                       step_time_us=float(run.step_time[k]), spread_us=float(run.spread[k]),
                       residual_us=float(run.residual[k]), transfer_us=float(run.transfer[k]),
                       straggler=int(run.straggler[k]), active=bool(run.active[k]),
                       delay_us=delay_sum[k:k + 1])
            for k in np.flatnonzero(measured(run))]


FINDINGS_UNITS = ("times in us; throughput in each summary's throughput_unit; shares and "
                  "fractions from 0 to 1; a summary's steps: every step read, measured_steps: "
                  "those its figures rest on (the warm-up left out)")


def findings(runs: Sequence[Run], diags: Sequence[Diagnosis]) -> dict[str, Any]:
    """findings.json: one entry per run in `runs` (its label, headline, summary and modes, in
    the order given), the paced-vs-baseline `comparisons`, and `scaling` across world sizes
    when the runs have several. Nothing at the top level describes one run alone."""
    per_run, sums = [], []
    for run, d in zip(runs, diags, strict=True):
        sums.append(run_summary(run, d))
        per_run.append({"label": run.label, "headline": headline(d),
                        "summary": {**dict.fromkeys(SUMMARY_KEYS), **sums[-1]},
                        "modes": d.to_dict()["modes"]})
    out: dict[str, Any] = {"units": FINDINGS_UNITS, "lost_time_definition": LOST_DEFINITION,
                           "attribution_threshold": MIN_CONFIDENCE,
                           "runs": per_run, "comparisons": comparisons(runs, sums)}
    scale = scaling(list(runs), list(diags))
    if scale is not None:
        out["scaling"] = scale
    return _clean(out)


def _fmt(v: Any, scale: float, fmt: str) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return fmt.format(v * scale)


def _img(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def render(runs: Sequence[Run], diags: Sequence[Diagnosis], plots: Sequence[tuple[str, str]],
           out: Path) -> str:
    """The page as a string; the PNGs named in `plots` are read from `out`."""
    esc = html.escape
    sums = [run_summary(r, d) for r, d in zip(runs, diags, strict=True)]
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>gpupace report</title>"
             f"<style>{CSS}</style></head><body>",
             "<h1>gpupace report</h1>",
             f"<p>{esc(time.strftime('%Y-%m-%d %H:%M %Z'))}; files: "
             + ", ".join(f"<code>{esc(str(r.path))}</code>" for r in runs) + "</p>"]
    for r in runs:
        for note in r.notes:
            parts.append(f"<div class='warn'>{esc(r.label)}: {esc(note)}</div>")
        if r.skipped:
            more = "".join(f"<li>{esc(s)}</li>" for s in r.skipped[:10])
            extra = f"<li>... {len(r.skipped) - 10} more</li>" if len(r.skipped) > 10 else ""
            parts.append(f"<details class='warn'><summary>{esc(r.label)}: {len(r.skipped)} "
                         f"lines skipped; this report covers the {r.steps} readable steps"
                         f"</summary><ul>{more}{extra}</ul></details>")

    parts.append("<h2>Headline</h2><ul>"
                 + "".join(f"<li><b>{esc(headline(d))}</b></li>" for d in diags) + "</ul>")

    comps = pairs(runs)
    parts.append("<h2>Summary</h2><table><tr><th class='l'></th>"
                 + "".join(f"<th>{esc(r.label)}</th>" for r in runs)
                 + "".join(f"<th>change: {esc(runs[j].label)} vs {esc(runs[i].label)}</th>"
                           for i, j in comps) + "</tr>")
    for key, label, scale, fmt in SUMMARY_ROWS:
        cells = []
        for s in sums:  # a real run without samples_per_step in its header counts steps
            unit = f" {s.get('throughput_unit', 'steps/s')}" if key == "throughput" else ""
            cells.append(f"<td>{_fmt(s.get(key), scale, fmt)}{unit}</td>")
        for i, j in comps:
            v = summary_change(key, sums[i], sums[j]) if key in CHANGES else None
            cells.append(f"<td>{esc(fmt_change(key, v)) if key in CHANGES else ''}</td>")
        parts.append(f"<tr><td class='l'>{esc(label)}</td>{''.join(cells)}</tr>")
    parts.append("</table><p><small>Every figure covers the measured steps: the warm-up "
                 "steps the header names are left out. Changes: relative (%) for times and "
                 "throughput, in percentage points (pts) for fractions.</small></p>")
    for comp in comparisons(runs, sums):  # the notes findings.json has, one source for both
        for note in comp["notes"]:
            parts.append(f"<p><small>{esc(comp['title'])}: {esc(note)}</small></p>")

    parts.append(f"<h2>Diagnosis</h2><p>{esc(LOST_DEFINITION.capitalize())}; it is split "
                 "between the study's four failure modes. A mode below a confidence of "
                 f"{MIN_CONFIDENCE} is <i>not enough evidence</i> and gets no share: the "
                 "time the split would give it (its candidate share) counts as "
                 "unattributed.</p>")
    for run, d in zip(runs, diags, strict=True):
        parts.append(_diagnosis_html(run, d))

    scale = scaling(list(runs), list(diags))
    if scale is not None:
        grows = scale["spread_grows_with_world_size"]
        said = (f"The median arrival spread {'grows' if grows else 'does not grow'} with the "
                "world size (synchronisation amplification makes it grow)." if grows is not None
                else f"{scale['note'][0].upper()}{scale['note'][1:]}.")
        parts.append(f"<h3>Across world sizes</h3><p>{esc(said)}</p>"
                     "<table><tr><th class='l'>run</th><th>ranks</th><th>spread p50 (ms)</th>"
                     "<th>spread / step</th><th>sync_amplification share</th></tr>")
        for r in scale["rows"]:
            parts.append(f"<tr><td class='l'>{esc(r['label'])}</td><td>{r['world_size']}</td>"
                         f"<td>{r['spread_p50_us'] / 1e3:.2f}</td>"
                         f"<td>{r['spread_over_step_p50']:.3f}</td>"
                         f"<td>{100 * r['sync_amplification_share']:.0f}%</td></tr>")
        parts.append("</table>")
    parts.append("<h2>Plots</h2>")
    for name, caption in plots:
        parts.append(f"<figure><img src='{_img(out / name)}' alt='{esc(name)}' "
                     f"data-file='{esc(name)}'><figcaption>{esc(caption)} "
                     f"(<a href='{esc(name)}'>{esc(name)}</a>)</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


def _diagnosis_html(run: Run, d: Diagnosis) -> str:
    esc = html.escape
    s = d.summary
    head = f"<h3>{esc(run.label)}</h3><p><b>{esc(headline(d))}</b></p>"
    if cost := cost_line(d):
        head += f"<p>{esc(cost[:1].upper() + cost[1:])}.</p>"
    if "lost_fraction" in s:
        head += f"<p>{esc(lost_line(d))}.<br>{esc(split_line(d))}.</p>"
    if s.get("note"):
        head += f"<p class='warn'>{esc(s['note'])}</p>"
    rows = ["<table><tr><th class='l'>mode</th><th>share</th><th>candidate share</th>"
            "<th>confidence</th><th class='l'>verdict</th><th class='l'>ranks</th>"
            "<th class='l'>evidence</th><th class='l'>suggested action</th></tr>"]
    for m in d.modes:
        cls = {"likely": "likely", "possible": "possible"}.get(m.verdict, "none")
        ev = "; ".join(f"{esc(k)} {esc(_short(v))}" for k, v in m.evidence.items()
                       if v is not None and not k.endswith("_note"))
        ranks = ", ".join(map(str, m.ranks[:12])) + (" ..." if len(m.ranks) > 12 else "")
        action = esc(m.action) if m.verdict != "not enough evidence" else ""
        rows.append(f"<tr><td class='l'>{esc(m.mode)}</td><td>{100 * m.share:.0f}%</td>"
                    f"<td>{100 * m.candidate_share:.0f}%</td>"
                    f"<td>{m.confidence:.2f}</td><td class='l {cls}'>{esc(m.verdict)}</td>"
                    f"<td class='l'>{esc(ranks)}</td><td class='l'><small>{ev}</small></td>"
                    f"<td class='l'><small>{action}</small></td></tr>")
    if "unattributed_share" in s:
        rows.append(f"<tr><td class='l'>unattributed</td>"
                    f"<td>{100 * s['unattributed_share']:.0f}%</td><td></td><td></td>"
                    "<td class='l none'>modes below the threshold, and excess with no spread "
                    "or transfer excess</td><td></td><td></td><td></td></tr>")
    rows.append("</table>")
    return head + "".join(rows)


def _short(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_short(x)}" for k, x in list(v.items())[:8]) + "}"
    return str(v)
