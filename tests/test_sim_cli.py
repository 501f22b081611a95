"""Simulator I/O: the `gpupace simulate` CLI, simulated telemetry, and calibration from it."""

from __future__ import annotations

import importlib
import json
import re

import numpy as np
import pytest

from gpupace.cli import main
from gpupace.sim import fit_telemetry, labelled_telemetry, presets, simulate, write_telemetry
from gpupace.sim.cli import no_coupling_note, pacing_cost_note
from gpupace.summary import summarize
from gpupace.telemetry import read_telemetry

pytestmark = pytest.mark.timeout(120)

ROW_KEYS = {"nodes", "ranks", "policy", "throughput", "step_time_cv", "step_time_p99",
            "gain_pct", "oracle_fraction"}


def test_cli_writes_json_plot_and_telemetry(tmp_path, capsys):
    js, png = tmp_path / "t.json", tmp_path / "t.png"
    tel = tmp_path / "sim-{nodes}-{policy}.jsonl"
    rc = main(["simulate", "--preset", "amplification", "--nodes", "1,2", "--steps", "120",
               "--seed", "3", "--json", str(js), "--plot", str(png), "--telemetry", str(tel)])
    assert rc == 0
    cap = capsys.readouterr()
    out = cap.out
    assert "gain vs none %" in out and "% of oracle gain" in out
    assert "no coupling" not in out  # amplification has one
    assert "\r" not in cap.err  # stderr is no terminal here: no carriage returns
    (said,) = [ln for ln in cap.err.splitlines() if ln.startswith("telemetry: ")]
    for n in (1, 2):
        for p in ("none", "gpupace", "oracle"):
            path = tmp_path / f"sim-{n}-{p}.jsonl"
            assert path.is_file() and str(path) in said  # each written, and named
    oracle_rows = [ln.split() for ln in out.splitlines() if ln.split()[2:3] == ["oracle"]]
    doc = json.loads(js.read_text())
    # percent, not a fraction; "-" where the oracle gains too little for a share to mean much
    fractions = [r["oracle_fraction"] for r in doc["rows"] if r["policy"] == "oracle"]
    assert [r[-1] for r in oracle_rows] == ["-" if f is None else "100" for f in fractions]
    assert "100" in [r[-1] for r in oracle_rows]  # amplification's coupling gives it a gain
    assert set(doc) == {"preset", "notes", "policy_config", "steps", "seed", "gpus_per_node",
                        "coupling", "pacing_cost", "units", "versions", "host", "date", "rows"}
    assert (doc["steps"], doc["seed"], doc["gpus_per_node"]) == (120, 3, 8)
    assert set(doc["units"]) <= ROW_KEYS and "gpupace" in doc["versions"]
    assert doc["preset"] == "amplification" and doc["coupling"]["collective"] > 0
    assert len(doc["rows"]) == 6
    for r in doc["rows"]:
        assert set(r) == ROW_KEYS
    by = {(r["nodes"], r["policy"]): r for r in doc["rows"]}
    assert by[(2, "none")]["ranks"] == 16 and by[(2, "none")]["gain_pct"] == 0.0
    assert png.stat().st_size > 1000 and png.read_bytes()[:4] == b"\x89PNG"
    # three panels (throughput, CV, gain over none): 15 x 4 inches at 100 dpi
    assert int.from_bytes(png.read_bytes()[16:20], "big") == 1500
    t = read_telemetry(tmp_path / "sim-2-oracle.jsonl")
    assert t.header["source"] == "sim" and t.header["world_size"] == 16
    assert len(t.records) == 120 and not t.skipped


def test_cli_bad_parameter_is_one_clear_line(tmp_path, capsys):
    rc = main(["simulate", "--preset", "quiet", "--nodes", "4,x", "--json", str(tmp_path / "j")])
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--nodes" in err[0] and "[1, 4096]" in err[0]
    rc = main(["simulate", "--preset", "quiet", "--nodes", "2", "--steps", "1"])
    assert rc == 2 and "--steps" in capsys.readouterr().err
    rc = main(["sim", "--preset", "quiet", "--nodes", "2", "--steps", "1"])  # the short name
    assert rc == 2 and "gpupace simulate" in capsys.readouterr().err
    rc = main(["simulate", "--preset", "quiet", "--nodes", "4096", "--steps", "100",
               "--telemetry", str(tmp_path / "t.jsonl")])
    assert rc == 2 and "--telemetry" in capsys.readouterr().err


