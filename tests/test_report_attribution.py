"""`gpupace report` on telemetry shaped like `gpupace demo`'s: 4 ranks, 80 steps of which 10
are warm-up, one persistently late rank. The files are written by the project's own
TelemetryWriter with a Pacer's header; one test runs a real Pacer on 4 gloo ranks.

What is checked: a mode without evidence gets no share (its time is unattributed), the clear
case is attributed to locality with its rank, the lost time is a share of the measured time,
the headline comes first, paced runs are compared with their baselines, every figure leaves
the warm-up out, and the advice is worded for the run's backend. And what the loader does
with a file given twice, a damaged record, and runs of one name in two directories."""

from __future__ import annotations

import json
import re
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from gpupace import PaceConfig, Pacer
from gpupace.cli import main
from gpupace.report.compare import pairs
from gpupace.report.diagnose import MIN_CONFIDENCE, MODES, diagnose, measured
from gpupace.report.html import findings
from gpupace.report.load import load_runs
from gpupace.report.plots import cdf_title, straggler_counts
from gpupace.report.ranks import rank_costs
from gpupace.report.text import headline
from gpupace.telemetry import StepRecord, TelemetryWriter, make_header

pytestmark = pytest.mark.timeout(120)

WARMUP = 10
STEPS = 80  # one demo phase: 160 steps per side in two phases


def write_run(path: Path, *, label: str, mode: str = "observe", seed: int = 0,
              late_ms: float = 18.6, late_fraction: float = 0.91, world: int = 4,
              torch_version: str = "2.13.0+cpu", steps: int = STEPS, late_ranks=None,
              late_from: int = 0, samples_per_step: int = 128, **extra) -> Path:
    """A demo-shaped run through TelemetryWriter: each rank computes 30 ms +- 2 ms, the last
    rank (or `late_ranks`) `late_ms` more in `late_fraction` of the steps; the step ends when the last rank
    arrives plus an independent transfer (~0.6 ms). Warm-up steps have rank 0 last, by a
    start-up skew of hundreds of ms. A paced run (`mode="pace"`) delays the early ranks."""
    rng = np.random.default_rng(seed)
    cfg = PaceConfig(mode=mode, warmup_steps=WARMUP).to_dict()
    header = make_header(source="pacer", world_size=world, label=label, config=cfg,
                         samples_per_step=samples_per_step, scenario="persistent", **extra)
    header["versions"]["torch"] = torch_version  # what the build that wrote it says
    writer = TelemetryWriter(path, header, interval=20)
    t = 0.0
    for k in range(steps):
        comp = 30e3 + rng.normal(0.0, 2e3, world)
        if k < WARMUP:
            comp[0] += 300e3 + 10e3 * k  # start-up skew: rank 0 last through the warm-up
        elif rng.random() < late_fraction and k >= late_from:
            comp[[world - 1] if late_ranks is None else list(late_ranks)] += late_ms * 1e3
        last = comp.max()
        early = last - comp
        delay = np.zeros(world)
        if mode == "pace" and k >= WARMUP:
            delay = np.maximum(early - 2e3, 0.0)  # paced: the early ranks spin most of it
        transfer = 600.0 + rng.exponential(100.0)
        step_time = float(last + transfer) if k else float("nan")
        t += (step_time if k else last) / 1e6
        writer.write(StepRecord(
            step=k, time_s=t, step_time_us=step_time, spread_us=float(early.max()),
            residual_us=float((early - delay).max()), transfer_us=transfer,
            straggler=int(np.argmax(comp)), active=mode == "pace" and k >= WARMUP,
            earliness_us=early.tolist(), wait_us=(early - delay + transfer).tolist(),
            delay_us=delay.tolist(), step_times_us=[step_time] * world,
            site_spread_us=[float(early.max())]))
    writer.close()
    return path


@pytest.fixture()
def demo_like(tmp_path):
    return write_run(tmp_path / "baseline-1.jsonl", label="baseline-1")


def _mode(d, name):
    return next(m for m in d.modes if m.mode == name)


