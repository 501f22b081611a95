"""Backends time the sites, apply the delays and run the per-step update. `host` works on any
process group; `device` (CUDA groups, Triton and CuPy) keeps the whole loop on the GPU."""

from __future__ import annotations

import contextlib

BACKENDS = ("auto", "host", "device")
# The most ranks a group the device backend takes: its reduction sorts the ranks' arrivals in
# one thread block (kernels/reduce.py's MAX_SORT; a test holds them equal).
DEVICE_MAX_RANKS = 8192
# What an engine's `issue()` returns where a collective needs no setup: one shared instance,
# since it runs once a paced collective.
NO_FORK = contextlib.nullcontext()


def group_backend(group) -> str:
    """The backend of `group` as the pacer needs it: "nccl" when its collectives on CUDA
    tensors run on NCCL (an "nccl" group; a mixed one, "cpu:gloo,cuda:nccl"; or one made
    without naming a backend on a machine with CUDA, which torch calls "undefined" and gives
    gloo for CPU tensors and NCCL for CUDA ones), else its name ("gloo", "mpi", ...)."""
    import torch
    import torch.distributed as dist

    name = str(dist.get_backend(group)).lower()
    if "nccl" in name or (name == "undefined" and torch.cuda.is_available()):
        return "nccl"
    return name


def cuda_device(group):
    """The CUDA device of this rank's NCCL collectives on `group` (None: the default group),
    as torch picks it: the device the group was bound to (`init_process_group(device_id=...)`),
    else the current one. Without either, every rank of a node would be on cuda:0: set the
    device first, `torch.cuda.set_device(local_rank)`. A bound device covers a job that
    passed `device_id` and never called set_device."""
    import torch
    import torch.distributed as dist

    bound = getattr(group if group is not None else dist.group.WORLD, "bound_device_id", None)
    if bound is not None:
        return torch.device(bound)
    return torch.device("cuda", torch.cuda.current_device())


def off_current_device(device, where: str) -> str | None:
    """Why the device backend cannot run on the CUDA `device` (`where`: what put it there),
    or None: Triton and CuPy launch on the current device, the collectives on the group's;
    apart, the stamps would time another GPU's stream, or the kernels read another GPU's
    buffers (an illegal address)."""
    import torch

    current = torch.cuda.current_device()
    if device.type != "cuda" or device.index == current:
        return None
    return (f"gpupace: {where} {device} but the current CUDA device is cuda:{current}; call "
            f"torch.cuda.set_device({device.index}) before making the Pacer")


def device_backend_blocked(pg_backend: str, world_size: int) -> str | None:
    """Why the device backend cannot pace a group of `world_size` ranks on `pg_backend`
    ("none": no process group) here, or None when it can."""
    if why := device_backend_missing() or too_many_ranks(world_size):
        return why
    if pg_backend not in ("nccl", "none"):
        return f"it needs a CUDA (nccl) process group, this one is {pg_backend!r}"
    return None