@pytest.mark.parametrize("argv,option,expected", [
    (["--nodes", "4,,8"], "--nodes", "'4,,8'"),
    (["--nodes", "4,"], "--nodes", "'4,'"),
    (["--steps", "3"], "--steps", "[50,"),
    (["--steps", "0"], "--steps", "got 0"),
    (["--seed", "-1"], "--seed", ">= 0"),
    (["--nodes", "4096", "--gpus-per-node", "64"], "--nodes x --gpus-per-node",
     "at most 65536 ranks, got 4096 x 64 = 262144"),
])
def test_cli_rejects_empty_nodes_short_runs_and_names_the_option(capsys, argv, option, expected):
    rc = main(["simulate", "--preset", "quiet", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0].startswith(f"gpupace simulate: error: {option} ") and expected in err[0]


@pytest.mark.timeout(30)
def test_a_run_too_big_for_memory_is_refused_before_any_runs(tmp_path, capsys):
    """10,000,000 steps at 4096 nodes ran the smaller counts first, then stopped on a NumPy
    MemoryError traceback (1.2 TiB asked for); at 64 nodes it would have run for hours first."""
    js = tmp_path / "t.json"
    rc = main(["simulate", "--preset", "quiet", "--nodes", "1,4096", "--steps", "10000000",
               "--json", str(js)])
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and not cap.out, cap
    assert "10,000,000 steps x 32,768 ranks need 2,442.5 GiB" in err[0]
    assert "use fewer steps or ranks" in err[0]
    assert not js.exists()


def test_a_result_kept_for_telemetry_is_counted_against_memory(tmp_path, capsys, monkeypatch):
    """--telemetry FILE holds the largest gpupace result while the oracle runs: a run that fits
    alone but not beside it is refused; with {nodes} and {policy} each result is written at
    once, and the same run goes ahead (2,000 steps of 8 ranks with site arrays: 66.9 MB alone,
    69.8 MB with a kept result; 68.4 MB allowed)."""
    sim_module = importlib.import_module("gpupace.sim.simulate")  # the module, not the function
    monkeypatch.setattr(sim_module, "machine_memory", lambda: 85_500_000)
    argv = ["simulate", "--preset", "quiet", "--nodes", "1", "--steps", "2000", "--telemetry"]
    assert main([*argv, str(tmp_path / "t.jsonl")]) == 2
    assert "this process may use" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
    assert main([*argv, str(tmp_path / "t-{nodes}-{policy}.jsonl")]) == 0
    assert len(list(tmp_path.iterdir())) == 3


@pytest.mark.timeout(30)
@pytest.mark.parametrize("telemetry,nodes,expected", [
    ("{dir}/n{nodes}.jsonl", "1,2", "with {nodes} needs {policy} too"),
    ("{dir}/{policy}.jsonl", "1,2", "with {policy} and 2 node counts needs {nodes} too"),
    ("{dir}/{policy}-{node}.jsonl", "1", "knows the placeholders {nodes} and {policy}, got "
                                          "{node} in"),
])
def test_telemetry_names_that_runs_would_write_over_are_refused(tmp_path, capsys, telemetry,
                                                                  nodes, expected):
    """Each node count runs none, gpupace and oracle: a name without {policy} held the oracle
    run alone, one without {nodes} the last node count's, the others written and lost."""
    rc = main(["simulate", "--preset", "quiet", "--nodes", nodes, "--steps", "10000000",
               "--telemetry", telemetry.replace("{dir}", str(tmp_path))])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and expected in err[0], err
    assert not list(tmp_path.iterdir())


def test_telemetry_at_a_path_that_holds_a_file_keeps_that_file(tmp_path, capsys):
    """As the Pacer does: a real job's telemetry at the path was overwritten without a word."""
    real = tmp_path / "run.jsonl"
    real.write_text('{"gpupace": "telemetry", "source": "pacer"}\n')
    assert main(["simulate", "--preset", "quiet", "--nodes", "1", "--steps", "50",
                 "--telemetry", str(real)]) == 0
    err = capsys.readouterr().err
    assert f"telemetry: {real} already held a run: kept it as {real}.1" in err
    assert (tmp_path / "run.jsonl.1").read_text() == '{"gpupace": "telemetry", "source": "pacer"}\n'
    assert read_telemetry(real).header["source"] == "sim"


def test_a_run_too_short_for_the_policy_at_some_sizes_says_so(tmp_path, capsys):
    """A rank is delayed only after the holdoff, 5 steps on time for each rank that has been
    last. With random stalls (`jitter`) at 64 nodes (512 ranks) about 150 ranks have been last
    by step 200: in a run of 200 steps, whose second half is measured, gpupace's row there
    shows the policy before it acts. The note says so for 64 nodes, not for 1 (8 ranks: 45
    steps at most), and asks for steps enough for the longest holdoff (5 x 512). With one
    node's ranks always last (`locality`) the holdoff is 5 steps: no note."""
    js = tmp_path / "t.json"
    assert main(["simulate", "--preset", "jitter", "--nodes", "1,64", "--steps", "200",
                 "--json", str(js)]) == 0
    note = [ln for ln in capsys.readouterr().out.splitlines() if "could delay ranks" in ln]
    assert len(note) == 1 and re.search(r"\(100 on\): 64 node\(s\) 0% \(no delay before step "
                                         r"\d{3}, where the holdoff this run reached ends\)\.", note[0]), note
    assert ("Use --steps 5330 or more: the holdoff reaches step 2565 at 64 node(s) where every "
            "rank takes its turn last.") in note[0]
    # under every table
    assert json.loads(js.read_text())["notes"] == [*note, pacing_cost_note("graph"),
                                                   no_coupling_note("jitter")]
    assert main(["simulate", "--preset", "locality", "--nodes", "64", "--steps", "200"]) == 0
    assert "could delay ranks" not in capsys.readouterr().out


def test_the_locality_preset_needs_two_gpus_per_node(capsys):
    """With one GPU per node every rank is its node's rank 0: the handicap fell on all alike
    (slower compute, no spread) and the scenario still said 'locality'."""
    rc = main(["simulate", "--preset", "locality", "--gpus-per-node", "1", "--nodes", "2"])
    assert rc == 2 and "--gpus-per-node >= 2, got 1" in capsys.readouterr().err
    assert "locality" not in presets.paper(2, gpus_per_node=1).failure_modes()
    assert "locality" in presets.paper(2, gpus_per_node=2).failure_modes()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("option,value,expected", [
    ("--json", "{dir}", "must be a file path, got the directory"),
    ("--telemetry", "{dir}", "must be a file path, got the directory"),
    ("--plot", "{dir}/sim.png", "must be a file path, got the directory"),
    ("--plot", "{dir}/out.txt", ".png"),
    ("--json", "{file}/x.json", "not a writable directory"),
])
def test_cli_checks_output_paths_before_simulating(tmp_path, capsys, option, value, expected):
    (tmp_path / "sim.png").mkdir()
    (tmp_path / "file").write_text("a file, not a folder\n")
    path = value.format(dir=tmp_path, file=tmp_path / "file")
    # ten million steps at 64 nodes would run for days: only a check before it returns
    rc = main(["simulate", "--preset", "quiet", "--nodes", "64", "--steps", "10000000",
               option, path])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert f"{option} must" in err[0] and repr(path) in err[0] and expected in err[0]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("option", ["--json", "--plot", "--telemetry", "--from-telemetry"])
def test_an_empty_path_is_refused_before_simulating(tmp_path, capsys, monkeypatch, option):
    """'--json $OUT' with OUT unset: --json and --plot wrote nothing and said nothing,
    --telemetry failed on '.' after the whole run, --from-telemetry ran the paper preset."""
    monkeypatch.chdir(tmp_path)
    rc = main(["simulate", "--nodes", "64", "--steps", "10000000", option, ""])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert err[0] == f"gpupace simulate: error: {option} must be a file path, got an empty string"
    assert not list(tmp_path.iterdir())


@pytest.fixture
def real_run(tmp_path):
    """A job's telemetry file, as `simulate --from-telemetry` reads it."""
    return write_telemetry(simulate(presets.quiet(1), "none", steps=60), tmp_path / "real.jsonl")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("option,value", [
    ("--telemetry", "real.jsonl"),
    ("--json", "real.jsonl"),
    ("--json", "sub/../real.jsonl"),  # another name for it
    ("--plot", "real.svg"),  # a link to it
    ("--telemetry", "real-{nodes}-{policy}.jsonl"),  # one run's file is it
])
def test_an_output_onto_the_telemetry_read_is_refused(tmp_path, capsys, real_run, option,
                                                      value):
    """The real job's file was replaced by simulated telemetry or by the table."""
    (tmp_path / "real.svg").symlink_to(real_run)
    (tmp_path / "sub").mkdir()
    (tmp_path / "real-1-gpupace.jsonl").hardlink_to(real_run)
    before = real_run.read_bytes()
    files = set(tmp_path.iterdir())
    path = str(tmp_path / value)
    rc = main(["simulate", "--from-telemetry", str(real_run), "--nodes", "1", "--steps", "60",
               option, path])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"gpupace simulate: error: {option} must not be the "
                             f"--from-telemetry file, which it would write over: got ")
    assert repr(path) in err[0] and repr(str(real_run)) in err[0]
    assert real_run.read_bytes() == before and set(tmp_path.iterdir()) == files


