"""On a GPU, run last: a paced collective reached inside a CUDA graph capture before
`pacer.warmup()` raises a clear WarmupError rather than failing inside CUDA; a host-backend
pacer refuses warmup() and a capture, naming backend='device'."""

from __future__ import annotations

import pytest
import torch

from gpupace import PaceConfig, Pacer

pytestmark = pytest.mark.cupy  # the device backend reduces with CuPy


def test_zz_capture_without_warmup_is_a_clear_error(nccl_group):
    from gpupace.backends.device import WarmupError

    pacer = Pacer(PaceConfig(mode="pace", max_sites=4), nccl_group, backend="device")
    x = torch.zeros(16, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        pacer.all_reduce(x)
        pacer.step()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(WarmupError, match="warmup"):
        with torch.cuda.graph(g):
            pacer.all_reduce(x)
    torch.cuda.synchronize()


def test_zz_a_host_backend_pacer_refuses_warmup_and_a_capture(nccl_group):
    pacer = Pacer(PaceConfig(mode="pace", max_sites=4), nccl_group, backend="host")
    x = torch.zeros(16, device="cuda")
    pacer.all_reduce(x)
    pacer.step()
    with pytest.raises(RuntimeError, match="backend='device'"):
        pacer.warmup()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="cannot capture it"):
        with torch.cuda.graph(g, stream=s):
            pacer.all_reduce(x)
    torch.cuda.synchronize()
