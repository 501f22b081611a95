"""`gpupace doctor`: which backends this machine supports and, for each missing one, why; the
versions that matter (torch, CUDA, NCCL, triton, cupy) and, on a GPU, the measured tick of the
device clock the device backend stamps with."""

from __future__ import annotations

import argparse
import json
import os
import platform
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from .backends import blocking_wait_note
from .config import env_errors, unknown_env


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--no-tick", action="store_true",
                        help="skip measuring the GPU timer tick (it compiles a small kernel)")


def _version(module: str) -> tuple[str | None, str | None]:
    """(version, None) when `module` imports, else (None, why)."""
    try:
        mod = __import__(module)
    except Exception as e:  # a broken install raises more than ImportError
        return None, f"{type(e).__name__}: {e}"
    return str(getattr(mod, "__version__", "unknown")), None


def collect(measure_tick: bool = True) -> dict[str, Any]:
    """Everything the doctor reports, as a dict (the JSON output)."""
    import torch
    import torch.distributed as dist

    from . import __version__
    from .backends import device_backend_missing

    info: dict[str, Any] = {"gpupace": __version__, "python": platform.python_version(),
                            "torch": torch.__version__,
                            "torch_cuda": torch.version.cuda, "cuda_available": False,
                            "gpus": [], "nccl": None}
    cuda = torch.cuda.is_available()
    info["cuda_available"] = cuda
    if cuda:
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        try:
            v = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except Exception as e:  # an old or odd build: report it
            info["nccl"] = f"unavailable ({type(e).__name__})"
    for mod in ("triton", "cupy"):
        info[mod], info[f"{mod}_error"] = _version(mod)

    backends: dict[str, dict[str, Any]] = {}
    if dist.is_available():
        gloo = dist.is_gloo_available()
        backends["host"] = {"supported": True, "why_not": None,
                            "note": "gloo " + ("available" if gloo else "missing: only "
                                               "single-process or NCCL groups")}
    else:
        backends["host"] = {"supported": True, "why_not": None,
                            "note": "torch.distributed unavailable: single process only"}
    why = device_backend_missing()
    if why is None and not (dist.is_available() and dist.is_nccl_available()):
        why = "this torch build has no NCCL; the device backend paces NCCL groups"
    backends["device"] = {"supported": why is None, "why_not": why}
    info["backends"] = backends

    from gpupace.kernels.launch import direct_wanted  # no triton import: safe without it

    from .backends.tail import tail_graph_wanted

    # The device backend's launch switches, as this environment sets them, and every setting
    # of it that a Pacer would refuse or ignore: all of them, not the first.
    info["settings_errors"] = errors = []
    info["direct_launch"] = _setting(direct_wanted, True, errors)
    info["tail_graph"] = _setting(tail_graph_wanted, False, errors)
    with warnings.catch_warnings():  # an unknown name's warning: among the errors below
        warnings.simplefilter("ignore")
        errors += env_errors()
    if unknown := unknown_env(os.environ):
        errors.append(f"unknown environment variables {unknown}: a Pacer ignores them")
    if why := telemetry_path_problem(os.environ.get("GPUPACE_TELEMETRY_PATH", "")):
        errors.append(why)
    info["warnings"] = warnings_for(os.environ)

    info["timer_tick_ns"] = None
    if cuda and measure_tick and info["triton"]:
        try:
            from gpupace.kernels.clock import measure_tick as tick

            info["timer_tick_ns"] = tick()
        except Exception as e:  # report it, do not crash the doctor
            info["timer_tick_error"] = f"{type(e).__name__}: {e}"
    return info


