"""On a GPU, run last: a paced collective reached inside a CUDA graph capture before
`pacer.warmup()` raises a clear WarmupError rather than failing inside CUDA; a host-backend
pacer warns at warmup() and refuses a capture, naming backend='device'. Both captures are
refused before anything is launched into them."""

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


def test_zz_a_host_backend_pacer_warns_at_warmup_and_refuses_a_capture(nccl_group):
    pacer = Pacer(PaceConfig(mode="pace", max_sites=4), nccl_group, backend="host")
    x = torch.zeros(16, device="cuda")
    pacer.all_reduce(x)
    pacer.step()
    with pytest.warns(RuntimeWarning, match="does nothing on the host backend.*backend='device'"):
        pacer.warmup()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="cannot capture it"):
        with torch.cuda.graph(g, stream=s):
            pacer.all_reduce(x)
    torch.cuda.synchronize()
    pacer.all_reduce(x)  # no site left counted: eager steps go on
    assert pacer.step() is not None and pacer.site_names == ["all_reduce"]
