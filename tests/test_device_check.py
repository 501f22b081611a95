"""The prepared device check on a machine without CUDA: it must say why it skips, write
nothing and exit 0. Its result writer is checked on a made-up result (no figure of it is
reported anywhere)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "device_check.py"


def load():
    spec = importlib.util.spec_from_file_location("device_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_skips_cleanly_without_cuda(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)  # main() sets it
    dc = load()
    assert dc.main(["--out", str(tmp_path / "res")]) == 0
    assert "SKIP" in capsys.readouterr().out
    assert not (tmp_path / "res").exists()


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="on a GPU the command runs for real: the device check covers that")
def test_command_line_skips_cleanly_without_cuda(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "res")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "SKIP" in p.stdout and "no CUDA" in p.stdout
    assert "not the host policy update, the added time per paced collective" in p.stdout
    assert not (tmp_path / "res").exists()


def test_result_files_and_verdicts(tmp_path):
    dc = load()
    q = {"p20": 1.0, "p50": 2.0, "p80": 3.0, "p99": 4.0, "n": 9}
    fig = {"timer_tick_ns": 32.0, "host_syncs_per_step": 0.0,
           "spin_error_us": q | {"by_delay": {"5.0": q}},
           "spin_error_events_us": q | {"by_delay": {"5.0": q | {"p99": 4.5}}},
           "spin_error_events_abs_p99_us": 0.8, "spin_error_events_abs_p99_us_worst_delay": 4.5,
           "overhead": {f"{mode}_{n}_sites": {"per_collective_us": q | {"p50": p50},
                                              "plain_step_us": q, "paced_step_us": q}
                        for mode, p50 in (("graph", 2.0), ("eager", 20.0)) for n in (1, 8)}}
    v = dc.verdicts(fig)
    assert v["graph_overhead_us"] == ("met: worst p50 2.00 us vs <= 3.0 us, at 1 and 8 paced "
                                      "collectives a step")
    assert v["eager_overhead_us"].startswith("missed")
    # judged on the events at the worst delay: 4.5 us > 0.032 + 1, whatever the pooled p99
    # (the own clock's error cannot fail); no "|" in it, which would split its table cell
    assert v["spin_error_p99"].startswith("missed: p99 of the absolute error 4.50 us at the "
                                          "worst delay, timed by CUDA events")
    assert dc.verdicts(fig | {"spin_error_events_abs_p99_us_worst_delay": 0.8})[
        "spin_error_p99"].startswith("met")
    assert dc.verdicts({})["graph_overhead_us"] == "not measured"
    res = {"stem": "2026-01-01-test-gpu", "figures": fig, "verdicts": v,
           "machine": {"gpu": "Test GPU", "date": "2026-01-01T00:00:00Z"},
           "tests": {"passed": 1, "failed": 0, "errors": 0, "skipped": 0, "seconds": 1.0,
                     "returncode": 0},
           "bench_suite": {"ran": False}, "bench_errors": {"syncs": "RuntimeError: boom"},
           "bench_skipped": {"overhead": "cupy is not installed"}}
    j, md = dc.write_results(res, tmp_path)
    assert j.name == "2026-01-01-test-gpu.json" and md.suffix == ".md"
    text = md.read_text()
    assert "Test GPU" in text and "| graph_1_sites | 1.00 | 2.00 | 3.00 |" in text
    assert all(line.count("|") == 3 for line in text.splitlines()
               if line.startswith("| ") and "_us" in line.split("|")[1] and "p50" not in line)
    assert "GPU tests: 1 passed, 0 failed, 0 errors, 0 skipped (1.0 s; exit code 0)." in text
    assert "INCOMPLETE" not in text
    assert "| 5.0 | 2.000 | 4.500 | 2.000 | 4.000 |" in text and "| all | 2.000 | 4.000 | 2.000 | " \
        "4.000 |" in text
    assert "- microbenchmark syncs failed: RuntimeError: boom" in text
    assert "- microbenchmark overhead skipped: cupy is not installed" in text
    assert dc.slug("NVIDIA H200") == "nvidia-h200"


def test_a_phase_past_its_deadline_is_killed_and_keeps_its_output(tmp_path):
    """The GPU tests and the suite run through `run_logged`: a hung one is killed with its
    children at its deadline, and what it printed before is in the log."""
    dc = load()
    log = tmp_path / "check.log"
    code = ("import subprocess, sys, time; print('measured 1.5 us', flush=True); "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('child', c.pid, flush=True); time.sleep(60)")
    rc, seconds = dc.run_logged([sys.executable, "-c", code], log, 3.0, {})
    text = log.read_text()
    assert rc == 124 and seconds < 30
    assert "measured 1.5 us" in text and "TIMEOUT after 3 s" in text
    child = int(text.split("child ")[1].split()[0])
    for _ in range(50):  # killed: gone, or a zombie until whoever adopted it reaps it
        try:
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the phase's child process {child} outlived the kill")
    rc, _ = dc.run_logged([sys.executable, "-c", "print('ok')"], log, 30.0, {})
    assert rc == 0 and log.read_text().rstrip().endswith("ok")


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="on a GPU the probe runs for real: the device check covers that")
def test_the_launch_cost_probe_runs_in_its_own_process_and_skips_without_cuda(tmp_path):
    """The check runs `bench/launch_cost.py` as a process of its own; here it says why it
    skips, writes no figure and exits 0, and the check records that it ran."""
    dc = load()
    fig: dict = {}
    log = tmp_path / "check.log"
    tmp = Path(tempfile.gettempdir())
    before = set(tmp.glob("gpupace-launch-*"))
    ran = dc.run_launch_cost(fig, log, 120.0)
    assert ran["ran"] and ran["returncode"] == 0 and fig == {}
    assert "launch cost: SKIP: no CUDA device" in log.read_text()
    assert set(tmp.glob("gpupace-launch-*")) == before  # its folder removed (one a run left)


def test_a_launch_way_that_fails_is_dropped_with_why_and_the_others_are_timed():
    """launch_cost times many ways in one loop on a GPU; one that raises on a later call (a
    direct launch gone wrong) must not take the others' figures with it."""
    spec = importlib.util.spec_from_file_location("launch_cost", ROOT / "bench" / "launch_cost.py")
    lc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lc)
    calls = {"good": 0, "breaks": 0}

    def good():
        calls["good"] += 1

    def breaks():
        calls["breaks"] += 1
        if calls["breaks"] > 2:  # after the warm window and one timed window
            raise RuntimeError("illegal launch")

    def per_launch(fn, n):  # a stand-in timer: no GPU here
        fn()
        return float(n)

    samples, failed = lc.time_ways({"good": good, "breaks": breaks}, windows=4, launches=7,
                                   per_launch=per_launch)
    assert samples == {"good": [7.0] * 4}
    assert failed == {"breaks": "RuntimeError: illegal launch"}
    assert calls == {"good": 5, "breaks": 3}