def telemetry_path_problem(path: str) -> str | None:
    """Why a Pacer could not write the telemetry file GPUPACE_TELEMETRY_PATH names (rank 0's),
    or None: it would warn and train on without the file, and the run's telemetry be lost."""
    if not path:
        return None
    from .cli import check_output_file
    from .config import fill_rank
    from .telemetry import names_a_folder

    if names_a_folder(path) or os.path.isdir(fill_rank(path, 0)):
        return (f"GPUPACE_TELEMETRY_PATH={path!r} is a folder: a Pacer writes a file, "
                "e.g. run.{rank}.jsonl in it, and would write none")
    try:
        check_output_file("GPUPACE_TELEMETRY_PATH", fill_rank(path, 0))
    except ValueError as e:
        return f"{e}: a Pacer would write no telemetry"
    return None


def _setting(read: Callable[[], Any], default: Any, errors: list[str]) -> Any:
    """`read()`, or `default` with its ValueError's message added to `errors`."""
    try:
        return read()
    except ValueError as e:
        errors.append(str(e))
        return default


def warnings_for(env: Mapping[str, str]) -> list[str]:
    """Settings of this environment that work against pacing."""
    out = []
    if env.get("CUDA_DEVICE_MAX_CONNECTIONS", "").strip() == "1":
        out.append("CUDA_DEVICE_MAX_CONNECTIONS=1 (Megatron's setting): every stream shares one "
                   "hardware queue, so compute queued after a paced collective may wait behind "
                   "its spin-wait, and the delay meant for the collective holds back compute "
                   "too; and each async paced collective (a DDP bucket) queues its exit stamp "
                   "behind the collective's end, so the backward compute issued after it may "
                   "wait for the collective: the overlap of compute and communication is lost "
                   "(not yet measured on a GPU)")
    if note := blocking_wait_note(env):  # said by the engine as well, on a multi-rank group
        out.append(note.removeprefix("gpupace: "))
    return out


def format_text(info: dict[str, Any]) -> str:
    lines = ["gpupace doctor", ""]
    for name, b in info["backends"].items():
        status = "supported" if b["supported"] else f"not supported: {b['why_not']}"
        note = f" ({b['note']})" if b.get("note") else ""
        lines.append(f"  backend {name:<7} {status}{note}")
    lines.append("")
    gpus = ", ".join(info["gpus"]) or "none"
    # The device backend's settings, said to be moot where it cannot run
    device = info["backends"].get("device", {})
    moot = "" if device.get("supported") else "; moot here: no device backend"
    rows = [("gpupace", info["gpupace"]), ("python", info["python"]), ("torch", info["torch"]),
            ("CUDA (torch build)", info["torch_cuda"] or "none (CPU build)"),
            ("CUDA available", "yes" if info["cuda_available"] else "no"), ("GPUs", gpus),
            ("NCCL", info["nccl"] or "n/a"),
            ("triton", info["triton"] or f"missing ({info['triton_error']})"),
            ("cupy", info["cupy"] or f"missing ({info['cupy_error']})"),
            ("device launches", ("direct, after each kernel's first call" if info["direct_launch"]
                                 else "through Triton's JIT (GPUPACE_DIRECT_LAUNCH=0)") + moot),
            ("eager tail graph", ("on (GPUPACE_TAIL_GRAPH=1)" if info["tail_graph"]
                                  else "off (GPUPACE_TAIL_GRAPH=1 turns it on)") + moot)]
    tick = info.get("timer_tick_ns")
    if tick is not None:
        rows.append(("GPU timer tick", f"{tick:.0f} ns (measured)"))
    elif info.get("timer_tick_error"):
        rows.append(("GPU timer tick", f"not measured: {info['timer_tick_error']}"))
    else:
        rows.append(("GPU timer tick", "not measured (no GPU)" if not info["cuda_available"]
                     else "not measured"))
    width = max(len(k) for k, _ in rows)
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    lines += [f"\n  warning: {w}" for w in info.get("warnings", [])]
    lines += [f"\n  error in the settings: {e}" for e in info.get("settings_errors", [])]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    info = collect(measure_tick=not args.no_tick)
    print(json.dumps(info, indent=2) if args.json else format_text(info))
    return 1 if info["settings_errors"] else 0
