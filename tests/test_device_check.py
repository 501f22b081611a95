"""The prepared device check on a machine without CUDA: it must say why it skips, write
nothing and exit 0. Its result writer is checked on a made-up result (no figure of it is
reported anywhere)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

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
    dc = load()
    assert dc.main(["--out", str(tmp_path / "res")]) == 0
    assert "SKIP" in capsys.readouterr().out
    assert not (tmp_path / "res").exists()


def test_command_line_skips_cleanly_without_cuda(tmp_path):
    if torch.cuda.is_available():
        return  # on a GPU the command runs for real; the device check itself covers that
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "res")],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "SKIP" in p.stdout and "no CUDA" in p.stdout
    assert not (tmp_path / "res").exists()


def test_result_files_and_verdicts(tmp_path):
    dc = load()
    q = {"p20": 1.0, "p50": 2.0, "p80": 3.0, "p99": 4.0, "n": 9}
    fig = {"timer_tick_ns": 32.0, "host_syncs_per_step": 0.0,
           "spin_error_us": q | {"by_delay": {"5.0": q}},
           "overhead": {"graph_1_sites": {"per_collective_us": q, "plain_step_us": q,
                                          "paced_step_us": q},
                        "eager_1_sites": {"per_collective_us": q | {"p50": 20.0},
                                          "plain_step_us": q, "paced_step_us": q}}}
    v = dc.verdicts(fig)
    assert v["graph_overhead_us"].startswith("met")
    assert v["eager_overhead_us"].startswith("missed")
    assert v["spin_error_p99"].startswith("missed")  # 4 us > 0.032 + 1
    assert dc.verdicts({})["graph_overhead_us"] == "not measured"
    res = {"stem": "2026-01-01-test-gpu", "figures": fig, "verdicts": v,
           "machine": {"gpu": "Test GPU", "date": "2026-01-01T00:00:00Z"},
           "tests": {"passed": 1, "failed": 0, "errors": 0, "skipped": 0, "seconds": 1.0},
           "bench_suite": {"ran": False}}
    j, md = dc.write_results(res, tmp_path)
    assert j.name == "2026-01-01-test-gpu.json" and md.suffix == ".md"
    text = md.read_text()
    assert "Test GPU" in text and "| graph_1_sites | 1.00 | 2.00 | 3.00 |" in text
    assert dc.slug("NVIDIA H200") == "nvidia-h200"