def test_half_a_launch_cost_file_is_an_error_not_the_end_of_the_check(tmp_path, monkeypatch):
    """A probe killed mid-write leaves half its JSON: the check records why and goes on to
    its other phases (a traceback there ended the run before the overhead figures)."""
    dc = load()
    probe = tmp_path / "root" / "bench" / "launch_cost.py"
    probe.parent.mkdir(parents=True)
    probe.write_text("import sys\nopen(sys.argv[2], 'w').write('{\"jit_us\": 1')\n")
    monkeypatch.setattr(dc, "ROOT", tmp_path / "root")
    fig: dict = {}
    ran = dc.run_launch_cost(fig, tmp_path / "check.log", 60.0)
    assert ran["returncode"] == 0 and ran["error"].startswith("JSONDecodeError") and fig == {}


def test_sync_verdict_needs_the_host_to_run_ahead_of_a_busy_gpu():
    dc = load()
    ahead = {"host_syncs_per_step": 0.0,
             "host_ahead_of_busy_gpu": {"gpu_still_busy_after_the_steps": True}}
    waited = {"host_syncs_per_step": 0.0,
              "host_ahead_of_busy_gpu": {"gpu_still_busy_after_the_steps": False}}
    assert dc.verdicts(ahead)["host_syncs_per_step"].startswith("met")
    assert dc.verdicts(waited)["host_syncs_per_step"].startswith("missed")
    assert "waited" in dc.verdicts(waited)["host_syncs_per_step"]
    # the busy-GPU way not run (the benchmark raised after its first way): no "met"
    alone = {"host_syncs_per_step": 0.0}
    assert dc.verdicts(alone)["host_syncs_per_step"] == (
        "not measured in full: 0.0 torch syncs per step; the busy-GPU way did not run")
    # the GPU tests' own count is theirs, under gpu_tests: never the verdict's
    assert dc.verdicts({"gpu_tests": {"host_syncs_per_step": 0.0}})[
        "host_syncs_per_step"] == "not measured"