def device_backend_missing() -> str | None:
    """Why the device backend cannot run here, or None when it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "CUDA is not available (torch.cuda.is_available() is False)"
    try:
        import triton  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a broken install raises more than ImportError
        return _not_importable("triton", e)
    return cupy_missing()


def too_many_ranks(world_size: int) -> str | None:
    """Why the device backend cannot pace a group of `world_size` ranks, or None when it can."""
    if world_size <= DEVICE_MAX_RANKS:
        return None
    return (f"the device backend paces groups of at most {DEVICE_MAX_RANKS} ranks (its "
            f"reduction sorts them in one thread block), this one has {world_size}")


def _not_importable(module: str, error: BaseException) -> str:
    """Why `module` did not import: not installed, or installed and broken (its error)."""
    install = "pip install 'gpupace[cuda12]' (or 'gpupace[cuda13]' for CUDA 13)"
    if isinstance(error, ModuleNotFoundError) and error.name == module:
        return f"{module} is not installed: {install}"
    return (f"{module} is installed but does not import ({type(error).__name__}: "
            f"{' '.join(str(error).split())}); reinstall it: {install}")


def cupy_missing() -> str | None:
    """Why the CuPy reduction cannot run here, or None. cupy imports without NVRTC (seen:
    cupy 14.2 with no libnvrtc), and the reduction compiles with it: without this check the
    device backend would be picked and fail at its first step."""
    try:
        import cupy  # noqa: F401
    except Exception as e:  # noqa: BLE001 - e.g. a CUDA library it loads at import
        return _not_importable("cupy", e)
    try:
        from cupy_backends.cuda.libs import nvrtc
    except ImportError:  # another layout of cupy: its first compile will tell
        return None
    try:
        nvrtc.getVersion()
    except Exception as e:  # noqa: BLE001 - cupy raises its loader's errors
        error = " ".join(str(e).split())  # cupy's loader ends its message with a newline
        return (f"cupy cannot load NVRTC, which its reduction compiles with ({error}); install "
                "the CUDA toolkit's NVRTC (from PyPI: nvidia-cuda-nvrtc-cu12 for CUDA 12, "
                "nvidia-cuda-nvrtc for CUDA 13)")
    return None


def interpreter_defect() -> str | None:
    """Why Triton's CPU interpreter (TRITON_INTERPRET=1: the device engine's CPU tests) cannot
    run gpupace's kernels here, or None. Before Triton 3.7 it turns a scalar into a loop bound
    or an index with int() of a 1-element array, which NumPy 2 refuses (3.7 squeezes the array
    first). Imports no kernel: a process may set TRITON_INTERPRET after calling it."""
    import numpy as np
    import triton

    major, minor = (int(x) for x in triton.__version__.split(".")[:2])
    if (major, minor) >= (3, 7):
        return None
    try:
        int(np.zeros(1))
    except TypeError:
        return (f"Triton {triton.__version__}'s interpreter cannot run these kernels with NumPy "
                f"{np.__version__} (it calls int() on 1-element arrays; fixed in Triton 3.7)")
    return None


BLOCKING_WAIT_VARS = ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT")


def blocking_wait_note(environ=None) -> str | None:
    """Why the device backend would stall the host here, or None: with NCCL's blocking wait on,
    `work.wait()`, which the engine calls to order its exit stamp after a collective, waits on
    the host instead of ordering streams, and so does the step's synchronous exchange."""
    import os

    env = os.environ if environ is None else environ
    on = [v for v in BLOCKING_WAIT_VARS if env.get(v, "").strip().lower() in ("1", "true", "yes")]
    if not on:
        return None
    return (f"gpupace: {on[0]}={env[on[0]]} makes NCCL's work.wait() block the host, and the "
            "device backend waits on every paced async collective (each DDP bucket, from the "
            "backward pass) and on the step's exchange: the backward no longer overlaps the "
            "communication, and the host pays every collective's time. Unset it for paced runs: "
            "the process group's timeout still holds (NCCL's watchdog aborts a collective "
            "that outlives it, TORCH_NCCL_ASYNC_ERROR_HANDLING's default)")


class ExchangeError(RuntimeError):
    """`Pacer.step()`'s all_gather failed: a timeout, most often, as a rank stepped once more
    or once less than the others; the collective's own error is its cause."""


def exchange_error(e: RuntimeError) -> ExchangeError:
    """What `Pacer.step()`'s failed all_gather says (gloo said "Connection reset by peer" or
    timed out, nothing of the pacer), the likelier cause, a peer gone, first; raise it
    `from e`. A function, not a context manager: an eager device step's host time counts."""
    first = (str(e).splitlines() or [""])[0][:200]
    return ExchangeError(
        "gpupace: pacer.step() is a collective (one all_gather) and it failed: another rank "
        "died or stopped responding (look at the other ranks' logs first), or the ranks did not "
        "all call it once per step, after the same paced collectives "
        f"({type(e).__name__}: {first})")


def gather_rows(out, row, group) -> None:
    """all_gather of one row per rank into one preallocated buffer (flat, or [N, W] where the
    backend takes it): torch 2.13 renamed all_gather_into_tensor, deprecated there, to
    all_gather_single."""
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, row, group=group)