@pytest.mark.timeout(30)
@pytest.mark.parametrize("first,second,expected", [
    (("--json", "t.svg"), ("--plot", "t.svg"), "--plot must not be the --json file"),
    (("--json", "t.jsonl"), ("--telemetry", "sub/../t.jsonl"),
     "--telemetry must not be the --json file"),
    (("--plot", "t.svg"), ("--telemetry", "t.svg"), "--telemetry must not be the --plot file"),
])
def test_two_outputs_onto_one_file_are_refused(tmp_path, capsys, first, second, expected):
    """One would be written over by the other: refused before the run, nothing written."""
    (tmp_path / "sub").mkdir()
    argv = [a for opt, name in (first, second) for a in (opt, str(tmp_path / name))]
    rc = main(["simulate", "--preset", "quiet", "--nodes", "64", "--steps", "10000000", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and expected in err[0], err
    assert repr(str(tmp_path / first[1])) in err[0] and repr(str(tmp_path / second[1])) in err[0]
    assert [p.name for p in tmp_path.iterdir()] == ["sub"]


def test_cli_creates_missing_output_folders(tmp_path):
    js, png = tmp_path / "a" / "b" / "t.json", tmp_path / "c" / "t.svg"
    rc = main(["simulate", "--preset", "quiet", "--nodes", "1", "--steps", "50",
               "--json", str(js), "--plot", str(png)])
    assert rc == 0 and json.loads(js.read_text())["preset"] == "quiet"
    assert png.read_text().lstrip().startswith("<?xml")


def test_telemetry_round_trip_matches_the_result(tmp_path):
    res = simulate(presets.locality(1), "gpupace", steps=300, seed=2)
    path = write_telemetry(res, tmp_path / "loc.jsonl")
    t = read_telemetry(path)
    assert t.header["sim"]["failure_modes"] == ["locality"]
    assert t.header["sim"]["slow_ranks"] == [6, 7]
    assert t.header["sim"]["policy"] == "gpupace" and t.header["label"] == "locality 1x8 gpupace"
    assert len(t.header["sites"]) == res.scenario.buckets
    recs = t.records
    assert len(recs) == 300 and all(len(r.earliness_us) == 8 for r in recs)
    s = summarize(recs)
    assert s["step_time_mean"] == pytest.approx(res.summary(skip=0)["step_time_mean"])
    assert s["straggler_histogram"][6] + s["straggler_histogram"][7] == 300
    assert [r.active for r in recs] == list(res.active.any(axis=1))
    np.testing.assert_allclose([sum(r.delay_us) for r in recs], res.delay_us.sum(axis=1),
                               rtol=1e-5)


def test_writing_telemetry_needs_site_arrays(tmp_path):
    res = simulate(presets.quiet(1), "none", steps=10, keep_sites=False)
    with pytest.raises(ValueError, match="keep_sites"):
        write_telemetry(res, tmp_path / "x.jsonl")


def test_fit_recovers_offsets_and_simulates_at_scale(tmp_path, capsys):
    res = simulate(presets.locality(1), "none", steps=200, seed=0)
    path = write_telemetry(res, tmp_path / "loc.jsonl")
    fit = fit_telemetry(path)
    assert fit.world_size == 8 and fit.sites == res.scenario.buckets
    np.testing.assert_allclose(fit.offsets_us, [0] * 6 + [3000.0] * 2, atol=30.0)
    assert fit.noise_sigma < 1e-3 and fit.spike_prob == 0.0
    assert fit.compute_us == pytest.approx(93_000.0, rel=0.05)
    js = tmp_path / "fit.json"
    rc = main(["simulate", "--from-telemetry", str(path), "--nodes", "1,4", "--steps", "100",
               "--json", str(js)])
    assert rc == 0
    doc = json.loads(js.read_text())
    rows = doc["rows"]
    assert [r["ranks"] for r in rows] == [8, 8, 8, 32, 32, 32]
    assert len(doc["fit"]["offsets_us"]) == 8  # the whole fit in the file
    # what the fit read and left out is in the file's notes too, and how it scales out
    assert doc["notes"][0].startswith("fitted from ")
    assert any(n.startswith("fit: not fitted, as one file") for n in doc["notes"])
    assert any("rank r takes the offset of the file's rank r % 8" in n for n in doc["notes"])
    out = capsys.readouterr().out
    fitted = next(ln for ln in out.splitlines() if ln.startswith("fitted from"))
    assert "8 ranks" in fitted and "2 ranks steadily late (up to 3.0 ms)" in fitted, fitted
    # what one file cannot show is said beside the table
    assert "fit: not fitted, as one file of a few ranks shows none of them: fabric " \
        "contention, regime switches" in out, out
    assert "which late rank is late from before the backward" in out
    assert pacing_cost_note("graph") in out
    note = [ln for ln in out.splitlines() if "no coupling" in ln]
    assert len(note) == 1 and "--coupling batched" in note[0], note
    assert "What if the job ran on 512 GPUs" in note[0]
    # the note's way works: the fit with the coupling measured beside batched matmuls
    rc = main(["simulate", "--from-telemetry", str(path), "--nodes", "1", "--steps", "100",
               "--coupling", "batched", "--json", str(js)])
    assert rc == 0
    doc = json.loads(js.read_text())
    assert doc["coupling"] == {"collective": 0.052, "spin": 0.031}
    assert doc["fit"]["given"] == {"coupling": 0.052, "paced_coupling": 0.031}  # matched with
    out = capsys.readouterr().out
    assert "coupling batched" in out and "no coupling" not in out


def test_policy_settings_from_the_environment_are_said_and_kept(tmp_path, capsys, monkeypatch):
    """GPUPACE_* variables change the simulated policy (a shell set up for a training job moved
    jitter at 16 nodes from 0.000% to -0.254%): the run names them, and --json keeps the
    policy's settings."""
    js = tmp_path / "e.json"
    monkeypatch.setenv("GPUPACE_GAIN", "0.5")
    monkeypatch.setenv("GPUPACE_MODE", "observe")  # not the simulated policy's: left unsaid
    assert main(["simulate", "--preset", "quiet", "--nodes", "1", "--steps", "60",
                 "--json", str(js)]) == 0
    out = capsys.readouterr().out
    said = "note: the gpupace policy ran with settings from the environment: GPUPACE_GAIN=0.5 "
    assert said in out and "GPUPACE_MODE" not in out, out
    doc = json.loads(js.read_text())
    assert doc["policy_config"]["gain"] == 0.5 and said in doc["notes"][0]
    # one the simulated policy does not read is still read as a Pacer reads it: GPUPACE_MODE=foo
    # ran on, unsaid, where `gpupace doctor` and every Pacer refuse it
    monkeypatch.setenv("GPUPACE_MODE", "foo")
    assert main(["simulate", "--preset", "quiet", "--nodes", "1", "--steps", "60"]) == 2
    assert "(from the environment: GPUPACE_MODE='foo')" in capsys.readouterr().err


def test_paper_with_one_gpu_a_node_says_it_has_no_locality(capsys):
    """With one GPU a node the paper preset's locality handicap has no far rank to fall on: it
    ran three failure modes of four, and still printed the study's calibration beside it."""
    assert main(["simulate", "--preset", "paper", "--gpus-per-node", "1", "--nodes", "2",
                 "--steps", "60"]) == 0
    out = capsys.readouterr().out
    assert "with 1 GPU a node, paper has no locality" in out, out
    assert "the study gpupace implements" not in out
    assert main(["simulate", "--preset", "paper", "--nodes", "1", "--steps", "60"]) == 0
    out = capsys.readouterr().out
    assert "the study gpupace implements" in out and "no locality" not in out
    assert "preset paper, coupling batched (the preset's)," in out  # which one it ran with


@pytest.mark.parametrize("coupling, expected", [("off", (0.0, 0.0)), ("batched", (0.052, 0.031)),
                                                ("persistent", (0.344, 0.194))])
def test_coupling_option_sets_the_measured_figures(tmp_path, capsys, coupling, expected):
    js = tmp_path / "c.json"
    rc = main(["simulate", "--preset", "paper", "--nodes", "1", "--steps", "120",
               "--coupling", coupling, "--pacing-cost", "off", "--json", str(js)])
    assert rc == 0
    doc = json.loads(js.read_text())
    assert tuple(doc["coupling"].values()) == expected
    out = capsys.readouterr().out
    assert f"coupling {coupling}" in out and "no coupling" not in out  # off is asked for
    assert "(the preset's)" not in out
    oracle = next(r for r in doc["rows"] if r["policy"] == "oracle")
    if coupling == "off":  # nothing couples the ranks: perfect foresight cannot shorten a step
        assert oracle["gain_pct"] == pytest.approx(0.0, abs=1e-9)
    else:
        assert oracle["gain_pct"] > 0.0


@pytest.mark.parametrize("kind", ["graph", "eager", "off"])
def test_pacing_cost_option_charges_the_measured_figures(tmp_path, capsys, kind):
    """The paced rows pay pacing's own kernels as measured on an H200 (graph by default): on
    the quiet preset, where nothing else differs, exactly the last collective's and the
    step's; nothing with `off`, which the note says is left out."""
    js = tmp_path / "p.json"
    extra = [] if kind == "graph" else ["--pacing-cost", kind]
    assert main(["simulate", "--preset", "quiet", "--nodes", "1", "--steps", "60",
                 "--json", str(js), *extra]) == 0
    doc = json.loads(js.read_text())
    site, step = {"graph": (1.91, 9.49), "eager": (56.16, 128.03), "off": (0.0, 0.0)}[kind]
    assert doc["pacing_cost"] == {"site_us": site, "step_us": step}
    rows = {r["policy"]: r for r in doc["rows"]}
    step_us = presets.quiet(1).samples_per_rank * 8 * 1e6 / rows["none"]["throughput"]
    for policy in ("gpupace", "oracle"):
        want = -100.0 * (site + step) / (step_us + site + step)
        assert rows[policy]["gain_pct"] == pytest.approx(want, rel=1e-6, abs=1e-9), rows
    out = capsys.readouterr().out
    assert pacing_cost_note(kind) in out and pacing_cost_note(kind) in doc["notes"]
    assert ("leave out pacing's own cost" in out) == (kind == "off")


def test_fit_reads_jitter_as_noise(tmp_path):
    res = simulate(presets.jitter(1, regimes=False), "none", steps=400, seed=0)
    fit = fit_telemetry(write_telemetry(res, tmp_path / "j.jsonl"))
    assert 0.003 < fit.noise_sigma < 0.03  # the preset's 0.01, seen through one site
    assert max(fit.offsets_us) < 300.0  # no fixed offsets


@pytest.mark.parametrize("mode", ["quiet", "jitter", "locality", "fabric", "amplification"])
def test_labelled_telemetry_one_mode_per_file(tmp_path, mode):
    t = read_telemetry(labelled_telemetry(mode, tmp_path / f"{mode}.jsonl", nodes=1, steps=40))
    assert t.header["label"] == f"{mode} 1x8 none" and t.header["sim"]["preset"] == mode
    assert len(t.records) == 40 and t.header["world_size"] == 8
    if mode != "quiet":
        assert mode in t.header["sim"]["failure_modes"]


def test_nodes_are_sorted_and_each_simulated_once():
    from gpupace.sim.cli import parse_nodes

    assert parse_nodes("16,4,8,4") == [4, 8, 16]


def test_a_gain_that_rounds_to_zero_has_no_minus_sign():
    from gpupace.sim.table import format_table

    row = {"nodes": 4, "ranks": 32, "policy": "gpupace", "throughput": 611.0,
           "step_time_cv": 0.03, "step_time_p99": 1e5, "gain_pct": -0.0004,
           "oracle_fraction": -0.003}
    line = format_table([row]).splitlines()[-1]
    assert line.split()[-2:] == ["0.000", "0"], line
    # three decimals: the README's -0.001% (paper, 32 nodes) read "0.00" beside a share of -4
    assert format_table([dict(row, gain_pct=-0.0012)]).splitlines()[-1].split()[-2] == "-0.001"
    oracle = dict(row, policy="oracle", gain_pct=0.5, oracle_fraction=1.0)
    small = dict(oracle, gain_pct=0.01, oracle_fraction=None)
    lines = format_table([oracle, small]).splitlines()
    assert [ln.split()[-1] for ln in lines[1:3]] == ["100", "-"]
    assert lines[3] == "(% of oracle gain: - where the oracle gained under 0.05% or lost, too " \
                       "little to take a share of)"
    assert "too little" not in format_table([oracle])  # no "-", no legend