def test_overhead_verdicts_name_their_cases_and_pass_only_in_full():
    """A check cut short after the 1-site cases must not read "met" for the 8-site ones; a
    miss of one case is a miss; NaN is not a figure."""
    dc = load()

    def fig(**p50):
        return {"overhead": {k: {"per_collective_us": {"p50": v}} for k, v in p50.items()}}

    v = dc.verdicts(fig(graph_1_sites=2.0, eager_1_sites=20.0))
    assert v["graph_overhead_us"] == ("not measured in full: worst p50 2.00 us vs <= 3.0 us, at "
                                      "1 paced collectives a step (8 not measured)")
    assert v["eager_overhead_us"].startswith("missed: worst p50 20.00 us")
    v = dc.verdicts(fig(graph_1_sites=2.0, graph_8_sites=float("nan")))
    assert v["graph_overhead_us"].startswith("not measured in full")
    assert dc.verdicts(fig(graph_8_sites=float("nan")))["graph_overhead_us"] == "not measured"


def _stand_in_phase(dc, monkeypatch, body: str | dict[str, str]) -> None:
    """`run_phase` starts the phase's process as it does, its microbenchmark's body stood in
    for by this code (or, from a dict, the phase's), which writes its figures into `fig`."""
    import textwrap

    def command(name, path, deadline):
        code = ("import importlib.util, sys, time, os\n"
                f"spec = importlib.util.spec_from_file_location('dc', {str(SCRIPT)!r})\n"
                "dc = importlib.util.module_from_spec(spec); spec.loader.exec_module(dc)\n"
                "def body(fig):\n"
                + textwrap.indent(body[name] if isinstance(body, dict) else body, "    ")
                + f"\ndc.PHASES[{name!r}] = body\n"
                f"os._exit(dc.run_phase_here({name!r}, dc.Path(sys.argv[1]), {deadline}))\n")
        return [sys.executable, "-c", code, str(path)]
    monkeypatch.setattr(dc, "phase_command", command)


def test_a_phase_that_hangs_or_aborts_keeps_what_it_measured_and_says_how_it_ended(
        tmp_path, monkeypatch):
    """Each microbenchmark that touches the GPU runs in a process of its own: one that hangs
    (killed at its deadline) or is aborted (torch's NCCL watchdog) costs only itself, and
    the figures it measured before are kept, merged with the other phases'."""
    dc = load()
    log = tmp_path / "check.log"
    first = {"overhead": {"eager_1_sites": {"per_collective_us": {"p50": 1.0}}}}
    _stand_in_phase(dc, monkeypatch, "fig['overhead'] = {'tail_graph_eager_1_sites': 2.0}\n"
                                     "print('measured', flush=True); time.sleep(60)\n")
    error = dc.run_phase("tail_graph", first, log, 8.0)
    assert error.startswith("killed at its deadline of 8 s"), error
    assert first["overhead"] == {"eager_1_sites": {"per_collective_us": {"p50": 1.0}},
                                 "tail_graph_eager_1_sites": 2.0}
    assert "measured" in log.read_text()
    assert "Timeout (0:00:03)!" in log.read_text()  # its own watchdog's stacks, before the kill
    fig: dict = {}
    _stand_in_phase(dc, monkeypatch, "fig['timer_tick_ns'] = 32.0\nos.abort()\n")
    error = dc.run_phase("tick_and_spin", fig, log, 60.0)
    assert error.startswith("ended by SIGABRT") and fig == {"timer_tick_ns": 32.0}, error
    _stand_in_phase(dc, monkeypatch, "fig['x'] = float('nan')\n")
    assert dc.run_phase("syncs", fig, log, 60.0) is None and fig["x"] is None  # strict JSON
    _stand_in_phase(dc, monkeypatch, "raise RuntimeError('CUDA error: an illegal address')\n")
    error = dc.run_phase("syncs", fig, log, 60.0)
    assert error == "RuntimeError: CUDA error: an illegal address", error


def test_a_phase_process_records_its_error(tmp_path):
    """The real `--phase` path, here without CUDA: the microbenchmark raises in its process,
    which records the error for the check and exits 1."""
    dc = load()
    fig: dict = {}
    error = dc.run_phase("syncs", fig, tmp_path / "check.log", 120.0)
    assert error and fig == {}, (error, fig)
    assert "Traceback" in (tmp_path / "check.log").read_text()