def test_a_mode_without_evidence_gets_no_share_and_its_time_is_unattributed(demo_like):
    run = load_runs([demo_like])[0]
    d = diagnose(run)
    s = d.summary
    amp = _mode(d, "sync_amplification")
    # One rank last in ~91% of the steps: no rotation, so no evidence of amplification...
    assert amp.evidence["top_late_rank_fraction"] > 0.8
    assert amp.confidence < MIN_CONFIDENCE and amp.verdict == "not enough evidence"
    # ...although the split would give it a good part of the time: it goes to unattributed.
    assert amp.candidate_share > 0.05
    assert amp.share == 0.0 and amp.lost_us == 0.0
    assert s["low_confidence_us"] >= amp.candidate_share * s["lost_us"] - 1e-6
    assert s["unattributed_us"] == pytest.approx(s["unexplained_us"] + s["low_confidence_us"])
    for m in d.modes:  # a share if and only if the evidence reaches the threshold
        assert (m.share > 0) == (m.confidence >= MIN_CONFIDENCE), (m.mode, m.share, m.confidence)
    total = sum(m.share for m in d.modes) + s["unattributed_share"]
    assert total == pytest.approx(1.0)


def test_one_persistent_late_rank_is_attributed_to_locality(demo_like):
    d = diagnose(load_runs([demo_like])[0])
    loc = _mode(d, "locality")
    assert loc.ranks == [3]
    assert loc.verdict != "not enough evidence" and loc.confidence >= MIN_CONFIDENCE
    assert d.modes[0] is loc and loc.share > 0.3
    assert loc.evidence["offset_us"]["3"] == pytest.approx(18.6e3, rel=0.15)
    late = d.summary["late_rank"]
    assert late["rank"] == 3 and late["persistent"]
    assert late["last_fraction"] == pytest.approx(0.91, abs=0.08)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_rank_late_in_every_step_of_a_short_run_is_likely_locality(tmp_path, seed):
    """30 measured steps, as in one phase of `gpupace demo`, with rank 3 late in all of them:
    the evidence is clear (a binomial z of 5.5 against a rank with no offset), whatever the
    step count says about the other modes."""
    path = write_run(tmp_path / "short.jsonl", label="short", steps=WARMUP + 30,
                     late_fraction=1.0, seed=seed)
    d = diagnose(load_runs([path])[0])
    loc = _mode(d, "locality")
    assert loc.ranks == [3] and loc.verdict == "likely", (loc.confidence, loc.evidence)
    assert loc.evidence["late_steps_z"] == pytest.approx(30 ** 0.5)
    assert headline(d).startswith("short: rank 3 last in 100% of steps")
    assert "leading cause locality" in headline(d)


def test_lost_time_is_a_share_of_the_measured_time(demo_like):
    run = load_runs([demo_like])[0]
    s = diagnose(run).summary
    st = run.step_time[measured(run)]
    assert s["measured_steps"] == STEPS - WARMUP == st.size
    assert s["mean_step_us"] == pytest.approx(st.mean())
    assert 0.0 < s["lost_fraction"] <= 1.0
    # The ideal step: the 5th percentile, over the steps in which rank 3 was late, of the step
    # times less its lead over the latest other rank (up to its offset behind the others'
    # median), below every step
    e = run.earliness[measured(run)]
    behind = np.median(np.median(e[:, :3], axis=1) - e[:, 3])
    lead = np.clip(np.min(e[:, :3], axis=1) - e[:, 3], 0.0, behind)
    late = np.median(e, axis=1) - e[:, 3] >= 0.5 * s["steady_offset_us"]
    assert s["ideal_step_us"] == pytest.approx(np.percentile((st - lead)[late], 5))
    assert s["ideal_step_us"] < st.min()
    # ~ 1 - ideal / mean: the share of the time the ideal step would have saved
    assert s["lost_fraction"] == pytest.approx(1 - s["ideal_step_us"] / st.mean(), abs=0.02)


