"""`gpupace doctor` on this machine: it lists every backend and says why one is missing."""

from __future__ import annotations

import json

import torch

from gpupace.cli import main


def test_doctor_text_names_backends_and_reasons(capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "backend host" in out and "backend device" in out
    assert "torch" in out and "triton" in out and "cupy" in out
    if not torch.cuda.is_available():
        assert "not supported: CUDA is not available" in out
        assert "not measured (no GPU)" in out
        # the device backend's settings, where it cannot run: said to be moot
        launches = next(ln for ln in out.splitlines() if "device launches" in ln)
        assert launches.endswith("; moot here: no device backend"), launches


def test_doctor_json(capsys):
    assert main(["doctor", "--json", "--no-tick"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["backends"]["host"]["supported"] is True
    device = info["backends"]["device"]
    assert device["supported"] is (device["why_not"] is None)
    assert info["torch"] == torch.__version__
    assert info["timer_tick_ns"] is None  # --no-tick


def test_doctor_reports_a_missing_package(capsys, monkeypatch):
    import sys

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "cupy", None)
    assert main(["doctor", "--json", "--no-tick"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cupy"] is None and "cupy" in info["cupy_error"]


def test_doctor_says_how_the_device_backend_launches(capsys, monkeypatch):
    monkeypatch.delenv("GPUPACE_DIRECT_LAUNCH", raising=False)
    monkeypatch.delenv("GPUPACE_TAIL_GRAPH", raising=False)
    assert main(["doctor", "--no-tick"]) == 0
    out = capsys.readouterr().out
    assert "direct, after each kernel's first call" in out and "off (GPUPACE_TAIL_GRAPH=1" in out
    monkeypatch.setenv("GPUPACE_DIRECT_LAUNCH", "0")
    monkeypatch.setenv("GPUPACE_TAIL_GRAPH", "1")
    assert main(["doctor", "--json", "--no-tick"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["direct_launch"] is False and info["tail_graph"] is True
    monkeypatch.setenv("GPUPACE_TAIL_GRAPH", "yes")  # a switch takes 0 or 1, nothing else
    assert main(["doctor", "--no-tick"]) == 1
    assert "GPUPACE_TAIL_GRAPH must be 0 or 1, got 'yes'" in capsys.readouterr().out


def test_doctor_lists_every_bad_setting_and_fails(capsys, monkeypatch):
    bad = (("GPUPACE_DIRECT_LAUNCH", "maybe"), ("GPUPACE_GAIN", "abc"),
           ("GPUPACE_MAX_SITES", "x"), ("GPUPACE_TELEMETRY_EVERY", "y"),
           ("GPUPACE_MODE", "bogus"), ("GPUPACE_MAX_SITE", "8"))  # a typo of ..._MAX_SITES
    for name, value in bad:
        monkeypatch.setenv(name, value)
    assert main(["doctor", "--json", "--no-tick"]) == 1
    errors = json.loads(capsys.readouterr().out)["settings_errors"]
    assert len(errors) == 6, errors  # each once
    assert "GPUPACE_DIRECT_LAUNCH must be 0 or 1, got 'maybe'" in errors[0]
    assert "GPUPACE_GAIN must be a number, got 'abc'" in errors[1]
    assert "GPUPACE_TELEMETRY_EVERY must be an integer, got 'y'" in errors[2]  # field order
    assert "GPUPACE_MAX_SITES must be an integer, got 'x'" in errors[3]
    assert "mode must be one of" in errors[4] and "GPUPACE_MODE='bogus'" in errors[4]
    assert "unknown environment variables ['GPUPACE_MAX_SITE']" in errors[5]
    for name, _ in bad:
        monkeypatch.delenv(name)
    assert main(["doctor", "--json", "--no-tick"]) == 0
    assert json.loads(capsys.readouterr().out)["settings_errors"] == []
    # values that parse but are out of range: every one named (a PaceConfig names the first),
    # and two that pass alone but not together
    for name, value in (("GPUPACE_MODE", "bogus"), ("GPUPACE_GAIN", "7"),
                        ("GPUPACE_TELEMETRY_EVERY", "0")):
        monkeypatch.setenv(name, value)
    assert main(["doctor", "--json", "--no-tick"]) == 1
    errors = json.loads(capsys.readouterr().out)["settings_errors"]
    assert [e.split()[0] for e in errors] == ["mode", "gain", "telemetry_every"], errors
    for name in ("GPUPACE_MODE", "GPUPACE_GAIN", "GPUPACE_TELEMETRY_EVERY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("GPUPACE_RELEASE_US", "150")
    monkeypatch.setenv("GPUPACE_THRESHOLD_US", "100")
    assert main(["doctor", "--json", "--no-tick"]) == 1
    (error,) = json.loads(capsys.readouterr().out)["settings_errors"]
    assert "release_us" in error and "got 150" in error, error
    # a pair that is fine together is no error (each checked against the other's default,
    # threshold 50 was refused beside the default release of 100)
    monkeypatch.setenv("GPUPACE_RELEASE_US", "40")
    monkeypatch.setenv("GPUPACE_THRESHOLD_US", "50")
    assert main(["doctor", "--json", "--no-tick"]) == 0
    assert json.loads(capsys.readouterr().out)["settings_errors"] == []


def test_doctor_warns_when_all_streams_share_one_queue(capsys, monkeypatch):
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    assert main(["doctor", "--no-tick"]) == 0
    assert "warning: CUDA_DEVICE_MAX_CONNECTIONS=1" in capsys.readouterr().out
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "8")
    assert main(["doctor", "--json", "--no-tick"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []
    # NCCL's blocking wait stalls the host at every paced DDP bucket: said by the engine alone
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "1")
    assert main(["doctor", "--no-tick"]) == 0
    assert "warning: TORCH_NCCL_BLOCKING_WAIT=1 makes NCCL's work.wait() block the host" \
        in capsys.readouterr().out


def test_doctor_names_a_telemetry_path_a_pacer_could_not_write(capsys, monkeypatch, tmp_path):
    """A folder or a path under a file: the Pacer warns and trains on without its telemetry,
    and the doctor said nothing (a review)."""
    for path, said in ((str(tmp_path), "is a folder"),
                       (str(tmp_path / "f.txt" / "run.jsonl"), "not a writable directory")):
        (tmp_path / "f.txt").write_text("a file")
        monkeypatch.setenv("GPUPACE_TELEMETRY_PATH", path)
        assert main(["doctor", "--json", "--no-tick"]) == 1
        (error,) = json.loads(capsys.readouterr().out)["settings_errors"]
        assert "GPUPACE_TELEMETRY_PATH" in error and said in error, error
    monkeypatch.setenv("GPUPACE_TELEMETRY_PATH", str(tmp_path / "run.{rank}.jsonl"))
    assert main(["doctor", "--json", "--no-tick"]) == 0