def test_a_check_cut_short_says_where_and_a_killed_test_run_says_so(tmp_path):
    dc = load()
    res = {"stem": "s", "figures": {}, "verdicts": {}, "last_phase": "running overhead",
           "seconds": 71.0, "machine": {"gpu": "Test GPU", "date": "2026-01-01T00:00:00Z"},
           "tests": {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "seconds": 120.0,
                     "returncode": 124}}
    text = dc.markdown(res)
    assert "**INCOMPLETE**: the check stopped at `running overhead` after 71.0 s" in text
    assert "exit code 124). KILLED at its deadline" in text
    assert "GPU tests: not run." in dc.markdown(res | {"tests": {"ran": False}})


def test_the_install_check_knows_where_the_kernels_come_from():
    """The device check installs the checkout unless `gpupace.kernels` already imports from
    this checkout's kernels/ (here: the editable install of the test command)."""
    import gpupace.kernels

    dc = load()
    here = Path(gpupace.kernels.__path__[0]).resolve() == (ROOT / "kernels").resolve()
    assert dc.kernels_here() is here


def test_a_budget_that_is_not_positive_is_refused(capsys):
    dc = load()
    with pytest.raises(SystemExit) as e:
        dc.main(["--budget", "0"])
    assert e.value.code == 2 and "--budget must be a positive number of seconds, got 0.0" in \
        capsys.readouterr().err


def test_an_out_folder_that_cannot_be_made_is_refused_before_anything_runs(tmp_path, capsys):
    """On a GPU machine, --out under a file raised a traceback at its mkdir, after the
    machine's probe; here it is refused first, with nothing made."""
    dc = load()
    (tmp_path / "afile").write_text("")
    with pytest.raises(SystemExit) as e:
        dc.main(["--out", str(tmp_path / "afile" / "res")])
    assert e.value.code == 2 and "is not a folder" in capsys.readouterr().err
    assert dc.unwritable(tmp_path / "new" / "deeper") is None
    assert not (tmp_path / "new").exists()


def test_gpu_tests_without_cupy_skip_only_those_that_need_it(tmp_path):
    """On a GPU machine without cupy the clock, spin and Triton kernel tests still run; the
    reduction, the device backend and the virtual cluster skip, naming cupy. Collected here with
    CUDA faked and cupy hidden."""
    (tmp_path / "fake_gpu_no_cupy.py").write_text(
        "import sys, torch\n"
        "torch.cuda.is_available = lambda: True\n"
        "sys.modules['cupy'] = None\n"
        "def pytest_collection_finish(session):\n"
        "    for it in session.items:\n"
        "        sk = it.get_closest_marker('skip')\n"
        "        print('ITEM', it.name, 'SKIP ' + sk.kwargs['reason'] if sk else 'RUNS')\n"
        "        print('NCCL' if 'nccl_group' in it.fixturenames else 'FREE', it.name)\n")
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "fake_gpu_no_cupy",
                        "-p", "no:cacheprovider", "--collect-only", "tests/gpu"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(tmp_path)})
    items = dict(line.split(" ", 2)[1:] for line in p.stdout.splitlines()
                 if line.startswith("ITEM "))
    assert p.returncode == 0 and items, p.stdout + p.stderr
    runs = {k for k, v in items.items() if v == "RUNS"}
    assert {"test_timer_tick_is_measured", "test_spin_precision_requested_vs_applied",
            "test_enter_exit_on_device", "test_spin_coupling_figure"} <= runs
    assert any(k.startswith("test_update_kernel_on_device_matches_policy") for k in runs)
    skipped = {k: v for k, v in items.items() if v != "RUNS"}
    assert {"test_zero_host_syncs_per_step",
            "test_zz_capture_without_warmup_is_a_clear_error"} <= set(skipped)
    assert any(k.startswith("test_cupy_reduction") for k in skipped)
    assert all("cupy is not installed" in v for v in skipped.values()), skipped
    # A hung NCCL call must not cost the figures that need no NCCL: those tests run first.
    order = [line.split()[0] for line in p.stdout.splitlines() if line[:5] in ("NCCL ", "FREE ")]
    assert order.count("NCCL") >= 5 and order == sorted(order, key=lambda kind: kind == "NCCL")


