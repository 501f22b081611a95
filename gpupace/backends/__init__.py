"""Backends time the sites, apply the delays and run the per-step update. `host` works on any
process group; `device` (CUDA groups, Triton and CuPy) keeps the whole loop on the GPU."""

from __future__ import annotations

BACKENDS = ("auto", "host", "device")


def device_backend_missing() -> str | None:
    """Why the device backend cannot run here, or None when it can."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "CUDA is not available (torch.cuda.is_available() is False)"
    for mod in ("triton", "cupy"):
        try:
            __import__(mod)
        except ImportError:
            return (f"{mod} is not installed: pip install 'gpupace[cuda12]' "
                    f"(or 'gpupace[cuda13]' for CUDA 13)")
    return None


def gather_rows(out, row, group) -> None:
    """all_gather of one row per rank into one preallocated buffer (flat, or [N, W] where the
    backend takes it): torch 2.13 renamed all_gather_into_tensor, deprecated there, to
    all_gather_single."""
    import torch.distributed as dist

    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, row, group=group)
