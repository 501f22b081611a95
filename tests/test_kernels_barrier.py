"""The virtual cluster's barrier kernel on the CPU under TRITON_INTERPRET=1 (clock-free path):
it passes once every rank has arrived, and a barrier nobody else reaches times out and raises
its flag instead of spinning forever. Plus the virtual cluster's own checks that need no GPU."""

from __future__ import annotations

import pytest
import torch


def test_barrier_passes_when_all_have_arrived(k):
    count = torch.tensor([2], dtype=torch.int32)  # two of three ranks already there
    flag = torch.zeros(1, dtype=torch.int32)
    clk = torch.tensor([0, 1000], dtype=torch.int64)
    k["barrier"].barrier(count, 3, flag, clk, ctas=3, timeout_us=10.0)
    assert count.item() == 3 and flag.item() == 0  # one arrival per launch, not per CTA


def test_barrier_times_out_instead_of_hanging(k):
    count = torch.zeros(1, dtype=torch.int32)
    flag = torch.zeros(1, dtype=torch.int32)
    clk = torch.tensor([0, 1000], dtype=torch.int64)
    k["barrier"].barrier(count, 5, flag, clk, ctas=2, timeout_us=20.0, fake_tick=1000)
    assert count.item() == 1 and flag.item() == 1


def test_barrier_stops_when_its_clock_stalls(k):
    """A clock that never advances (fake tick 0) never reaches the timeout: the poll bound
    ends the wait, and the flag says it did not complete."""
    count = torch.zeros(1, dtype=torch.int32)
    flag = torch.zeros(1, dtype=torch.int32)
    clk = torch.tensor([0, 1000], dtype=torch.int64)
    k["barrier"].barrier(count, 5, flag, clk, timeout_us=1e6, max_polls=50, fake_tick=0)
    assert count.item() == 1 and flag.item() == 1


def test_barrier_checks_arguments(k):
    one = torch.zeros(1, dtype=torch.int32)
    clk = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="ctas"):
        k["barrier"].barrier(one, 1, one, clk, ctas=0)
    with pytest.raises(ValueError, match="timeout"):
        k["barrier"].barrier(one, 1, one, clk, timeout_us=0.0)
    with pytest.raises(ValueError, match="warps"):
        k["barrier"].barrier(one, 1, one, clk, warps=3)


def test_virtual_cluster_needs_cuda():
    from gpupace.vcluster import VirtualCluster

    if torch.cuda.is_available():
        pytest.skip("CUDA is here: the GPU tests cover the cluster")
    with pytest.raises(RuntimeError, match="CUDA"):
        VirtualCluster(4)