def test_microbenchmarks_say_what_they_miss():
    """Each microbenchmark is skipped with a reason where its needs are not met (here: no CUDA,
    or a torch without NCCL), instead of failing."""
    dc = load()
    assert dc.bench_missing("triton") is None  # triton imports here (the CPU tests need it)
    why = dc.bench_missing("device")
    assert why and ("CUDA" in why or "NCCL" in why), why


def test_the_host_policy_figure_is_measured_on_this_cpu_and_judged():
    """The one figure of the device check that needs no GPU: it runs here as it will there."""
    dc = load()
    fig = {}
    dc.bench_host_policy(fig)
    hp = fig["host_policy_update_4096x4_us"]
    assert hp["own_rank"]["n"] == 300 and hp["update_reference"]["n"] == 300
    assert hp["kernel_ran"] and hp["own_rank"]["p50"] > 0 and hp["update_reference"]["p50"] > 0
    verdict = dc.verdicts(fig)["host_policy_update_4096x4"]
    assert verdict.startswith(("met", "missed")) and hp["cpu"] in verdict


def test_the_check_goes_on_past_a_hung_phase_and_writes_every_figure(tmp_path, monkeypatch):
    """The whole check with CUDA's part stood in for (the GPU's name, the tests, the phases'
    bodies): a phase that hangs is killed at its deadline and named, the phases after it
    run, and the result files hold every figure measured, the hung phase's first one too."""
    import faulthandler
    import json

    dc = load()
    q = {"p20": 1.0, "p50": 2.0, "p80": 3.0, "p99": 4.0, "n": 9}
    row = {"per_collective_us": q, "plain_step_us": q, "paced_step_us": q}
    # a quantile of no sample is NaN, read back from the phase's strict JSON as null
    nan_row = str({k: {**q, "p20": float("nan")} for k in row}).replace("nan", "float('nan')")
    bodies = {"tick_and_spin": "fig['timer_tick_ns'] = 32.0\n",
              "overhead": f"fig['overhead'] = {{'eager_1_sites': {row}}}\ntime.sleep(60)\n",
              "syncs": "fig['host_syncs_per_step'] = 0.0\n",
              "tail_graph": f"fig['overhead'] = {{'tail_graph_eager_1_sites': {nan_row}}}\n"}
    _stand_in_phase(dc, monkeypatch, bodies)
    monkeypatch.setattr(dc, "PHASE_LIMIT_S", 4.0)
    for name, value in (("gpu_missing", None), ("ensure_installed", False),
                        ("bench_missing", None)):
        monkeypatch.setattr(dc, name, lambda *a, v=value: v)
    monkeypatch.setattr(dc, "machine", lambda: {"gpu": "Test GPU", "date": "2026-01-01T00:00Z",
                                                "torch": "2", "triton": "3", "cupy": "13"})
    monkeypatch.setattr(dc, "run_tests", lambda *a: {"returncode": 0, "seconds": 1.0,
                                                     "passed": 3, "failed": 0, "skipped": 0,
                                                     "errors": 0})
    monkeypatch.setattr(dc, "bench_host_policy", lambda fig: fig.update(host_policy="ran"))
    monkeypatch.setattr(dc, "run_launch_cost", lambda *a: {"ran": True, "returncode": 0})
    monkeypatch.setenv("GPUPACE_CHECK_RESTARTED", "0")
    monkeypatch.delenv("GPUPACE_CHECK_T0", raising=False)
    try:
        rc = dc.main(["--out", str(tmp_path), "--no-suite", "--budget", "120"])
    finally:
        faulthandler.cancel_dump_traceback_later()  # main's watchdog, armed for the budget
    res = json.loads((tmp_path / "2026-01-01-test-gpu.json").read_text())
    assert rc == 1 and res["last_phase"] == "done"
    assert res["bench_errors"] == {"overhead": "killed at its deadline of 4 s (hung or slow; its "
                                               "stacks are in the log)"}
    assert res["figures"] == {"host_policy": "ran", "timer_tick_ns": 32.0,
                              "host_syncs_per_step": 0.0,
                              "overhead": {"eager_1_sites": row, "tail_graph_eager_1_sites": {
                                  k: {**q, "p20": None} for k in row}}}
    assert res["verdicts"]["eager_overhead_us"].startswith("not measured in full")
    text = (tmp_path / "2026-01-01-test-gpu.md").read_text()
    assert "INCOMPLETE" not in text and "| tail_graph_eager_1_sites | - | 2.00 |" in text
