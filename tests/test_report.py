"""`gpupace report`: the diagnosis on simulated telemetry with known failure modes, damaged
files, and the CLI end to end."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpupace.cli import main
from gpupace.report.diagnose import MODES, diagnose
from gpupace.report.html import findings
from gpupace.report.load import load_runs, to_run
from gpupace.report.text import _pct, cost_line, headline
from gpupace.sim import presets, simulate, write_telemetry
from gpupace.telemetry import StepRecord

pytestmark = pytest.mark.timeout(120)

# (preset, nodes, gpus per node, seed): small clusters that keep the suite fast. Amplification
# grows with the rank count (the study's point), so it gets 16 ranks; the fabric preset's
# transfers hide behind compute below 8 nodes (its docstring).
SINGLE = {
    "runtime_jitter": ("jitter", 2, 4, 1),
    "locality": ("locality", 1, 8, 1),
    "fabric_contention": ("fabric", 8, 1, 1),
    "sync_amplification": ("amplification", 4, 4, 1),
}
STEPS = 400


@pytest.fixture(scope="module")
def sim_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("sim")


_CACHE: dict = {}


def _telemetry(sim_dir, preset, nodes, g, seed, policy="none", label=None, steps=STEPS):
    """Simulated telemetry with one known failure mode (cached across tests)."""
    key = (preset, nodes, g, seed, policy, label, steps)
    if key not in _CACHE:
        path = sim_dir / f"{preset}-{nodes}x{g}-{seed}-{policy}-{steps}.jsonl"
        res = simulate(presets.PRESETS[preset](nodes, g), policy=policy, steps=steps, seed=seed)
        write_telemetry(res, path, label=label)
        _CACHE[key] = (path, res)
    return _CACHE[key]


@pytest.mark.parametrize("mode", list(SINGLE))
def test_single_mode_ranks_first_with_most_of_the_share(sim_dir, mode):
    path, _ = _telemetry(sim_dir, *SINGLE[mode])
    d = diagnose(load_runs([path])[0])
    top = d.modes[0]
    assert top.mode == mode, [(m.mode, round(m.share, 2)) for m in d.modes]
    assert top.share > 0.5
    assert top.verdict != "not enough evidence" and top.confidence >= 0.3
    assert sum(m.share for m in d.modes) <= 1.0 + 1e-9
    assert all(0.0 <= m.share <= 1.0 and 0.0 <= m.confidence <= 1.0 for m in d.modes)


def test_shares_at_512_ranks_keep_their_digits(sim_dir):
    """At 512 ranks chance is 0.2%: "last in 2% of steps, 0% by chance" hid a tenfold excess,
    and the cost line said "0.00 ms a step ... (last in 0%)" of a cost below its digits."""
    path, _ = _telemetry(sim_dir, "jitter", 64, 8, 1)
    d = diagnose(load_runs([path])[0])
    words = headline(d)
    assert "0.2% by chance" in words, words
    assert not re.search(r"last in 0% of", words), words
    cost = cost_line(d)
    assert "0.00 ms" not in cost and "(last in 0%)" not in cost, cost
    assert [_pct(x) for x in (0.0, 0.0244, 5.0, 9.6, 100.0, 1e-5, float("nan"))] == [
        "0%", "0.024%", "5%", "10%", "100%", "<0.01%", "-"]


@pytest.mark.parametrize("seed", [2, 3])
def test_jitter_and_amplification_other_seeds(sim_dir, seed):
    for mode in ("runtime_jitter", "sync_amplification"):
        preset, nodes, g, _ = SINGLE[mode]
        path, _ = _telemetry(sim_dir, preset, nodes, g, seed)
        assert diagnose(load_runs([path])[0]).modes[0].mode == mode


def test_random_stragglers_are_not_told_to_pace(sim_dir):
    """The policy delays only steadily early ranks: on random stragglers it engages and delays
    nobody. The advice must not promise what pacing does not do, and a paced run that
    delayed nobody is not described as paced."""
    preset, nodes, g, seed = SINGLE["sync_amplification"]
    path, res = _telemetry(sim_dir, preset, nodes, g, seed, "gpupace", "paced")
    assert res.active.any() and not res.delay_us.any()  # engaged, never delayed
    amp = next(m for m in diagnose(load_runs([path])[0]).modes
               if m.mode == "sync_amplification")
    assert amp.verdict != "not enough evidence"
    assert "no delay can be planned" in amp.action and "mode='pace'" not in amp.action
    assert "pacing delayed" not in amp.action


@pytest.mark.parametrize("nodes,g", [(1, 8), (2, 4)])
def test_locality_names_the_slow_ranks(sim_dir, nodes, g):
    path, res = _telemetry(sim_dir, "locality", nodes, g, 1)
    d = diagnose(load_runs([path])[0])
    loc = next(m for m in d.modes if m.mode == "locality")
    assert sorted(loc.ranks) == sorted(res.slow_ranks) and res.slow_ranks
    # The offset is the 3 ms handicap of the preset, measured
    for r in res.slow_ranks:
        assert loc.evidence["offset_us"][str(r)] == pytest.approx(3000.0, rel=0.05)
    assert str(res.slow_ranks[0]) in loc.action
    assert loc.evidence["local_gpus"] == sorted({r % g for r in res.slow_ranks})
    assert loc.evidence["nodes_with_late_gpus"] == nodes


def test_quiet_run_is_not_enough_evidence(sim_dir):
    path, _ = _telemetry(sim_dir, "quiet", 2, 4, 1, steps=100)
    d = diagnose(load_runs([path])[0])
    assert all(m.verdict == "not enough evidence" for m in d.modes)
    assert "nothing worth diagnosing" in d.summary["note"]


def test_mixed_names_several_modes_and_the_locality_ranks(sim_dir):
    path, res = _telemetry(sim_dir, "mixed", 2, 4, 1)
    d = diagnose(load_runs([path])[0])
    named = {m.mode for m in d.modes if m.verdict != "not enough evidence"}
    assert {"locality", "fabric_contention"} <= named and len(named) >= 3, named
    loc = next(m for m in d.modes if m.mode == "locality")
    assert sorted(loc.ranks) == sorted(res.slow_ranks)
    assert 0.9 < sum(m.share for m in d.modes) <= 1.0 + 1e-9
    assert sum(m.share for m in d.modes) + d.summary["unattributed_share"] == pytest.approx(1.0)


def test_too_few_steps_is_not_enough_evidence():
    recs = [StepRecord(step=k, time_s=k * 0.1, step_time_us=1e5 + 50 * k, spread_us=10.0,
                       residual_us=10.0, transfer_us=5.0, straggler=k % 2, active=False,
                       earliness_us=[0.0, 10.0], wait_us=[1.0, 2.0], delay_us=[0.0, 0.0])
            for k in range(10)]
    run = to_run("short", Path("x.jsonl"), {"world_size": 2}, recs, [])
    d = diagnose(run)
    assert "only 10 measured steps" in d.summary["note"]
    assert "telemetry_every" not in d.summary["note"]
    # the first step has no step time (it is the interval from the step before)
    assert d.summary["note"].endswith("(of 10 steps read, 0 were warm-up (steps before 0) and "
                                      "0 more had no step time above 0)"), d.summary["note"]
    assert all(m.verdict == "not enough evidence" and m.share == 0 for m in d.modes)
    # A file written one step in 64 (4096 ranks, the default) says so, and what to do
    sampled = to_run("short", Path("x.jsonl"), {"world_size": 2, "telemetry_every": 64},
                     recs, [])
    assert "one step in 64, telemetry_every: run 1920 steps" in diagnose(sampled).summary["note"]


def test_nan_and_ragged_records_do_not_break_the_diagnosis():
    rng = np.random.default_rng(0)
    recs = []
    for k in range(120):
        n = 4 if k % 7 else 3  # a record holding fewer ranks: skipped
        e = rng.exponential(500.0, n).tolist()
        recs.append(StepRecord(step=k, time_s=k * 0.1,
                               step_time_us=float("nan") if k % 11 == 0 else
                               1e5 + rng.exponential(2000.0),
                               spread_us=max(e), residual_us=max(e), transfer_us=float("nan"),
                               straggler=int(np.argmin(e)), active=bool(k % 2),
                               earliness_us=e, wait_us=e, delay_us=[0.0] * n,
                               site_spread_us=[max(e)] * 3))
    run = to_run("odd", Path("odd.jsonl"), {"world_size": 4}, recs, [])
    assert run.steps == 120 - 18 and len(run.skipped) == 18 and run.world_size == 4
    assert run.skipped[0] == "step 0: earliness_us holds 3 values, expected 4 (one per rank)"
    d = diagnose(run)
    assert [m.mode for m in sorted(d.modes, key=lambda m: m.mode)] == sorted(MODES)
    json.dumps(d.to_dict(), allow_nan=False)


# -- damaged files ------------------------------------------------------------------------


def _report(tmp_path, capsys, *files, json_=True):
    args = ["report", *map(str, files), "--out", str(tmp_path / "out"), "--quiet"]
    rc = main(args + (["--json"] if json_ else []))
    return rc, capsys.readouterr()


def test_empty_missing_and_foreign_files_give_one_clear_error(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text('{"hello": 1}\n')
    header_only = tmp_path / "header.jsonl"
    header_only.write_text('{"gpupace": "telemetry", "format": 1, "world_size": 2}\n')
    for path, why in ((empty, "is empty"), (tmp_path / "nope.jsonl", "does not exist"),
                      (Path("/dev/null"), "is not a regular file"), ("", "path is empty"),
                      (foreign, "not a gpupace telemetry header"), (header_only, "no step records")):
        rc, cap = _report(tmp_path, capsys, path)
        assert rc == 2
        lines = cap.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("gpupace report: error:"), cap.err
        assert why in lines[0] and Path(path).name in lines[0]


def test_compressed_and_kept_aside_files_are_named_not_passed_over_silently(sim_dir, tmp_path):
    """A folder's run.jsonl.gz was dropped without a word, naming it said "line 1 is not a
    gpupace telemetry header (Expecting value...)", and a folder of a kept-aside run.jsonl.1
    alone said it held no telemetry files (a review's runs)."""
    import gzip

    src, _ = _telemetry(sim_dir, "quiet", 1, 4, 1, steps=100)
    d = tmp_path / "tel"
    d.mkdir()
    (d / "run.jsonl").write_bytes(src.read_bytes())
    (d / "old.jsonl.gz").write_bytes(gzip.compress(src.read_bytes()))
    (run,) = load_runs([d])
    assert any("left out: old.jsonl.gz, not named .jsonl" in n for n in run.notes), run.notes
    (d / "run.jsonl.bak").write_bytes(src.read_bytes())  # named too: read, not left out
    assert not any("run.jsonl.bak" in n for r in load_runs([d, d / "run.jsonl.bak"])
                   for n in r.notes if n.startswith("left out"))
    with pytest.raises(ValueError, match="old.jsonl.gz is gzip-compressed: decompress it first"):
        load_runs([d / "old.jsonl.gz"])
    aside = tmp_path / "aside"
    aside.mkdir()
    (aside / "run.jsonl.1").write_bytes(src.read_bytes())
    with pytest.raises(ValueError, match=r"no .jsonl telemetry files \(it holds run.jsonl.1: "
                                         "name a file to report it"):
        load_runs([aside])
    assert load_runs([aside / "run.jsonl.1"])[0].steps == 100


def test_a_directory_stands_for_its_jsonl_files(sim_dir, tmp_path):
    src, _ = _telemetry(sim_dir, "quiet", 2, 4, 1, steps=100)
    d = tmp_path / "tel"
    d.mkdir()
    for name in ("paced", "baseline"):
        lines = src.read_text().splitlines()
        header = dict(json.loads(lines[0]), label=name)
        (d / f"{name}.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert [r.label for r in load_runs([d])] == ["baseline", "paced"]
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no .jsonl telemetry files"):
        load_runs([tmp_path / "empty"])
    # Another tool's .jsonl beside them (training metrics) is passed over, with a note; named
    # on its own it is refused, and a directory of nothing else is
    (d / "metrics.jsonl").write_text('{"loss": 0.5}\n')
    (d / "created-not-written.jsonl").write_text("")  # no gpupace writer leaves a file empty
    (d / "a-folder.jsonl").mkdir()
    runs = load_runs([d])
    assert [r.label for r in runs] == ["baseline", "paced"]
    assert any("passed over" in n and "metrics.jsonl: line 1 is not a gpupace telemetry "
               "header" in n for n in runs[0].notes), runs[0].notes
    for given in ([d / "metrics.jsonl"], [d, d / "metrics.jsonl"], [d / "metrics.jsonl", d]):
        with pytest.raises(ValueError, match="metrics.jsonl: line 1 is not a gpupace telemetry"):
            load_runs(given)  # named, with its directory or not: the user meant it
    # a gpupace file the reader cannot take (a newer format) is not another tool's: refused
    newer = dict(json.loads(lines[0]), format=99)
    (d / "newer.jsonl").write_text("\n".join([json.dumps(newer), *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match="newer.jsonl: format 99 is newer"):
        load_runs([d])
    (d / "newer.jsonl").unlink()
    assert sum("passed over" in n for n in load_runs([d])[0].notes) == 2  # not the folder
    # a job that stopped before its first step: its header alone, passed over in a directory
    (d / "crashed.jsonl").write_text(json.dumps(dict(header, label="crashed")) + "\n")
    runs = load_runs([d])
    assert [r.label for r in runs] == ["baseline", "paced"]
    assert any("passed over" in n and "crashed.jsonl: no step records" in n
               for n in runs[0].notes), runs[0].notes
    with pytest.raises(ValueError, match="crashed.jsonl: no step records"):
        load_runs([d / "crashed.jsonl"])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "metrics.jsonl").write_text('{"loss": 0.5}\n')
    with pytest.raises(ValueError, match="no gpupace telemetry among the files given: .*metrics"):
        load_runs([tmp_path / "other"])


def test_a_corrupt_header_step_and_last_ranks_outside_the_run_are_noted(sim_dir, tmp_path):
    src, _ = _telemetry(sim_dir, "quiet", 2, 4, 1, steps=100)
    lines = src.read_text().splitlines()
    header = dict(json.loads(lines[0]), first_measured_step=-5)
    rec = dict(json.loads(lines[5]), straggler=17)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([json.dumps(header), *lines[1:5], json.dumps(rec), *lines[6:]]))
    (run,) = load_runs([bad])
    assert any(f"1 of {run.steps} records name a last rank outside ranks 0-7: counted as no "
               "one's" in n
               for n in run.notes), run.notes
    assert any("first_measured_step -5 is no step number" in n for n in run.notes), run.notes


def test_a_run_without_a_label_is_named_by_its_file(sim_dir, tmp_path):
    """A restarted Pacer keeps the run before as run.jsonl.1: it was labelled "run.jsonl"."""
    src, _ = _telemetry(sim_dir, "quiet", 2, 4, 1, steps=100)
    lines = src.read_text().splitlines()
    header = dict(json.loads(lines[0]), label="")
    for name in ("run.jsonl", "run.jsonl.1"):
        (tmp_path / name).write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    runs = load_runs([tmp_path / "run.jsonl", tmp_path / "run.jsonl.1"])
    assert [r.label for r in runs] == ["run", "run.jsonl.1"]


def test_records_of_one_step_twice_keep_the_later(sim_dir, tmp_path):
    """Two runs in one file (the first 40 steps of a second run appended after the first
    run's 100): each step once, the second run's record of it, and a note."""
    first, _ = _telemetry(sim_dir, "quiet", 2, 4, 1, steps=100)
    second, _ = _telemetry(sim_dir, "quiet", 2, 4, 2, steps=100)
    lines, again = first.read_text().splitlines(), second.read_text().splitlines()[1:41]
    joined = tmp_path / "joined.jsonl"
    joined.write_text("\n".join([*lines, *again]) + "\n")
    run = load_runs([joined])[0]
    np.testing.assert_array_equal(run.step, np.arange(100))
    later = [json.loads(line)["step_time_us"] for line in again]
    np.testing.assert_array_equal(run.step_time[:40], np.array(later, dtype=float))
    assert any("40 records repeat the step number of an earlier one" in n for n in run.notes)


def test_out_that_is_a_file_is_an_error(sim_dir, tmp_path, capsys):
    src, _ = _telemetry(sim_dir, "quiet", 2, 4, 1, steps=100)
    (tmp_path / "out").write_text("not a directory")
    rc, cap = _report(tmp_path, capsys, src)
    assert rc == 2 and "--out must be a folder, got the file" in cap.err


def test_out_in_a_folder_that_cannot_be_written_is_refused_before_reading(tmp_path, capsys):
    """Under a file (a folder that cannot be made, whoever runs it: root writes anywhere
    else), refused before any file is read: this one does not even exist."""
    a_file = tmp_path / "f"
    a_file.write_text("")
    rc = main(["report", str(tmp_path / "none.jsonl"), "--out", str(a_file / "new")])
    err = capsys.readouterr().err
    assert rc == 2 and "--out must be a folder that can be created and written" in err
    assert f"({a_file} is not a writable directory)" in err


def test_an_empty_out_is_refused_not_the_current_folder(tmp_path, capsys, monkeypatch):
    """'--out $DIR' with DIR unset: Path('') is '.', and the report went into the current
    folder."""
    monkeypatch.chdir(tmp_path)
    rc = main(["report", str(tmp_path / "none.jsonl"), "--out", ""])
    assert rc == 2 and "--out must be a folder path, got an empty string" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_report_into_an_earlier_reports_folder_leaves_none_of_it(sim_dir, tmp_path, capsys):
    """Four runs reported, then one into the same --out: the old findings.json and the plots
    of the runs no longer there are removed; a file of the user's stays."""
    a, _ = _telemetry(sim_dir, "quiet", 2, 4, 1, steps=100)
    b, _ = _telemetry(sim_dir, "locality", 1, 8, 1)
    out = tmp_path / "out"
    assert _report(tmp_path, capsys, a, b)[0] == 0
    before = {p.name for p in out.iterdir()}
    (out / "notes.txt").write_text("mine")
    assert main(["report", str(a), "--out", str(out), "--quiet"]) == 0
    after = {p.name for p in out.iterdir()}
    assert "findings.json" in before and "findings.json" not in after
    assert "notes.txt" in after and after - {"notes.txt"} < before
    page = (out / "report.html").read_text()
    assert after - {"notes.txt", "report.html"} == set(re.findall(r"data-file='([^']+)'", page))


def test_an_interrupted_report_leaves_the_earlier_one_whole(sim_dir, tmp_path, capsys,
                                                            monkeypatch):
    """Ctrl-C while plotting left 7 plots and no page, the earlier page already deleted: the
    report is now made in a folder of its own and moved in at the end."""
    import gpupace.report.cli as report_cli

    a, _ = _telemetry(sim_dir, "quiet", 2, 4, 1, steps=100)
    b, _ = _telemetry(sim_dir, "locality", 1, 8, 1)
    out = tmp_path / "out"
    assert _report(tmp_path, capsys, a, b)[0] == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    plot = report_cli.make_all

    def interrupted(*args, **kwargs):
        plot(*args, **kwargs)  # every plot written, then Ctrl-C
        raise KeyboardInterrupt

    monkeypatch.setattr(report_cli, "make_all", interrupted)
    assert main(["report", str(a), "--out", str(out), "--quiet", "--json"]) == 130
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # A folder of the user's named as one of the report's files: refused before anything of
    # the earlier report is removed (a move onto it failed half-way through)
    monkeypatch.setattr(report_cli, "make_all", plot)
    plot_name = sorted(n for n in before if n.endswith(".png"))[0]
    (out / plot_name).unlink()
    (out / plot_name).mkdir()
    rc, cap = _report(tmp_path, capsys, a)
    assert rc == 2 and f"holds folders named as the report's files ({plot_name})" in cap.err
    left = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert left == {k: v for k, v in before.items() if k != plot_name}
    assert not [p for p in out.iterdir() if p.name.startswith(".gpupace-report-")]


def test_without_out_the_text_alone_and_nothing_written(sim_dir, tmp_path, capsys,
                                                       monkeypatch):
    src, _ = _telemetry(sim_dir, "locality", 1, 8, 1)
    monkeypatch.chdir(tmp_path)
    assert main(["report", str(src), "--quiet"]) == 0
    cap = capsys.readouterr()
    assert "locality" in cap.out and "--out DIR writes the HTML report" in cap.out
    assert list(tmp_path.iterdir()) == []
    assert main(["report", str(src), "--json", "--quiet"]) == 2
    assert "give --out DIR with it" in capsys.readouterr().err


def test_truncated_and_corrupt_lines_give_a_partial_report(sim_dir, tmp_path, capsys):
    src, _ = _telemetry(sim_dir, "jitter", 2, 4, 1)
    lines = src.read_text().splitlines()
    damaged = tmp_path / "damaged.jsonl"
    body = lines[:100] + ["{not json at all"] + lines[100:200] + [lines[200][: len(lines[200]) // 2]]
    damaged.write_text("\n".join(body))  # the last line cut in the middle, as by a crash
    rc, cap = _report(tmp_path, capsys, damaged)
    assert rc == 0, cap.err
    doc = json.loads((tmp_path / "out" / "findings.json").read_text())
    summary = doc["runs"][0]["summary"]
    assert summary["skipped_lines"] == 2 and summary["steps"] == 199
    page = (tmp_path / "out" / "report.html").read_text()
    assert "2 lines skipped" in page and "line 101: JSONDecodeError" in page and "line 202" in page


def test_two_runs_joined_in_one_file_and_a_header_cut_short_are_said_so(sim_dir, tmp_path):
    """A second run's header in the middle of a file was one more "unreadable line" (ValueError:
    step record lacks fields); a file cut inside its header read as another tool's ("not a
    gpupace telemetry header (Unterminated string ...)")."""
    src, _ = _telemetry(sim_dir, "jitter", 2, 4, 1)
    lines = src.read_text().splitlines(keepends=True)
    joined = tmp_path / "joined.jsonl"
    joined.write_text("".join(lines[:41] + lines))
    run = load_runs([joined])[0]
    assert run.skipped == ["line 42: a second header (two runs in one file, joined by hand?): "
                           "its records are read as the first's"]
    assert any("40 records repeat the step number of an earlier one" in n for n in run.notes)
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "cut.jsonl").write_text(lines[0][:80])
    (folder / "whole.jsonl").write_text("".join(lines))
    (run,) = load_runs([folder])  # in a folder: passed over, saying why
    note = (f"passed over: {folder / 'cut.jsonl'} ends inside its header, cut short: its "
            "writer stopped as it opened the file (no step was written)")
    assert note in run.notes, run.notes
    with pytest.raises(ValueError, match="ends inside its header, cut short"):
        load_runs([folder / "cut.jsonl"])  # named: an error


# -- the CLI end to end -------------------------------------------------------------------


def test_cli_baseline_vs_paced_end_to_end(sim_dir, tmp_path, capsys):
    # A steady straggler: the policy paces it within a few dozen steps (random ones it
    # leaves alone, by design).
    base, _ = _telemetry(sim_dir, "locality", 1, 8, 5, "none", "baseline", steps=300)
    paced, _ = _telemetry(sim_dir, "locality", 1, 8, 5, "gpupace", "paced", steps=300)
    rc, cap = _report(tmp_path, capsys, base, paced)
    assert rc == 0, cap.err
    out = tmp_path / "out"
    assert "report.html" in cap.out and "findings.json" in cap.out
    doc = json.loads((out / "findings.json").read_text())
    # One entry per run; nothing at the top level stands for one run alone
    assert set(doc) >= {"runs", "comparisons", "lost_time_definition", "units"}
    assert not {"summary", "modes"} & set(doc)
    assert [r["summary"]["label"] for r in doc["runs"]] == ["baseline", "paced"]
    assert [r["label"] for r in doc["runs"]] == ["baseline", "paced"]
    for run in doc["runs"]:
        assert {m["mode"] for m in run["modes"]} == set(MODES)
        for m in run["modes"]:
            assert {"mode", "share", "confidence", "evidence", "ranks"} <= set(m)
    paced_sum = doc["runs"][1]["summary"]
    assert paced_sum["active_fraction"] > 0 and paced_sum["delay_mean"] > 0
    assert doc["runs"][0]["summary"]["active_fraction"] == 0
    amp = {r["summary"]["label"]: next(m for m in r["modes"] if m["mode"] ==
                                       "sync_amplification") for r in doc["runs"]}
    assert "pacing delayed ranks in" in amp["paced"]["action"]
    assert "pacing delayed" not in amp["baseline"]["action"]
    for run in doc["runs"]:  # pacing delays arrivals, not the natural lateness it measures
        assert run["modes"][0]["mode"] == "locality" and sorted(run["modes"][0]["ranks"]) == [6, 7]
    page = (out / "report.html").read_text()
    imgs = re.findall(r"<img src='data:image/png;base64,([A-Za-z0-9+/=]+)'", page)
    files = re.findall(r"data-file='([^']+)'", page)
    assert len(imgs) == len(files) >= 8  # lost time, step time, CDF, spread, 2 heatmaps, ...
    for name in files:
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert "Step-time CDF" in page
    # fractions of steps in %, as their change column's points
    assert "pacing armed (% of steps)" in page and "(fraction" not in page


@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_a_report_whose_reader_has_gone_still_writes_its_files(sim_dir, tmp_path, unbuffered):
    """`gpupace report ... | head -1`: the text's reader gone, the report failed before
    writing anything (status 2, "Broken pipe") or after, with "Exception ignored" (120)."""
    base, _ = _telemetry(sim_dir, "quiet", 1, 4, 1, steps=100)
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    cmd = [sys.executable, "-m", "gpupace", "report", str(base), "--out", str(tmp_path / "out"),
           "--json"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as p:
        p.stdout.close()  # before the first line: every write finds the pipe closed
        err = p.stderr.read().decode()
        rc = p.wait(timeout=100)
    assert rc == 0, err
    assert "Broken pipe" not in err and "Exception ignored" not in err, err
    assert json.loads((tmp_path / "out" / "findings.json").read_text())["runs"]
    assert (tmp_path / "out" / "report.html").is_file()


def test_paced_runs_compare_with_baselines_of_their_own_size(sim_dir):
    """Given in an order that pairs by position would get wrong (8 ranks' paced run against
    4 ranks' baseline), each paced run meets the baseline of its world size."""
    from gpupace.report.compare import pairs
    from gpupace.report.plots import cdf_title

    runs = load_runs([_telemetry(sim_dir, "quiet", n, 4, 1, policy, f"{policy}-{n}", steps=100)[0]
                      for n, policy in ((1, "none"), (2, "none"), (2, "gpupace"), (1, "gpupace"))])
    by_label = {r.label: i for i, r in enumerate(runs)}
    assert sorted(pairs(runs)) == sorted([(by_label["none-2"], by_label["gpupace-2"]),
                                          (by_label["none-1"], by_label["gpupace-1"])])
    lone = [r for r in runs if r.label != "none-1"]  # the 4-rank paced run has no baseline
    assert [(lone[i].label, lone[j].label) for i, j in pairs(lone)] == [("none-2", "gpupace-2")]
    # One baseline, two paced runs of its kind (`gpupace simulate`'s none, oracle, gpupace):
    # both meet it (the second was left uncompared without a word)
    three = [runs[by_label["none-2"]], runs[by_label["gpupace-2"]], runs[by_label["gpupace-2"]]]
    assert pairs(three) == [(0, 1), (0, 2)]
    # Two runs of different jobs given: compared all the same, the unpaced one the baseline
    # whatever the order, with a note that says they are different jobs
    from gpupace.report.diagnose import diagnose
    from gpupace.report.html import findings

    def compared(given):
        return findings(given, [diagnose(r) for r in given])["comparisons"]

    for two in ([by_label["none-2"], by_label["gpupace-1"]],
                [by_label["gpupace-1"], by_label["none-2"]]):
        given = [runs[i] for i in two]
        assert [(given[i].label, given[j].label) for i, j in pairs(given)] == \
            [("none-2", "gpupace-1")]
        assert cdf_title(given).endswith("gpupace-1 vs none-2")
        (comp,) = compared(given)
        assert "different jobs (8 and 4 ranks)" in " ".join(comp["notes"]), comp["notes"]
    (same,) = compared([runs[by_label["none-2"]], runs[by_label["gpupace-2"]]])
    assert not any("different jobs" in n for n in same["notes"])
    # `quiet`: nobody is delayed, and two simulated runs differ by pacing's cost alone (no
    # noise), the scenario's (it was said to be the baseline's run again)
    from gpupace.sim.scenario import GRAPH_SITE_US, GRAPH_STEP_US

    assert "pacing delayed nobody in the paced run: in the simulator that is the baseline's " \
        f"run plus pacing's cost ({GRAPH_SITE_US:g} us a paced collective, {GRAPH_STEP_US:g} us " \
        "a step), which is all its changes show" in same["notes"], same["notes"]
    free = dataclasses.replace(runs[by_label["gpupace-2"]])
    sim = free.header["sim"]
    free.header = {**free.header, "sim": {**sim, "scenario": {
        **sim["scenario"], "pacing_site_us": 0.0, "pacing_step_us": 0.0}}}
    (same,) = compared([runs[by_label["none-2"]], free])
    assert "pacing delayed nobody in the paced run: in the simulator that is the baseline's " \
        "run again" in same["notes"], same["notes"]
    # Of one size and kind, the headers of other jobs (a real job's run against the demo's
    # was compared as its paced run, without a word)
    other = dataclasses.replace(runs[by_label["gpupace-2"]])
    other.header = {**other.header, "scenario": "straggler", "source_detail": "demo"}
    (comp,) = compared([runs[by_label["none-2"]], other])
    assert "different jobs (source_detail None and 'demo'; scenario None and 'straggler'): " \
        "the changes compare them" in " ".join(comp["notes"]), comp["notes"]
    # Each paced run meets the baseline of its own job, whatever the order given
    demo_base = dataclasses.replace(runs[by_label["none-2"]], label="demo-base")
    demo_base.header = {**demo_base.header, "scenario": "straggler", "source_detail": "demo"}
    other.label = "demo-paced"
    four = [runs[by_label["none-2"]], demo_base, other, runs[by_label["gpupace-2"]]]
    assert sorted((four[i].label, four[j].label) for i, j in pairs(four)) == [
        ("demo-base", "demo-paced"), ("none-2", "gpupace-2")]
    # process_group_backend, which headers before 2026-11-30 lack, in one header alone
    later = dataclasses.replace(runs[by_label["gpupace-2"]])
    later.header = {**later.header, "process_group_backend": "gloo"}
    (comp,) = compared([runs[by_label["none-2"]], later])
    assert not any("different jobs" in n for n in comp["notes"]), comp["notes"]


def test_rank_files_of_one_run_are_read_once(sim_dir, tmp_path):
    src, _ = _telemetry(sim_dir, "locality", 1, 8, 1)
    lines = src.read_text().splitlines()
    header = json.loads(lines[0])
    paths = []
    for rank in (0, 1):
        p = tmp_path / f"rank{rank}.jsonl"
        p.write_text("\n".join([json.dumps(dict(header, rank=rank)), *lines[1:]]) + "\n")
        paths.append(p)
    runs = load_runs(paths)
    assert len(runs) == 1 and runs[0].other_files == [paths[1]]
    assert "2 rank files of one run" in " ".join(runs[0].notes)
    # Rank 0's file cut short (its writer stopped, or dropped records): rank 1's is read
    full = runs[0].steps
    paths[0].write_text("\n".join([json.dumps(dict(header, rank=0)), *lines[1:31]]) + "\n")
    (run,) = load_runs(paths)
    assert run.path == paths[1] and run.steps == full and "read rank 1's" in " ".join(run.notes)
    # Rank 0's file 3 records short, under 2% smaller: the file that reaches the last step
    paths[0].write_text("\n".join([json.dumps(dict(header, rank=0)), *lines[1:-3]]) + "\n")
    assert _size_ratio(paths) > 0.98
    (run,) = load_runs(paths)
    assert run.path == paths[1] and run.steps == full, run.notes
    assert "read rank 1's (rank1.jsonl, the one that runs longest)" in " ".join(run.notes), run.notes
    # The same file given twice is read once, not compared with itself
    (once,) = load_runs([paths[0], paths[0]])
    assert f"{paths[0]} was given 2 times" in " ".join(once.notes)


@pytest.mark.parametrize("with_run_id", [True, False])
def test_a_restarted_jobs_rank_files_are_two_runs_each_whole(sim_dir, tmp_path, capsys,
                                                            with_run_id):
    """A job restarted from a checkpoint on the same `{rank}` path: each rank's earlier file is
    kept aside as .1, and a shell lists run.0.jsonl run.0.jsonl.1 run.1.jsonl run.1.jsonl.1.
    The report made three runs of them, one pairing the old rank 0 with the new rank 1, and
    compared the two halves as a paced run against a baseline. Files written before the run id
    are told apart by their start times."""
    src, _ = _telemetry(sim_dir, "locality", 1, 4, 1, policy="gpupace")
    lines = src.read_text().splitlines()
    header = {k: v for k, v in json.loads(lines[0]).items() if k != "sim"}
    header["source"] = "pacer"  # a simulated run has no warm-up
    records = [json.loads(line) for line in lines[1:]]
    cfg = {**header["config"], "warmup_steps": 5}
    old = {**header, "started": "2026-12-01T10:00:00+0000", "config": cfg}
    new = {**header, "started": "2026-12-01T10:30:00+0000", "config": cfg,
           "resumed_at_step": 100, "first_measured_step": 105}
    if with_run_id:
        old["run_id"], new["run_id"] = "a1", "b2"
    paths = []
    for rank in (0, 1):
        for head, first, name in ((new, 100, f"run.{rank}.jsonl"),
                                  (old, 0, f"run.{rank}.jsonl.1")):
            body = [json.dumps({**r, "step": first + k}) for k, r in enumerate(records[:160])]
            path = tmp_path / name
            path.write_text("\n".join([json.dumps({**head, "rank": rank}), *body]) + "\n")
            paths.append(path)
    runs = load_runs(paths)
    assert [(r.path.name, [p.name for p in r.other_files]) for r in runs] == [
        ("run.0.jsonl", ["run.1.jsonl"]), ("run.0.jsonl.1", ["run.1.jsonl.1"])]
    assert [int(r.step[0]) for r in runs] == [100, 0]
    (comp,) = findings(runs, [diagnose(r) for r in runs])["comparisons"]
    assert "one job before and after its restart from a checkpoint at step 100" in \
        " ".join(comp["notes"]), comp["notes"]
    assert diagnose(runs[0]).summary["warmup_steps_left_out"] == 5  # not step 105
    assert diagnose(runs[1]).summary["warmup_steps_left_out"] == 5
    # Two tries from one checkpoint (restarted, died, restarted again): not paced vs baseline
    again = tmp_path / "again.jsonl"
    again.write_text(paths[0].read_text().replace("10:30:00", "11:00:00"))
    (tries,) = findings(load_runs([paths[0], again]),
                        [diagnose(r) for r in load_runs([paths[0], again])])["comparisons"]
    assert "two tries of one job from its checkpoint at step 100" in " ".join(tries["notes"])
    assert not any("stands in for a baseline" in n for n in tries["notes"]), tries["notes"]
    again.unlink()
    # The folder stands for its *.jsonl files: the earlier run is named as left out
    (alone,) = load_runs([tmp_path])
    assert "left out: run.0.jsonl.1, run.1.jsonl.1, earlier runs kept aside" in \
        " ".join(alone.notes), alone.notes


def test_two_paced_runs_compared_say_neither_is_a_baseline(sim_dir):
    """`gpupace report runs/paced-1.jsonl runs/paced-2.jsonl` compared paced-2 against paced-1
    as against a baseline, and where paced-2 delayed nobody said both ran the same code."""
    runs = load_runs([_telemetry(sim_dir, "locality", 1, 4, seed, policy="gpupace")[0]
                      for seed in (1, 2)])
    (comp,) = findings(runs, [diagnose(r) for r in runs])["comparisons"]
    assert f"both runs paced: {runs[0].label} stands in for a baseline" in \
        " ".join(comp["notes"]), comp["notes"]
    assert not any("same code" in n or "baseline's run again" in n for n in comp["notes"])


def _size_ratio(paths) -> float:
    return paths[0].stat().st_size / paths[1].stat().st_size


def test_plots_draw_labels_as_text_flat_series_plainly_and_say_an_undiagnosed_run(
        sim_dir, tmp_path, capsys):
    """A label with $ signs (an unexpanded shell variable) is text: matplotlib's math parser
    failed on it, and the whole report with it. A flat series (a noiseless simulation) read
    1e-10 + 9.8878e1 on its axis, steps of 1e-11 ms drawn as jumps. A run too short to
    diagnose drew an empty bar in the lost-time plot, which reads as nothing lost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpupace.report.plots import _ylim

    src, _ = _telemetry(sim_dir, "locality", 1, 4, 1)
    lines = src.read_text().splitlines()
    labelled = tmp_path / "dollar.jsonl"
    labelled.write_text("\n".join([json.dumps({**json.loads(lines[0]), "label": "run_$EXP_$SEED"}),
                                   *lines[1:]]) + "\n")
    short = tmp_path / "short.jsonl"
    short.write_text("\n".join(lines[:11]) + "\n")
    assert main(["report", str(labelled), str(short), "--out", str(tmp_path / "out")]) == 0, \
        capsys.readouterr().err
    assert (tmp_path / "out" / "lost_time.png").is_file()
    fig, ax = plt.subplots()
    flat = np.full(50, 98.556111111111) + np.arange(50) * 1e-13
    ax.plot(flat)
    _ylim(ax, [flat], [flat])
    lo, hi = ax.get_ylim()
    assert hi - lo > 1.0 and lo < 98.5 < hi, (lo, hi)
    plt.close(fig)


def test_large_files_report_progress(sim_dir, monkeypatch):
    import gpupace.report.load as load

    path, _ = _telemetry(sim_dir, "jitter", 2, 4, 1)
    monkeypatch.setattr(load, "PROGRESS_BYTES", 0)  # every file counts as large
    said: list[str] = []
    runs = load.load_runs([path], progress=said.append)
    assert runs[0].steps == STEPS and runs[0].mode == "observe"  # simulated, policy none
    assert said[0].startswith(f"reading {path.name}") and f"{STEPS} steps" in said[-1]


def test_spread_growing_with_world_size_across_runs(sim_dir, tmp_path, capsys):
    small, _ = _telemetry(sim_dir, "amplification", 1, 4, 1, label="4 ranks", steps=200)
    large, _ = _telemetry(sim_dir, "amplification", 4, 4, 1, label="16 ranks", steps=200)
    rc, cap = _report(tmp_path, capsys, large, small)
    assert rc == 0, cap.err
    doc = json.loads((tmp_path / "out" / "findings.json").read_text())
    rows = doc["scaling"]["rows"]
    assert [r["world_size"] for r in rows] == [4, 16]
    assert rows[1]["spread_p50_us"] > rows[0]["spread_p50_us"]
    assert doc["scaling"]["spread_grows_with_world_size"] is True
    assert "Across world sizes" in (tmp_path / "out" / "report.html").read_text()
    # Runs of other jobs (another preset here; the demo beside a real job): no trend read
    other, _ = _telemetry(sim_dir, "quiet", 2, 4, 1, label="8 ranks, quiet", steps=200)
    rc, cap = _report(tmp_path, capsys, large, small, other)
    scale = json.loads((tmp_path / "out" / "findings.json").read_text())["scaling"]
    assert rc == 0 and scale["spread_grows_with_world_size"] is None
    assert len(scale["rows"]) == 3 and scale["note"].startswith("runs of different jobs")
    assert "Runs of different jobs: their spreads are listed" in \
        (tmp_path / "out" / "report.html").read_text()


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_one_rank_and_all_nan_runs_report_without_warnings(tmp_path, capsys):
    from gpupace.telemetry import make_header

    def write(name, recs, world):
        p = tmp_path / name
        lines = [json.dumps(make_header(source="pacer", world_size=world, label=name))]
        p.write_text("\n".join(lines + [r.to_json() for r in recs]) + "\n")
        return p

    nan = float("nan")
    one = write("one.jsonl", [
        StepRecord(step=k, time_s=0.1 * k, step_time_us=1e5 + (k % 7) * 100, spread_us=0.0,
                   residual_us=0.0, transfer_us=500.0, straggler=0, active=False,
                   earliness_us=[0.0], wait_us=[500.0], delay_us=[0.0], site_spread_us=[0.0])
        for k in range(60)], 1)
    blank = write("nan.jsonl", [
        StepRecord(step=k, time_s=0.1 * k, step_time_us=nan, spread_us=nan, residual_us=nan,
                   transfer_us=nan, straggler=-1, active=False, earliness_us=[nan, nan],
                   wait_us=[nan, nan], delay_us=[0.0, 0.0]) for k in range(5)], 2)
    rc, cap = _report(tmp_path, capsys, one, blank)
    assert rc == 0, cap.err
    doc = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert ("only 0 measured steps (need 30): not enough evidence (of 5 steps read, 0 were "
            "warm-up (steps before 0) and 5 more had no step time above 0)"
            in doc["runs"][1]["summary"]["note"])
    assert all(m["verdict"] == "not enough evidence" for r in doc["runs"] for m in r["modes"])
    has_lost = [r["summary"].get("lost_fraction") is not None for r in doc["runs"]]
    # the lost time's definition is printed where a run has that figure, not for none
    assert ("lost time: " in cap.out) == any(has_lost), (has_lost, cap.out)
    rc, cap = _report(tmp_path, capsys, blank)
    assert rc == 0 and "lost time: " not in cap.out, cap.out


def test_signatures_follow_the_physics(sim_dir, tmp_path):
    from gpupace.report.diagnose import coupling_index

    # The coupling index sees waiting ranks slowed down: only where the simulator couples.
    idx = {}
    for c in (0.0, 0.2):
        res = simulate(presets.amplification(2, 4, coupling=c), steps=200, seed=1)
        idx[c] = coupling_index(load_runs([write_telemetry(res, tmp_path / f"c{c}.jsonl")])[0])
    assert idx[0.0] < 0.05 < 0.3 < idx[0.2], idx
    # Regime switching is found in the jitter preset's transfers, not in the fabric's.
    ev = {}
    for mode in ("runtime_jitter", "fabric_contention"):
        path, _ = _telemetry(sim_dir, *SINGLE[mode])
        d = diagnose(load_runs([path])[0])
        ev[mode] = next(m.evidence for m in d.modes if m.mode == "runtime_jitter")
    assert ev["runtime_jitter"]["regime_switching"] is True
    assert ev["fabric_contention"]["regime_switching"] is False


@pytest.mark.parametrize("seed", [0, 1])
def test_regimes_blurred_by_fabric_contention_are_found_step_by_step(tmp_path, seed):
    """On `paper` the switch load drifts the transfer time all along: a split into two levels
    found no regimes there and filed their 1.0-1.6 ms a step under fabric contention. The
    jumps find each regime step the simulator drew, and the runtime_jitter share they carry
    outweighs fabric contention's (whose own cost, switched off, is 0.7 ms a step)."""
    from gpupace.report.diagnose import _regimes

    res = simulate(presets.paper(2), steps=600, seed=seed, keep_sites=True)
    run = load_runs([write_telemetry(res, tmp_path / "paper.jsonl")])[0]
    found, hi, info = _regimes(run.transfer)
    truth = res.regime.astype(bool)
    assert found and truth.any()
    # a regime of one step is taken for a spike: at most those are missed
    assert (hi & ~truth).sum() == 0 and (truth & ~hi).sum() <= 0.05 * truth.sum(), info
    share = {m.mode: m.share for m in diagnose(run).modes}
    assert share["runtime_jitter"] > share["fabric_contention"], share


def _no_regime_series() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    flat = np.full(2000, 1000.0)
    dips = flat.copy()
    dips[[1200, 1600]] = 400.0  # each return to the level is no jump up
    spike = flat.copy()
    spike[500:502] = [1800.0, 1300.0]  # back below halfway after one step
    shift = flat.copy()
    shift[1200:] *= 2.0  # never comes back: a shift of level
    shift[300:310] *= 3.0
    two_step = flat.copy()
    for a in range(20, 2000, 50):
        two_step[a:a + 2] = 3000.0  # 40 spikes of two steps
    shocks = np.zeros(3000)  # a switch's load, AR(1) with heavy-tailed shocks that decay
    e = rng.standard_t(3, 3000)
    for i in range(1, 3000):
        shocks[i] = 0.95 * shocks[i - 1] + np.sqrt(1 - 0.95 ** 2) * e[i] / np.sqrt(3)
    return {"dips": dips, "spike": spike, "shift": shift, "two-step spikes": two_step,
            "decaying shocks": 200 + 800 * (1 + 0.5 * np.exp(shocks - 0.5)),
            "heavy tail": 1000 * np.exp(0.05 * rng.standard_t(1.5, 2000)),
            "pareto spikes": 1000 + 50 * rng.pareto(1.5, 2000),
            "drift": 1000 * np.exp(0.5 * np.sin(np.arange(2000) / 100)),
            "flip": 1000 * np.where(np.arange(2000) % 2, 1.0, 2.0)}


@pytest.mark.parametrize("name", list(_no_regime_series()))
def test_no_regimes_are_found_in_spikes_dips_drift_or_a_shift(name):
    from gpupace.report.diagnose import _regimes

    found, hi, info = _regimes(_no_regime_series()[name])
    assert not found and not hi.any(), info  # a review found regimes in each of these


def test_regimes_after_a_shift_of_level_are_found():
    from gpupace.report.diagnose import _regimes

    x = np.full(2000, 1000.0)
    truth = np.zeros(2000, dtype=bool)
    for a in range(100, 1900, 95):  # 19 regimes of 10 steps at 3x
        x[a:a + 10] *= 3.0
        truth[a:a + 10] = True
    x[50:] *= 2.0  # the level doubles for good before them (the search stopped there)
    found, hi, info = _regimes(x)
    assert found and info["switches"] == 19
    np.testing.assert_array_equal(hi, truth)
    np.testing.assert_allclose(info["step_ratio"][truth], 3.0)


def test_regimes_keep_their_steps_across_a_gap_and_at_the_end():
    from gpupace.report.diagnose import _regimes

    x = np.full(400, 1000.0)
    for a in (50, 120, 200, 280):
        x[a:a + 10] = 3000.0
    x[125] = np.nan  # unknown: the last known value carries
    x[392:] = 3000.0  # the run ends in a regime
    found, hi, info = _regimes(x)
    want = np.isfinite(x) & (x > 2000) | (np.arange(400) == 125)
    assert found and info["switches"] == 5 and info["level_ratio"] == pytest.approx(3.0)
    np.testing.assert_array_equal(hi, want)


def test_lateness_is_behind_the_median_rank_or_the_earliest_of_two():
    """One rule for the locality offsets, the steps that paid them and the heatmap: behind the
    median rank, behind the earliest at 2 ranks (the median would halve the offset); a NaN
    earliness is left out of the reference, not spread over its step."""
    from gpupace.report.ranks import lateness

    e = np.array([[900.0, 500.0, 0.0], [800.0, 400.0, 100.0]])
    np.testing.assert_array_equal(lateness(e), [[-400.0, 0.0, 500.0], [-400.0, 0.0, 300.0]])
    np.testing.assert_array_equal(lateness(e[:, 1:]), [[0.0, 500.0], [0.0, 300.0]])
    e[1, 0] = np.nan
    np.testing.assert_array_equal(lateness(e)[1], [np.nan, -150.0, 150.0])
    np.testing.assert_array_equal(lateness(e)[0], [-400.0, 0.0, 500.0])


def test_a_regime_after_a_fading_shock_is_measured_from_the_level_and_a_fading_end_is_none():
    from gpupace.report.diagnose import _regimes

    x = np.full(600, 1000.0)
    for a in (100, 200, 300):
        x[a:a + 10] = 3000.0
    x[400:408] = [4000, 3000, 2300, 1800, 1600, 1600, 1600, 1600]  # a shock that fades
    x[412:422] = 3000.0  # a regime right after it: 3x the level, not the shock's tail
    found, hi, info = _regimes(x)
    assert found and not hi[400:412].any()
    np.testing.assert_allclose(info["step_ratio"][412:422], 3.0)
    x[412:422] = 1000.0
    x[590:] = np.geomspace(4000, 2100, 10)  # a shock the run ends in: not a regime
    found, hi, info = _regimes(x)
    assert found and info["switches"] == 3 and not hi[590:].any()


def test_groups_of_one_job_are_told_from_two_jobs_by_settings_and_start():
    """One job's pacers on two data-parallel groups share their settings but for a telemetry
    path or label of each group's own, and start together; two tries of the same settings a day
    apart are two jobs (compared, with a note)."""
    from gpupace.report.load import groups_of_one_job

    def head(group, path="runs/run.jsonl", label="", started="2026-12-01T10:00:00+0000",
             mode="pace"):
        return {"source": "pacer", "world_size": 2, "label": label, "group_ranks": group,
                "started": started, "config": {"mode": mode, "telemetry_path": path}}

    a = head([0, 1])
    assert groups_of_one_job(a, head([2, 3]))
    assert groups_of_one_job(a, head([2, 3], path="runs/dp1.jsonl", label="dp1"))
    assert groups_of_one_job(a, head([2, 3], started="2026-12-01T10:01:00+0000"))
    assert not groups_of_one_job(a, head([2, 3], started="2026-12-02T10:00:00+0000"))
    assert not groups_of_one_job(a, head([2, 3], mode="observe"))  # a baseline: another job
    assert not groups_of_one_job(a, head([0, 1]))  # the same group: rank files, or a rerun
    assert groups_of_one_job(a, head([2, 3], started="unknown"))  # no start to tell by


def test_a_subgroup_note_lets_every_rank_named_be_found_as_a_global_rank():
    """A review found "global ranks [1, 3, 5, 7] ... 127": no way back from group rank 13 to
    its global rank, nor at all for an unevenly spaced group."""
    from gpupace.report.load import group_note

    assert group_note(list(range(1, 128, 2))).endswith(
        "its ranks 0-63, global rank 1 + 2 x the rank named (1-127)")
    uneven = [0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21]
    assert group_note(uneven).endswith(f"its ranks 0-11, global ranks {uneven}, in that order")
    assert group_note([2, 3]).endswith("its ranks 0-1, global ranks [2, 3], in that order")


def _ranks_that_may_die(rank, world, out, kill_at, disagree_from):
    """Two ranks, 40 steps; rank 1 SIGKILLs itself before step `kill_at`'s collective, or
    paces one more site than rank 0 from step `disagree_from` on."""
    import signal
    import time

    import torch

    from gpupace import PaceConfig, Pacer

    pacer = Pacer(PaceConfig(mode="observe", warmup_steps=0,
                             telemetry_path=f"{out}/run.{{rank}}.jsonl"))
    t = torch.ones(64)
    for k in range(40):
        time.sleep(0.001)
        if k == kill_at and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        pacer.all_reduce(t)
        if k >= disagree_from and rank == 1:
            with pacer.site("local"):
                pass
        pacer.step()
    pacer.close()


def test_a_run_cut_short_by_a_dead_rank_is_named_in_the_report(tmp_path, capsys):
    """A rank killed at step 25: the files end there as a finished run's would, and the
    report read them as one. Each file of a closed run ends with an end line; the dead
    rank's has none, the survivor's says it ended on an error, and the report says both,
    beside its figures and in a comparison."""
    from gpupace.launch import run_ranks

    run_ranks(_ranks_that_may_die, 2, str(tmp_path / "ok"), -1, 99, timeout_s=100)
    with pytest.raises(RuntimeError):
        run_ranks(_ranks_that_may_die, 2, str(tmp_path / "dead"), 25, 99,
                  collective_timeout_s=10, timeout_s=100)
    ok = (tmp_path / "ok" / "run.1.jsonl").read_text().splitlines()
    assert json.loads(ok[-1]) == {"gpupace": "end", "steps": 40, "how": "closed",
                                  "records": 40, "dropped": 0}
    assert json.loads(ok[0])["end_mark"] is True
    assert '"gpupace": "end"' not in (tmp_path / "dead" / "run.1.jsonl").read_text()
    runs = load_runs([tmp_path / "dead", tmp_path / "ok"])
    dead, fine = runs
    assert dead.steps == 25 and fine.steps == 40 and not fine.unfinished
    # (after step 24, or a little before: the killed rank's writer loses what it had queued)
    assert any(re.match(r"no end mark in run\.1\.jsonl \(after step 2[0-4]\): those ranks' "
                        "writers stopped there", n) for n in dead.notes), dead.notes
    assert any(re.match(r"run\.0\.jsonl: the run ended on an error \(\w+\) after 25 steps", n)
               for n in dead.notes), dead.notes
    assert not any("end mark" in n or "error" in n or "no record" in n for n in fine.notes)
    rc, out = _report(tmp_path, capsys, tmp_path / "ok", tmp_path / "dead", json_=False)
    assert rc == 0 and re.search(r"\(run\.0 \(dead\) did not finish \(it ended on an error, "
                                 r"\w+\): its figures cover the steps it ran\)", out.out), out.out


def test_steps_the_ranks_disagreed_on_are_counted_as_unrecorded(tmp_path):
    """From step 30 on the ranks pace different numbers of sites: those steps record nothing
    (each rank warns once), and the file ended at step 29 as if the run had."""
    from gpupace.launch import run_ranks

    run_ranks(_ranks_that_may_die, 2, str(tmp_path), -1, 30, timeout_s=100)
    (run,) = load_runs([tmp_path])
    assert run.steps == 30 and not run.unfinished
    assert "run.0.jsonl: 10 steps have no record, the last 10 of them (the run went on to " \
           "step 39): steps with no paced collective, or that the ranks disagreed on" in \
           " ".join(run.notes), run.notes


def _steps_on(rank, world, out):
    from gpupace import PaceConfig, Pacer

    with Pacer(PaceConfig(mode="observe", telemetry_path=f"{out}/run.{{rank}}.jsonl")) as pacer:
        for _ in range(35):
            with pacer.site("x"):
                pass
            pacer.step()


def test_a_restart_on_fewer_ranks_leaves_the_earlier_runs_last_files_out(tmp_path):
    """Three ranks wrote run.0-2.jsonl; a restart on two kept run.0 and run.1 aside (.1) and
    left run.2.jsonl, which the report read as a run of its own and compared with the
    restart as if current."""
    from gpupace.launch import run_ranks

    run_ranks(_steps_on, 3, str(tmp_path), timeout_s=100)
    run_ranks(_steps_on, 2, str(tmp_path), timeout_s=100)  # each rank warns it kept one
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "run.0.jsonl", "run.0.jsonl.1", "run.1.jsonl", "run.1.jsonl.1", "run.2.jsonl"]
    (run,) = load_runs([tmp_path])
    assert run.world_size == 2
    assert any(n.startswith("left out: run.0.jsonl.1, run.1.jsonl.1, run.2.jsonl, earlier runs "
                            "kept aside") for n in run.notes), run.notes
    (earlier,) = load_runs([tmp_path / "run.2.jsonl"])  # named, it is read
    assert earlier.world_size == 3


def test_records_the_writer_dropped_at_the_end_are_its_not_the_ranks(tmp_path, monkeypatch):
    """The writer fell behind for the last 20 steps and dropped them: counted in the end line
    alone, they were blamed on the ranks ("steps ... that the ranks disagreed on")."""
    from gpupace import PaceConfig, Pacer, telemetry

    pacer = Pacer(PaceConfig(mode="observe", warmup_steps=0,
                             telemetry_path=str(tmp_path / "run.jsonl")))
    for k in range(60):
        if k == 40:
            monkeypatch.setattr(telemetry, "BACKLOG_LIMIT_MB", -1)  # every record past it
        with pacer.site("x"):
            pass
        pacer.step()
    with pytest.warns(RuntimeWarning, match="dropped the last 20 records"):
        pacer.close()
    (run,) = load_runs([tmp_path / "run.jsonl"])
    assert run.steps == 40
    assert "run.jsonl: the writer dropped its last 20 records, falling behind the steps" in \
        run.notes, run.notes
    assert not any("no record" in n for n in run.notes), run.notes


def test_a_change_from_a_figure_at_zero_or_rounding_off_it_is_none_and_cvs_print_alike():
    """A preset of constant step times has a CV of float rounding (1e-16): "step time CV
    0.000 -> 0.000 (-12.8%)" was printed; and findings rounded to 4 decimals made the
    terminal's CV 0.677 (from 0.6775) where the page said 0.678 (from 0.67752)."""
    from gpupace.report.compare import change
    from gpupace.report.diagnose import _clean

    assert change("step_time_cv", 1.1e-16, 9.6e-17) is None
    assert change("step_time_cv", 0.0, 0.2) is None
    assert change("step_time_cv", 0.2, 0.3) == pytest.approx(50.0)
    assert change("throughput", 2000.0, 2100.0) == pytest.approx(5.0)
    assert f"{_clean(0.67752):.3f}" == f"{0.67752:.3f}" == "0.678"


@pytest.mark.parametrize("batch", ["lots", float("inf"), -1])
def test_a_header_with_no_world_size_or_batch_size_is_noted(sim_dir, tmp_path, batch):
    """A world_size of 0, a samples_per_step of words: read without a word. (A world_size
    that is not a whole number >= 0 is refused with the header.)"""
    src, _ = _telemetry(sim_dir, "quiet", 2, 4, 1, steps=100)
    lines = src.read_text().splitlines()
    size = 0
    header = dict(json.loads(lines[0]), world_size=size, samples_per_step=batch)
    del header["sim"]["scenario"]["samples_per_rank"]  # as a pacer's file: no other batch
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([json.dumps(header), *lines[1:]]))
    (run,) = load_runs([bad])
    assert run.world_size == 8 and run.samples_per_step is None
    assert any(f"world_size {size!r} is no number of ranks: the records' 8 are counted" in n
               for n in run.notes), run.notes
    assert any(f"samples_per_step {batch!r} is no batch size: throughput is counted in steps/s"
               in n for n in run.notes), run.notes