def test_cli_prints_the_headline_then_the_cost_then_lost_time_with_its_definition(
        demo_like, tmp_path, capsys):
    assert main(["report", str(demo_like), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("baseline-1: rank 3 last in 9") and "% of steps" in lines[0]
    assert "ms behind the median rank" in lines[0]
    assert "cause locality (" in lines[0] and "confidence 0." in lines[0]
    assert lines[1].startswith("  the last rank alone, by its lead over the next-latest: up to ")
    assert "rank 3 " in lines[1]
    assert lines[2].strip().startswith("lost ") and "% of the measured time" in lines[2]
    assert "ideal step" in lines[2] and "5th percentile of the step times" in lines[2]
    assert "unattributed" in lines[3] and "sync_amplification" in lines[3]
    assert any(line.startswith("(lost time: ") for line in lines)


def test_no_single_cause_when_no_mode_has_evidence(tmp_path, capsys):
    # The late rank is late only half the time, by a varying amount: no steady offset, no
    # rotation, too few steps for the rest.
    path = write_run(tmp_path / "weak.jsonl", label="weak", late_fraction=0.5, late_ms=6.0,
                     seed=3, steps=50)
    d = diagnose(load_runs([path])[0])
    assert all(m.share == 0 for m in d.modes), [(m.mode, m.confidence) for m in d.modes]
    assert d.summary["unattributed_share"] == pytest.approx(1.0)
    assert main(["report", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("weak: ") and "no single cause with enough evidence" in first


def test_paced_runs_are_compared_with_their_baselines(tmp_path, capsys):
    d = tmp_path / "runs"
    d.mkdir()
    for k in (1, 2):  # what `gpupace demo --telemetry` writes
        write_run(d / f"baseline-{k}.jsonl", label=f"baseline-{k}", seed=10 + k)
        write_run(d / f"paced-{k}.jsonl", label=f"paced-{k}", mode="pace", seed=20 + k)
    runs = load_runs([d])
    assert [r.label for r in runs] == ["baseline-1", "baseline-2", "paced-1", "paced-2"]
    assert pairs(runs) == [(0, 2), (1, 3)]
    assert len(cdf_title(runs)) < 50 and "4 runs" in cdf_title(runs)
    assert cdf_title(runs[:1]) == "Step-time CDF, measured steps"
    out = tmp_path / "out"
    assert main(["report", str(d), "--out", str(out), "--json", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "paced-1 vs baseline-1: throughput " in text and "paced-2 vs baseline-2: " in text
    doc = json.loads((out / "findings.json").read_text())
    assert not {"summary", "modes"} & set(doc)
    assert [r["label"] for r in doc["runs"]] == [r.label for r in runs]
    assert all(r["headline"].startswith(r["label"] + ": ") for r in doc["runs"])
    comp = doc["comparisons"][0]
    assert (comp["baseline"], comp["compared"]) == ("baseline-1", "paced-1")
    base, paced = doc["runs"][0]["summary"], doc["runs"][2]["summary"]
    thr = comp["changes"]["throughput"]
    assert thr["change"] == pytest.approx(
        100 * (paced["throughput"] / base["throughput"] - 1), abs=1e-3)
    delayed = comp["changes"]["delayed_fraction"]
    assert delayed["change_unit"] == "percentage points"
    assert delayed["change"] == pytest.approx(
        100 * (paced["delayed_fraction"] - base["delayed_fraction"]), abs=1e-2)
    # each run's lost time is against its own ideal step: not a figure to compare runs by
    assert not {"lost_fraction", "unattributed_share", "ideal_step_us"} & set(comp["changes"])
    page = (out / "report.html").read_text()
    assert "<th>change: paced-1 vs baseline-1</th>" in page
    assert "<th>change: paced-2 vs baseline-2</th>" in page
    # The noise gauge: the two baselines' throughputs, the same job unpaced, and whether
    # each comparison's change is within their gap (a review saw +32.3% shown as pacing's
    # beside baselines 25.7% apart).
    thr = [doc["runs"][k]["summary"]["throughput"] for k in range(4)]
    gap = 100 * abs(thr[0] - thr[1]) / ((thr[0] + thr[1]) / 2)
    for c, (b, p) in zip(doc["comparisons"], ((0, 2), (1, 3)), strict=True):
        gauge = [n for n in c["notes"] if n.startswith("the unpaced runs baseline-1, baseline-2")]
        assert len(gauge) == 1 and f"differ in throughput by {gap:.1f}%" in gauge[0]
        within = abs(100 * (thr[p] / thr[b] - 1)) <= gap
        assert ("within that" in gauge[0]) == within
        assert f"({gauge[0]})" in text and gauge[0].replace("'", "&#x27;") in page
    # Two runs: one change column, no gauge
    two = load_runs([d / "paced-1.jsonl", d / "baseline-1.jsonl"])
    assert pairs(two) == [(1, 0)] and cdf_title(two).endswith("paced-1 vs baseline-1")
    assert not any("unpaced runs" in n for c in findings(two, [diagnose(r) for r in two])[
        "comparisons"] for n in c["notes"])
    # An unpaced run of another batch size is another job, not a repeat of the baseline
    write_run(tmp_path / "batch256.jsonl", label="batch256", seed=12, samples_per_step=256)
    three = load_runs([d / "baseline-1.jsonl", tmp_path / "batch256.jsonl", d / "paced-1.jsonl"])
    comps = findings(three, [diagnose(r) for r in three])["comparisons"]
    assert not any("unpaced runs" in n for c in comps for n in c["notes"])
    # Two unpaced runs compared (a job before and after a fix): the gauge would be the
    # comparison itself
    two = load_runs([d / "baseline-1.jsonl", d / "baseline-2.jsonl"])
    comps = findings(two, [diagnose(r) for r in two])["comparisons"]
    assert len(comps) == 1 and not any("unpaced runs" in n for n in comps[0]["notes"])


def test_every_count_leaves_the_warm_up_out(demo_like, tmp_path):
    run = load_runs([demo_like])[0]
    assert run.first_measured_step == WARMUP and run.steps == STEPS
    hist, counted, n = straggler_counts(run)
    s = diagnose(run).summary
    assert n == s["measured_steps"] == STEPS - WARMUP
    assert counted == hist.sum() <= n
    # Rank 0 is last through all 10 warm-up steps and rarely after: none of those counted
    warm_rank0 = int((run.straggler[:WARMUP] == 0).sum())
    assert warm_rank0 == WARMUP
    assert hist[0] == int((run.straggler[WARMUP:] == 0).sum()) < warm_rank0


def test_locality_advice_is_worded_for_the_backend(tmp_path):
    cpu = write_run(tmp_path / "cpu.jsonl", label="cpu")
    gpu = write_run(tmp_path / "gpu.jsonl", label="gpu", torch_version="2.13.0+cu128",
                    process_group_backend="nccl")
    unknown = write_run(tmp_path / "unknown.jsonl", label="unknown", torch_version="2.13.0")
    runs = load_runs([cpu, gpu, unknown])
    assert [r.comm_backend for r in runs] == ["gloo", "nccl", ""]
    act = {r.label: _mode(diagnose(r), "locality").action for r in runs}
    assert "rank 3 " in act["cpu"] and "ranks 3" not in act["cpu"]
    assert "gloo" in act["cpu"] and "nvidia-smi" not in act["cpu"]
    assert "nvidia-smi topo -m" in act["gpu"] and "of rank 3 " in act["gpu"]
    assert "rank 3 " in act["unknown"] and "CPU runs" in act["unknown"]


def _persistent_straggler(rank, world, path):
    """A real Pacer on gloo ranks: the last rank sleeps 15 ms before every collective."""
    import torch

    pacer = Pacer(PaceConfig(mode="observe", warmup_steps=5, telemetry_path=path,
                             telemetry_interval=10), label="real")
    rng = np.random.default_rng(rank)
    t = torch.ones(1000)
    try:
        for _ in range(65):
            time.sleep(0.015 if rank == world - 1 else rng.uniform(0.0, 0.002))
            pacer.all_reduce(t)
            t.fill_(1.0)
            pacer.step()
    finally:
        pacer.close()
    return None


@pytest.mark.timeout(240)  # 4 ranks: 23-26 s with the cores loaded, within run_ranks' 180 s
def test_a_real_pacer_run_with_a_persistent_straggler(tmp_path, capsys):
    from gpupace.launch import run_ranks

    path = tmp_path / "real.jsonl"
    run_ranks(_persistent_straggler, 4, str(path), timeout_s=180)
    run = load_runs([path])[0]
    d = diagnose(run)
    assert d.summary["measured_steps"] == 60
    loc = _mode(d, "locality")
    assert loc.ranks == [3] and loc.share > 0 and loc.confidence >= MIN_CONFIDENCE
    assert d.summary["late_rank"]["rank"] == 3 and d.summary["late_rank"]["persistent"]
    for m in d.modes:
        assert (m.share > 0) == (m.confidence >= MIN_CONFIDENCE), (m.mode, m.confidence)
    assert {m.mode for m in d.modes} == set(MODES)
    assert 0 < d.summary["lost_fraction"] <= 1
    assert main(["report", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("real: rank 3 last in "), first


def test_two_ranks_name_a_rank_late_in_most_steps(tmp_path):
    # 2 ranks: chance is 50%, so "twice chance" would ask for 100%; 89% must count.
    run = load_runs([write_run(tmp_path / "two.jsonl", label="two", world=2,
                               late_fraction=0.89, seed=2)])[0]
    d = diagnose(run)
    lr = d.summary["late_rank"]
    assert lr["rank"] == 1 and 0.8 < lr["last_fraction"] < 0.98 and lr["persistent"]
    line = headline(d)
    assert line.startswith("two: rank 1 last in ") and "behind the other rank" in line


def test_the_headline_names_a_likely_cause_before_a_larger_possible_one():
    """A mode with a larger share but weak evidence ("possible") must not be named the
    leading cause over one with strong evidence ("likely"); with none likely, the largest
    possible one is named as possible."""
    from gpupace.report.diagnose import Diagnosis, ModeFinding

    summary = {"label": "r", "lost_fraction": 0.2, "world_size": 8, "late_rank": None}
    amp = ModeFinding("sync_amplification", 0.5, 0.32, {}, [], "possible")
    loc = ModeFinding("locality", 0.2, 0.72, {}, [3], "likely")
    line = headline(Diagnosis(summary, [amp, loc]))
    assert "leading cause locality (20% of the lost time, confidence 0.72)" in line, line
    line = headline(Diagnosis(summary, [amp]))
    assert "possible cause sync_amplification (50% of the lost time, confidence" in line, line


def test_the_report_says_what_the_late_rank_costs(tmp_path):
    """Rank 3 computes 18.6 ms more than the others (30 +- 2 ms) in 91% of the steps: it holds
    those steps up by 18.6 ms less the lead of the latest other rank over it (a few ms)."""
    path = write_run(tmp_path / "baseline-1.jsonl", label="baseline-1")
    run = load_runs([path])[0]
    c = rank_costs(run, top=4)
    top = c["ranks"][0]
    assert top["rank"] == 3 and 12e3 < top["cost_us_per_step"] < 0.95 * 18.6e3, c
    assert sum(r["cost_us_per_step"] for r in c["ranks"]) == pytest.approx(c["lead_us_per_step"])
    assert main(["report", str(path), "--out", str(tmp_path / "out"), "--quiet", "--json"]) == 0
    page = (tmp_path / "out" / "report.html").read_text()
    assert "The last rank alone, by its lead over the next-latest: up to" in page
    doc = json.loads((tmp_path / "out" / "findings.json").read_text())
    cost = doc["runs"][0]["summary"]["late_cost"]
    assert cost["ranks"][0]["rank"] == 3
    assert cost["lead_us_per_step"] == pytest.approx(c["lead_us_per_step"], rel=1e-3)


# -- files given twice, damaged records, runs of one name ----------------------------------


def _demo_dir(d: Path) -> Path:
    """What `gpupace demo --ranks 2 --telemetry DIR` writes: two baselines, two paced runs."""
    d.mkdir(parents=True)
    for k in (1, 2):
        write_run(d / f"baseline-{k}.jsonl", label=f"baseline-{k}", seed=10 + k, world=2)
        write_run(d / f"paced-{k}.jsonl", label=f"paced-{k}", mode="pace", seed=20 + k,
                  world=2)
    return d


def _compared(text: str) -> list[tuple[str, str]]:
    """(compared, baseline) of each comparison line the report printed."""
    return re.findall(r"^(.+) vs (.+?): throughput ", text, flags=re.M)


def _damaged(src: Path, dst: Path, line: int, change) -> Path:
    """A copy of `src` with `change` applied to the JSON of its line `line` (0: the header)."""
    lines = src.read_text().splitlines()
    doc = json.loads(lines[line])
    change(doc)
    lines[line] = json.dumps(doc)
    dst.write_text("\n".join(lines) + "\n")
    return dst


def test_a_file_given_twice_is_read_once(tmp_path, capsys, monkeypatch):
    """`report runs/paced-1.jsonl runs` read paced-1 twice, and the copy took paced-2's
    place against baseline-2; `report X X` compared a run with itself."""
    monkeypatch.chdir(tmp_path)
    d = _demo_dir(tmp_path / "runs")
    assert main(["report", "runs/paced-1.jsonl", "runs", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert _compared(text) == [("paced-1", "baseline-1"), ("paced-2", "baseline-2")], text
    assert "note: runs/paced-1.jsonl was given 2 times" in text
    runs = load_runs(["runs/paced-1.jsonl", d / "paced-1.jsonl", "runs/../runs/paced-1.jsonl"])
    assert [r.label for r in runs] == ["paced-1"]
    assert "runs/paced-1.jsonl was given 3 times" in runs[0].notes[0]
    assert main(["report", "runs/paced-1.jsonl", "runs/paced-1.jsonl", "--quiet"]) == 0
    assert _compared(capsys.readouterr().out) == []


def test_a_record_of_another_world_size_is_skipped_not_a_rank_more(tmp_path):
    """One record with 3 values in a 2-rank file made the report count 3 ranks and name no
    cause ("behind the median rank"); a header saying 99 ranks did the same."""
    clean = write_run(tmp_path / "two.jsonl", label="two", world=2, seed=2)

    def third_rank(rec):
        rec["earliness_us"].append(5e4)
        rec["wait_us"].append(1.0)

    bad = _damaged(clean, tmp_path / "three.jsonl", 41, third_rank)  # step 40
    run = load_runs([bad])[0]
    assert run.world_size == 2 and run.earliness.shape == (STEPS - 1, 2)
    assert run.skipped == ["step 40: earliness_us holds 3 values, expected 2 (one per rank)"]
    assert "1 unreadable or implausible lines skipped (first: step 40: " in run.notes[0]
    # A file with an end line: the skipped record's step is not one more "step with no
    # record", put down to steps without a paced collective
    ended = _damaged(bad, tmp_path / "ended.jsonl", 0, lambda h: h.update(end_mark=True))
    with ended.open("a") as f:
        f.write(json.dumps({"gpupace": "end", "steps": STEPS, "how": "closed", "dropped": 0})
                + "\n")
    notes = load_runs([ended])[0].notes
    assert not any("have no record" in n for n in notes), notes
    assert any("1 unreadable or implausible lines skipped" in n for n in notes)
    # ... nor does it hide a step truly missing: step 20's record gone, the last one skipped
    lines = ended.read_text().splitlines(keepends=True)
    last = json.loads(lines[-2])
    last["spread_us"] = -5.0
    gone = tmp_path / "gone.jsonl"
    gone.write_text("".join(lines[:21] + lines[22:-2] + [json.dumps(last) + "\n", lines[-1]]))
    missing = [n for n in load_runs([gone])[0].notes if "have no record" in n]
    assert missing == ["gone.jsonl: 1 steps have no record: steps with no paced collective, or "
                       "that the ranks disagreed on (the ranks' warnings say when)"], missing
    d, want = diagnose(run), diagnose(load_runs([clean])[0])
    assert d.modes[0].mode == want.modes[0].mode == "locality" and d.modes[0].ranks == [1]
    assert "behind the other rank" in headline(d)
    # Without a world_size in the header, the length most records have counts
    no_size = _damaged(bad, tmp_path / "no-size.jsonl", 0, lambda h: h.pop("world_size"))
    assert load_runs([no_size])[0].world_size == 2
    # A header no record agrees with is an error naming both sizes
    h99 = _damaged(clean, tmp_path / "h99.jsonl", 0, lambda h: h.update(world_size=99))
    with pytest.raises(ValueError, match="world_size is 99, but no record holds 99 ranks' "
                                         "values: they hold 2"):
        load_runs([h99])

    # Records without per-rank values take the header's word, but not for a million ranks
    # of NaN matrices (8 GB at 500 steps)
    lines = [json.loads(line) for line in clean.read_text().splitlines()]
    for rec in lines[1:]:
        rec.update(earliness_us=[], wait_us=[], delay_us=[], step_times_us=[])
    blind = tmp_path / "blind.jsonl"
    blind.write_text("".join(json.dumps(doc) + "\n" for doc in lines))
    assert load_runs([blind])[0].world_size == 2
    huge = _damaged(blind, tmp_path / "huge.jsonl", 0, lambda h: h.update(world_size=1 << 20))
    with pytest.raises(ValueError, match=r"world_size is 1048576, and no record holds per-rank "
                                         r"values to confirm it: \d+ steps of 1048576 ranks"):
        load_runs([huge])


def test_a_record_with_an_absurd_time_is_skipped(tmp_path):
    """One step_time_us of 1e300 gave a numpy overflow warning, a mean step of 300 digits
    and "inf%"; an infinite earliness is as absurd."""
    clean = write_run(tmp_path / "two.jsonl", label="two", world=2, seed=2)
    huge = _damaged(clean, tmp_path / "huge.jsonl", 41, lambda r: r.update(step_time_us=1e300))
    bad = _damaged(huge, tmp_path / "bad.jsonl", 51,
                   lambda r: r["earliness_us"].__setitem__(0, float("inf")))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow on the way
        run = load_runs([bad])[0]
        d, want = diagnose(run), diagnose(load_runs([clean])[0])
    assert run.steps == STEPS - 2 and 40 not in run.step and 50 not in run.step
    assert run.skipped == ["step 40: step_time_us is 1e+300, expected a time of |t| < 1e+13 us",
                           "step 50: earliness_us holds inf, expected times of |t| < 1e+13 us"]
    assert "2 unreadable or implausible lines skipped" in run.notes[0]
    assert d.summary["lost_fraction"] == pytest.approx(want.summary["lost_fraction"], abs=0.02)
    assert run.step_time[1:].max() < 1e6  # the warm-up's, 0.3-0.4 s
    # A step with a 20-minute evaluation in it is a real one: kept (past the policy's 1000 s)
    long = load_runs([_damaged(clean, tmp_path / "long.jsonl", 61,
                               lambda r: r.update(step_time_us=1.2e9))])[0]
    assert long.steps == STEPS and long.step_time[long.step == 60] == pytest.approx(1.2e9)
    # A negative step time or spread is no measurement either: such records were left out of
    # the figures unsaid (measured steps 50 -> 40, no note)
    neg = _damaged(clean, tmp_path / "neg.jsonl", 41, lambda r: r.update(step_time_us=-5.0))
    neg = _damaged(neg, tmp_path / "neg2.jsonl", 51, lambda r: r.update(spread_us=-1.0))
    run = load_runs([neg])[0]
    assert run.skipped == ["step 40: step_time_us is -5.0, expected a time >= 0",
                           "step 50: spread_us is -1.0, expected a time >= 0"]
    assert "2 unreadable or implausible lines skipped" in run.notes[0]


def test_runs_of_one_name_in_two_directories_are_told_apart_by_the_directory(tmp_path,
                                                                           capsys):
    """`report runs runs2` labelled the second set "baseline-1 (baseline-1)": the file's
    name, which both sets share."""
    _demo_dir(tmp_path / "a" / "runs")
    _demo_dir(tmp_path / "runs2")
    _demo_dir(tmp_path / "b" / "runs")
    runs = load_runs([tmp_path / "a" / "runs", tmp_path / "runs2", tmp_path / "b" / "runs"])
    names = ["baseline-1", "baseline-2", "paced-1", "paced-2"]
    assert [r.label for r in runs] == [*names, *(f"{n} (runs2)" for n in names),
                                       *(f"{n} (b/runs)" for n in names)]
    # A header label shared by files of other names: the file's name tells them apart
    one = write_run(tmp_path / "one.jsonl", label="job")
    other = write_run(tmp_path / "other.jsonl", label="job")
    assert [r.label for r in load_runs([one, other])] == ["job", "job (other)"]
    assert main(["report", str(tmp_path / "a" / "runs"), str(tmp_path / "runs2"),
                 "--quiet"]) == 0
    assert ("paced-2 (runs2)", "baseline-2 (runs2)") in _compared(capsys.readouterr().out)


def test_a_comparison_says_when_its_changes_are_noise_or_its_throughputs_differ_in_unit(
        tmp_path, capsys):
    """A paced run that delayed nobody ran the baseline's code: its +10% was printed as a
    change; a baseline counting steps/s against a paced run counting samples/s printed
    "throughput +12700.0%"."""
    base = write_run(tmp_path / "b.jsonl", label="base", seed=1)
    steps_only = _damaged(base, tmp_path / "b-steps.jsonl", 0,
                          lambda h: h.pop("samples_per_step"))
    idle = _damaged(write_run(tmp_path / "i.jsonl", label="idle", seed=2),
                    tmp_path / "idle.jsonl", 0, lambda h: h["config"].update(mode="pace"))
    assert main(["report", str(steps_only), str(idle), "--out", str(tmp_path / "out"),
                 "--json", "--quiet"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("idle vs base: "))
    assert "throughput" not in line and "step time mean" in line
    assert ("  (throughput not compared: steps/s against samples/s (samples_per_step is in "
            "one run's header only))") in out
    assert ("  (pacing delayed nobody in the paced run: both ran the same code, so the changes "
            "are this machine's noise)") in out
    assert f"  (the p99 of {STEPS - WARMUP} measured steps is about their slowest step" in out
    (comp,) = json.loads((tmp_path / "out" / "findings.json").read_text())["comparisons"]
    assert comp["changes"]["throughput"]["change"] is None and len(comp["notes"]) == 3
    html = (tmp_path / "out" / "report.html").read_text()
    assert "pacing delayed nobody in the paced run" in html


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_a_late_node_is_named_and_its_host_advised(tmp_path, backend):
    """Every GPU of node 1 late: the advice was each GPU's placement ("bind them to their near
    NIC"), though the evidence held one whole node; the same local GPU late on every node is
    placement."""
    node = write_run(tmp_path / "node.jsonl", label="node", world=8, late_ranks=[4, 5, 6, 7],
                     late_ms=8.0, late_fraction=1.0, seed=3, gpus_per_node=4,
                     process_group_backend=backend)
    d = diagnose(load_runs([node])[0])
    loc = next(m for m in d.modes if m.mode == "locality")
    assert loc.evidence["late_nodes"] == [1] and loc.share > 0
    assert "ranks 4, 5, 6, 7 (4 ranks) (all of node 1) steadily late" in headline(d)
    assert loc.action.startswith("node 1 late as a whole (ranks")
    assert ("nvidia-smi" in loc.action) == (backend == "nccl")
    gpu3 = write_run(tmp_path / "gpu3.jsonl", label="gpu3", world=8, late_ranks=[3, 7],
                     late_ms=8.0, late_fraction=1.0, seed=3, gpus_per_node=4,
                     process_group_backend=backend)
    loc = next(m for m in diagnose(load_runs([gpu3])[0]).modes if m.mode == "locality")
    assert "late_nodes" not in loc.evidence and "late as a whole" not in loc.action


def test_a_rank_late_from_early_on_is_a_spell_not_placement(tmp_path):
    """Rank 3 late from step 110 of 400 is late in 74% of the measured steps: "locality 91%
    (likely)", "fix placement"; from step 160 it was a spell. Late from the start: placement."""
    spell = write_run(tmp_path / "spell.jsonl", label="spell", steps=400, late_from=110,
                      late_ms=10.0, late_fraction=1.0, seed=4, process_group_backend="nccl")
    d = diagnose(load_runs([spell])[0])
    assert "late in steps 110-399 only (a late spell" in headline(d), headline(d)
    assert not any(m.mode == "locality" and m.share > 0 for m in d.modes)
    steady = write_run(tmp_path / "steady.jsonl", label="steady", steps=400, late_ms=10.0,
                       late_fraction=1.0, seed=4, process_group_backend="nccl")
    d = diagnose(load_runs([steady])[0])
    assert d.modes[0].mode == "locality" and d.modes[0].ranks == [3]


def test_a_paced_run_that_measured_no_step_is_not_said_to_have_delayed_nobody():
    """A demo killed in its paced phase's warm-up: 'pacing delayed nobody ... the changes are
    this machine's noise' was said of a comparison with no change."""
    from gpupace.report.compare import notes

    base = {"measured_steps": 50, "throughput_unit": "samples/s"}
    for steps, said in ((0, False), (50, True)):
        other = {"measured_steps": steps, "delayed_fraction": 0,
                 "throughput_unit": "samples/s"}
        assert any("delayed nobody" in n for n in notes(base, other, paced=True)) == said
