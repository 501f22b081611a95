"""Smoke tests of the benchmark harness and `python -m bench`: quantiles, the result schema and
files, a tiny CPU run through `main(argv)` into a temporary folder, and the GPU suite skipping
cleanly without CUDA. Timing figures are never asserted: the CI machine is shared."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.__main__ import gpu_missing, main
from bench.harness import (
    SCHEMA,
    Check,
    Harness,
    Machine,
    interleave,
    median_ci,
    quantiles,
    time_calls,
)

ROOT = Path(__file__).resolve().parents[1]


def test_quantiles_of_known_samples():
    q = quantiles(np.arange(1, 101, dtype=float))
    assert q["n"] == 100
    assert q["p50"] == pytest.approx(50.5)
    assert q["p20"] == pytest.approx(np.percentile(np.arange(1, 101), 20))
    assert q["p20"] < q["p50"] < q["p80"] < q["p99"] <= 100
    assert q["mean"] == pytest.approx(50.5)


def test_quantiles_drop_non_finite_and_handle_empty():
    assert quantiles([1.0, math.nan, math.inf, 3.0])["n"] == 2
    empty = quantiles([])
    assert empty["n"] == 0 and math.isnan(empty["p50"])


def test_interleave_rotates_order_and_times_every_repeat():
    order: list[str] = []
    fns = {k: (lambda k=k: order.append(k)) for k in "abc"}
    out = interleave(fns, warmup=1, repeats=4)
    assert {k: v.shape for k, v in out.items()} == {k: (4,) for k in "abc"}
    assert all((v >= 0).all() for v in out.values())
    rounds = [order[i : i + 3] for i in range(0, len(order), 3)]
    assert len(rounds) == 5 and {r[0] for r in rounds} == {"a", "b", "c"}
    assert time_calls(lambda: None, warmup=0, repeats=3).shape == (3,)


def test_interleave_runs_a_variants_preparation_before_the_barrier():
    """The barrier comes last before each timed call, so that every timed collective starts
    with the ranks aligned: a preparation after it (a pacer's step(), uneven across ranks)
    made one rank wait inside the timed call, and an A/A pair read 1.02-1.05x."""
    order: list[str] = []
    interleave({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, warmup=0,
               repeats=2, before=lambda: order.append("|"),
               prepare={"a": lambda: order.append("prep a")})
    assert order == ["prep a", "|", "a", "|", "b", "|", "b", "prep a", "|", "a"]


def test_median_interval_brackets_the_median_and_narrows_with_samples():
    rng = np.random.default_rng(3)
    few, many = rng.normal(1.0, 0.1, 50), rng.normal(1.0, 0.1, 5000)
    lo, hi = median_ci(few)
    assert lo < np.median(few) < hi
    lo2, hi2 = median_ci(many)
    assert lo2 < np.median(many) < hi2 and hi2 - lo2 < 0.3 * (hi - lo)
    assert all(math.isnan(v) for v in median_ci([1.0]))


def test_a_partial_run_names_its_files_and_rows_so(tmp_path, capsys):
    """`--only` and `--quick` runs get files of their own (an --only run of the day wrote over
    the full suite's files) and say so in every row, the JSON and the page."""
    h = Harness("cpu", quick=True, out_dir=tmp_path, machine=Machine.probe(""), only=("policy",))
    assert h.stem.startswith("cpu-quick-only-policy_")
    assert h.record("demo", "x", [1.0, 2.0])["suite"] == "cpu-quick-only-policy"
    h.write()
    doc = json.loads((tmp_path / f"{h.stem}.json").read_text())
    assert doc["only"] == ["policy"] and doc["quick"] is True
    assert Harness("cpu", machine=h.machine).stem.startswith("cpu_")
    # names are checked against the suites asked for, before any runs
    with pytest.raises(SystemExit) as e:
        main(["--suite", "cpu", "--only", "spin", "--out", str(tmp_path)])
    assert e.value.code == 2 and "unknown benchmark(s) ['spin'] for --suite cpu" in \
        capsys.readouterr().err


def test_machine_names_the_hardware_and_versions():
    m = Machine.probe("a note")
    assert m.cpu and m.cores >= 1 and m.date.endswith("Z")
    assert "torch" in m.versions and "numpy" in m.versions
    slug = m.slug("cpu")
    assert slug.endswith(f"-{m.cores}c") and " " not in slug


def test_harness_writes_schema_rows_and_files(tmp_path):
    h = Harness("cpu", quick=True, out_dir=tmp_path, machine=Machine.probe("shared VM"))
    h.record("demo", {"size": "4KB", "variant": "plain"}, [1.0, 2.0, 3.0, 4.0])
    h.record("demo", "ratio", [1.0, 1.1], metric="ratio", unit="x")
    assert h.check("demo under 2", 1.5, 2.0, "us").met
    assert not h.check("demo nan", math.nan, 2.0, "us").met
    # An interval that holds the limit: the point estimate's side, and not settled
    edge = h.check("demo ratio", 1.099, 1.10, "x", interval=(1.02, 1.15))
    assert edge.met and not edge.settled and edge.verdict == "AT THE EDGE (median met)"
    assert Check("x", 1.12, 1.10, "x", interval=(1.05, 1.2)).verdict == "AT THE EDGE (median missed)"
    assert h.check("demo ratio 2", 1.05, 1.10, "x", interval=(1.02, 1.09)).verdict == "MET"
    h.skip("other", "needs something")
    h.plot("demo", lambda fig: fig.add_subplot(1, 1, 1).plot([1, 2], [3, 4]))
    paths = h.write()
    names = {p.name for p in paths}
    assert names == {f"{h.stem}{s}" for s in (".csv", ".json", ".md", "_demo.png")}
    assert h.stem.startswith("cpu-quick_") and h.stem[-8:].isdigit()

    rows = list(csv.DictReader(open(tmp_path / f"{h.stem}.csv", encoding="utf-8")))
    assert len(rows) == 2 and tuple(rows[0]) == SCHEMA
    assert rows[0]["case"] == "size=4KB variant=plain" and rows[0]["note"] == "shared VM"
    assert float(rows[0]["p50"]) == pytest.approx(2.5)
    doc = json.loads((tmp_path / f"{h.stem}.json").read_text())
    assert [(c["met"], c["settled"]) for c in doc["checks"]] == [
        (True, True), (False, True), (True, False), (True, True)]
    assert all(tuple(r) == SCHEMA for r in doc["rows"])
    assert doc["machine"]["cpu"] == rows[0]["cpu"]
    md = (tmp_path / f"{h.stem}.md").read_text()
    assert "## Targets" in md and "needs something" in md and "| size=4KB variant=plain |" in md
    assert "| yes, at the edge |" in md


@pytest.mark.timeout(180)
def test_quick_cpu_suite_through_main(tmp_path):
    from gpupace.kernels.clock import interpreting

    env, interpreted = os.environ.get("TRITON_INTERPRET"), interpreting()
    rc = main(["--suite", "cpu", "--quick", "--out", str(tmp_path), "--note", "test"])
    assert rc == 0
    # host_path builds its engine under the interpreter's flag, and puts it back
    assert (os.environ.get("TRITON_INTERPRET"), interpreting()) == (env, interpreted)
    (doc_path,) = tmp_path.glob("cpu-quick_*.json")
    doc = json.loads(doc_path.read_text())
    benches = {r["bench"] for r in doc["rows"]}
    assert {"gloo_all_reduce", "gloo_all_reduce_ratio", "policy_update", "telemetry",
            "host_path"} <= benches
    assert not doc["skips"], doc["skips"]
    assert any(c["name"].startswith("policy update") for c in doc["checks"])
    assert all(r["n"] > 0 and r["note"] == "test" for r in doc["rows"])
    assert len(list(tmp_path.glob("*.png"))) >= 2


def test_host_path_without_triton_is_a_skip_with_its_install_line(tmp_path, monkeypatch,
                                                                    capsys):
    """`pip install -e .` has no triton: the CPU suite exited 1 on host_path's import error."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    assert main(["--suite", "cpu", "--quick", "--only", "host_path", "--out", str(tmp_path)]) == 0
    assert "SKIP host_path: needs triton" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_host_path_leaves_the_kernels_compiled_ones_for_a_gpu_suite_after_it(tmp_path):
    """host_path builds a device engine under the interpreter's flag; `--suite all` then runs
    the GPU suite in the same process, whose kernels must not be interpreted ones (they were:
    the engine imported the kernel modules first, under the flag)."""
    script = (
        "import sys, triton\n"
        "from bench.__main__ import main\n"
        f"argv = ['--suite', 'cpu', '--quick', '--only', 'host_path', '--out', {str(tmp_path)!r}]\n"
        "assert main(argv) == 0\n"
        "from gpupace.kernels import clock, stamp\n"
        "from triton.runtime.jit import JITFunction\n"
        "assert not clock.interpreting()\n"
        "assert isinstance(stamp._exit_kernel, JITFunction), type(stamp._exit_kernel)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).parent.parent,
                         env=env, capture_output=True, text=True, timeout=110)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.skipif(gpu_missing() is None, reason="CUDA is present: the skip path cannot run")
def test_gpu_suite_skips_cleanly_without_cuda(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "bench", "--suite", "gpu", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "SKIP" in proc.stderr and "CUDA" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # no GPU figure is ever written without a GPU


def test_an_out_that_cannot_be_written_is_refused_before_any_benchmark(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("")
    with pytest.raises(SystemExit) as e:
        main(["--suite", "cpu", "--quick", "--out", str(a_file / "x")])
    assert e.value.code == 2
    assert "--out must be a folder that can be created and written" in capsys.readouterr().err


def test_gpu_benchmarks_import_and_each_skip_with_a_reason(tmp_path):
    from bench.__main__ import gpu_benchmarks

    benches = gpu_benchmarks()
    assert {"stamp", "spin", "update", "site", "nccl", "vcluster"} <= set(benches)
    if gpu_missing() is not None:
        h = Harness("gpu", out_dir=tmp_path, machine=Machine.probe())
        for fn in benches.values():
            fn(h)
        assert not h.rows and not h.plots and not h.checks  # nothing measured, nothing made up
        assert [s["bench"] for s in h.skips] == list(benches)
        assert all(s["reason"] for s in h.skips)
        assert list(tmp_path.iterdir()) == []


def test_missing_names_what_is_missing():
    from bench.gpu_common import missing

    assert missing("numpy", "gpupace.pacer:Pacer.all_reduce") is None
    assert "no_such_module_xyz" in missing("no_such_module_xyz")
    assert "Pacer.no_such_api" in missing("gpupace.pacer:Pacer.no_such_api")


def test_oracle_gap_takes_every_bucket_but_its_last_arrival():
    from bench.sim_oracle_gap import early_ranks

    wait = np.array([[[5.0, 0.0], [0.0, 2.0], [3.0, 4.0]]])  # [1 step, 3 ranks, 2 sites]
    delay = np.zeros_like(wait)
    delay[0, 1, 1] = 9.0  # rank 1 was delayed at site 1: it arrived early, not last
    w, d = early_ranks(wait, delay)
    np.testing.assert_array_equal(w, [5.0, 2.0, 3.0, 4.0])  # site 1's last: rank 0
    np.testing.assert_array_equal(d, [0.0, 9.0, 0.0, 0.0])


def test_oracle_gap_script_writes_its_results(tmp_path):
    from bench.sim_oracle_gap import main as gap_main

    assert gap_main(["--nodes", "1", "--steps", "60", "--seeds", "1", "--out", str(tmp_path)]) == 0
    (doc_path,) = tmp_path.glob("sim_oracle_gap_*.json")
    doc = json.loads(doc_path.read_text())
    runs = {r["case"] for r in doc["rows"] if r["bench"] == "gain_over_none"}
    assert len(runs) == 3 and all("run=" in r for r in runs), runs
    waits = [r for r in doc["rows"] if r["bench"] == "early_rank_per_bucket" and "run=none" in r["case"]]
    assert len(waits) == 1 and waits[0]["n"] == 30 * 8 * 10 - 30 * 10  # 8 ranks, 10 buckets
    with pytest.raises(SystemExit):
        gap_main(["--steps", "10"])


def test_holdoff_script_measures_how_soon_the_policy_paces(tmp_path):
    """One rank always last (`locality`, 8 ranks): the first delay at warm-up + 5; the old
    rule's earliest step, computed, at warm-up + 5 x 8."""
    from bench.harness import Harness
    from bench.sim_holdoff import bench_holdoff

    h = Harness("sim_holdoff", out_dir=tmp_path)
    bench_holdoff(h, cases=(("locality", 1, 60, 0.0),))
    got = {r["bench"]: r["p50"] for r in h.rows}
    assert got["first_delay"] == 10 and got["n_last"] == 1 and got["holdoff_5n"] == 45
    assert got["paced_ranks"] == 75.0  # the 6 fast ranks of 8; the slow two wait for nobody


def test_attribution_script_sets_the_report_beside_each_cause_cost(tmp_path):
    from bench.sim_attribution import main as attribution_main

    rc = attribution_main(["--presets", "locality", "--nodes", "1", "--steps", "200",
                           "--seeds", "1", "--out", str(tmp_path)])
    assert rc == 0
    (doc_path,) = tmp_path.glob("sim_attribution_*.json")
    doc = json.loads(doc_path.read_text())["extras"]["locality"]
    # One cause in the preset, and one switched off: the others are not in it
    assert list(doc["switched_off_saves_ms_per_step"]) == ["locality"]
    cost = doc["switched_off_saves_ms_per_step"]["locality"][0]
    split = doc["report_ms_per_step"]
    # A clean case (3 ms on two ranks of 8, nothing random): the split finds what it cost
    assert cost == pytest.approx(3.0, rel=0.02)
    assert split["locality"][0] == pytest.approx(cost, rel=0.05)
    assert split["lost (all)"][0] == pytest.approx(cost, rel=0.05)
    for bad in (["--presets", "nosuch"], ["--steps", "50"]):
        with pytest.raises(SystemExit):
            attribution_main(bad)


def test_attribution_switches_a_cause_off_and_keeps_every_other_draw():
    """The simulator draws every random process from one generator: switching a cause off by
    its probability (noise_sigma=0) shifted the draws after it, and the 'cost' of the stalls
    on `paper` read 1.8 ms a step for 0.4. The regimes are drawn last: they must not move."""
    from bench.sim_attribution import CAUSES, switched_off
    from gpupace.sim import presets
    from gpupace.sim.draws import Draws

    sc = presets.paper(2)
    base = Draws(sc, seed=3).next(50)
    assert base.regime.any()  # the check below has regimes to compare
    for cause, (has, _) in CAUSES.items():
        assert has(sc), cause
        got = Draws(switched_off(sc, [cause]), seed=3).next(50)
        np.testing.assert_array_equal(got.regime, base.regime, err_msg=cause)
        if cause != "fabric":
            np.testing.assert_array_equal(got.contention, base.contention, err_msg=cause)
        if cause in ("fabric", "regimes", "coupling"):
            np.testing.assert_array_equal(got.work, base.work, err_msg=cause)


def test_attribution_costs_are_never_negative_on_a_random_preset(tmp_path):
    from bench.sim_attribution import main as attribution_main

    assert attribution_main(["--presets", "jitter", "--nodes", "1", "--steps", "200",
                             "--seeds", "1", "--out", str(tmp_path)]) == 0
    (doc_path,) = tmp_path.glob("sim_attribution_*.json")
    cost = json.loads(doc_path.read_text())["extras"]["jitter"]["switched_off_saves_ms_per_step"]
    assert sorted(cost) == ["all", "noise", "regimes", "stalls"]
    assert all(v[0] > 0 for v in cost.values()), cost
    # all at once costs about what each alone does, summed (they interact a little)
    assert cost["all"][0] == pytest.approx(sum(v[0] for k, v in cost.items() if k != "all"),
                                           rel=0.35)


def test_report_load_script_times_both_commands(tmp_path):
    from bench.report_load import main as load_main

    assert load_main(["--ranks", "8", "--steps", "40", "--repeats", "1", "--out", str(tmp_path)]) == 0
    (doc_path,) = tmp_path.glob("report_load_*.json")
    rows = json.loads(doc_path.read_text())["rows"]
    assert {(r["case"].split("command=")[1], r["metric"]) for r in rows} == {
        ("load_runs", "time"), ("load_runs", "peak RSS"),
        ("gpupace report", "time"), ("gpupace report", "peak RSS")}
    assert all(r["n"] == 1 and r["p50"] > 0 for r in rows)


def test_git_state_takes_the_commit_it_is_given(monkeypatch):
    """The lent GPU machine's copy carries a stale .git: the device command names the commit."""
    from bench.harness import git_state

    monkeypatch.setenv("GPUPACE_COMMIT", "0123abc")
    assert git_state() == ("0123abc", [])
    monkeypatch.delenv("GPUPACE_COMMIT")
    sha, _ = git_state()
    assert sha and sha != "0123abc"


def test_a_scripts_help_says_its_first_sentence_whole():
    from bench.harness import description

    doc = """One thing the script does, said over
    two lines: with a colon. Then more.

    usage: ..."""
    assert description(doc) == "One thing the script does, said over two lines: with a colon."
    assert description("No sentence end here\n\nmore.") == "No sentence end here"


def test_the_code_hash_names_the_sources_a_run_measured(tmp_path):
    """The GPU machine's copy cannot say whether it held uncommitted changes (GPUPACE_COMMIT
    names the commit): its code hash, computed again on a checkout, can."""
    import shutil

    from bench.harness import ROOT, code_hash

    for folder in ("gpupace", "kernels", "bench", "tests/gpu"):
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("results", "__pycache__"))
    assert code_hash(tmp_path) == code_hash()
    (tmp_path / "tests" / "gpu" / "test_vcluster.py").write_text("changed\n")  # its figures
    assert code_hash(tmp_path) != code_hash()
    shutil.copy(ROOT / "tests" / "gpu" / "test_vcluster.py", tmp_path / "tests" / "gpu")
    (tmp_path / "results").mkdir()
    (tmp_path / "bench" / "results").mkdir()
    (tmp_path / "bench" / "results" / "x.py").write_text("not code\n")  # results: not code
    assert code_hash(tmp_path) == code_hash()
    (tmp_path / "kernels" / "spin.py").write_text("changed\n")
    assert code_hash(tmp_path) != code_hash()
