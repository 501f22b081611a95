"""The device engine on two real gloo ranks, on the CPU under TRITON_INTERPRET=1 (set in the
spawned ranks only): one all_gather of the timing rows per step, every rank reaching the same
decisions from the same matrix, and those decisions equal to the NumPy policy's. Each rank
drives the clock-free kernels with a scripted clock: rank 0 arrives 200 us before rank 1."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from gpupace import checkpoint
from gpupace.backends import interpreter_defect  # imports no kernel: the ranks set the flag
from gpupace.launch import run_ranks

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(bool(interpreter_defect()), reason=str(interpreter_defect()))]

ARRIVE_US = (0.0, 200.0)
TRANSFER_US = 50.0
STEP_NS = 10_000_000


def _rank(rank: int, world: int, n_steps: int):
    os.environ["TRITON_INTERPRET"] = "1"  # this spawned process only, before triton loads
    import torch

    from gpupace import PaceConfig, policy
    from gpupace.backends.device import DeviceEngine

    cfg = PaceConfig(mode="pace", warmup_steps=1, on_steps=1, holdoff_factor=0.0,
                     threshold_us=20.0, release_us=10.0, floor_rise=0.5, guard_us=10.0,
                     max_sites=2)
    eng = DeviceEngine(cfg, None, rank, world, device="cpu")
    params = policy.PolicyParams.from_config(cfg, world)
    state = policy.init_state(world, 1)
    seen, agree = [], []
    for step in range(n_steps):
        base = (step + 1) * STEP_NS
        # a rank holds its own delay; the reference, held equal to it below, gives the other's
        d = torch.tensor(state.delay[:, 0])
        d[rank] = eng.state["delay"][0, 0]
        applied_ns = torch.ceil(d * 1000 / 1000) * 1000  # the virtual clock ticks by 1 us
        exit_ns = max(ARRIVE_US[i] * 1000 + float(applied_ns[i]) for i in range(world))
        eng.clk[1] = base + int(ARRIVE_US[rank] * 1000)
        ticket = eng.arrive()
        eng.clk[1] = base + int(exit_ns + TRANSFER_US * 1000)
        eng.exit(ticket)
        eng.end_step(step, 0.0)
        g = eng.gathered.numpy().astype(np.float64).copy()
        seen.append(g)
        state, _ = policy.update_reference(params, state, g[:, 2:3], g[:, 2 + 2:3 + 2], g[:, 1])
        agree.append(np.allclose(eng.state["delay"][0, 0].item(), state.delay[rank, 0],
                                 rtol=1e-4, atol=1e-2))
    return seen, agree, eng.state["delay"][0].numpy().copy(), state.delay.copy()


def test_device_engine_on_two_gloo_ranks():
    results = run_ranks(_rank, 2, 8)
    (seen0, agree0, delay0, ref0), (seen1, agree1, delay1, ref1) = results
    assert all(agree0) and all(agree1)  # each rank's own delay is the reference's, every step
    for g0, g1 in zip(seen0, seen1, strict=True):  # one all_gather: identical matrices
        np.testing.assert_array_equal(np.nan_to_num(g0, nan=-1), np.nan_to_num(g1, nan=-1))
    np.testing.assert_array_equal(ref0, ref1)  # so both ranks' references agree too
    assert delay0[0] > 150.0 and delay1[0] == 0.0  # the early rank is paced
    assert seen0[-1][0, 2 + 2] > 150.0  # and rank 0 applied it


def _issued_collectives(rank: int, world: int, n_steps: int):
    os.environ["TRITON_INTERPRET"] = "1"
    import torch
    import torch.distributed as dist

    from gpupace import PaceConfig
    from gpupace.backends.device import DeviceEngine

    eng = DeviceEngine(PaceConfig(mode="pace", max_sites=2), None, rank, world, device="cpu")

    class Work:  # the collective's own work; its wait moves the virtual clock 7 us on
        def __init__(self, work):
            self.work = work

        def wait(self):
            self.work.wait()
            eng.clk[1] += 7000

    sums, rows = [], []
    for step in range(n_steps):
        t = torch.full((4,), float(rank + 1))
        with eng.issue(sync=False):  # the flow of Pacer.collective(..., async_op=True)
            ticket = eng.arrive()
            work = dist.all_reduce(t, async_op=True)
            eng.leave(ticket, Work(work))
        eng.end_step(step, 0.0)
        sums.append(t.tolist())
        rows.append(eng.gathered.numpy().copy())
    return sums, rows


def test_device_engine_issue_and_leave_around_an_async_collective():
    for sums, rows in run_ranks(_issued_collectives, 2, 3):
        assert all(s == [3.0] * 4 for s in sums)
        for g in rows:
            assert (g[:, 0] == 1).all()  # one site per rank, its exit stamped
            # each rank's wait is the 7 us its work's wait() took: the exit was stamped after it
            np.testing.assert_allclose(g[:, 2], 7.0, rtol=1e-6)


def _exchanges_alone(rank: int, world: int, gather_alone: bool):
    os.environ["TRITON_INTERPRET"] = "1"
    import torch.distributed as dist

    from gpupace import PaceConfig
    from gpupace.backends.device import DeviceEngine

    eng = DeviceEngine(PaceConfig(mode="pace"), None, rank, world, device="cpu")
    eng.gather_alone = gather_alone
    calls, real = [], dist.all_gather

    def counted(*args, **kwargs):  # the real all_gather, counted
        calls.append(1)
        return real(*args, **kwargs)

    dist.all_gather = counted
    try:
        for step in range(3):
            ticket = eng.arrive()
            eng.clk[1] += 5000  # the collective took 5 us of the virtual clock
            eng.exit(ticket)
            eng.end_step(step, 0.0)
    finally:
        dist.all_gather = real
    return len(calls), eng.gathered.numpy().copy()


@pytest.mark.parametrize("gather_alone", [False, True])
def test_one_rank_exchanges_by_copy_or_by_all_gather_for_the_benchmarks(gather_alone):
    """At world size 1 the exchange is a copy; the benchmarks set `gather_alone` so that the
    time they report per paced collective includes the all_gather a step of many ranks pays."""
    ((calls, gathered),) = run_ranks(_exchanges_alone, 1, gather_alone)
    assert calls == (3 if gather_alone else 0)
    assert gathered[0, 0] == 1 and gathered[0, 2] == pytest.approx(5.0)  # the row: one site, its wait


def _disagreeing_device_sites(rank: int, world: int):
    os.environ["TRITON_INTERPRET"] = "1"
    import warnings

    from gpupace import PaceConfig
    from gpupace.backends.device import DeviceEngine

    eng = DeviceEngine(PaceConfig(mode="pace", max_sites=2), None, rank, world, device="cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(5):
            # nobody paces any at step 1 (an empty step, which the Pacer tells of: no
            # disagreement); rank 1 paces one more at step 3
            sites = {1: 0, 3: 2 if rank == 1 else 1}.get(step, 1)
            for _ in range(sites):
                ticket = eng.arrive()
                eng.clk[1] += 5000
                eng.exit(ticket)
            eng.end_step(step, 0.0)
        records = [r.step for r in eng.drain()]
    return records, [str(w.message) for w in caught]


def test_ranks_that_disagree_on_their_device_sites_are_told_and_that_step_left_out():
    """As on the host: a step whose ranks paced different numbers of sites has no record, and
    it is said once (the device engine skipped it without a word)."""
    for records, warned in run_ranks(_disagreeing_device_sites, 2):
        assert records == [0, 2, 4]
        assert len(warned) == 1, warned
        assert "different numbers of paced sites in step 3" in warned[0]
        assert "neither paced nor recorded" in warned[0]


def _state_carried_over(rank: int, world: int):
    os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from gpupace import PaceConfig, checkpoint
    from gpupace.backends.device import DeviceEngine
    from gpupace.backends.host import HostEngine

    # The holdoff: 6 calm steps for each rank that has been last (rank 1 alone), before rank
    # 0's floor may rise.
    cfg = PaceConfig(mode="pace", warmup_steps=1, on_steps=1, holdoff_factor=6.0,
                     threshold_us=20.0, release_us=10.0, floor_rise=0.5, guard_us=10.0,
                     max_sites=2)

    def run(eng, steps: int) -> list[float]:
        """Steps of one site: rank 0 arrives 200 us before rank 1, and both leave 50 us after
        rank 1's arrival (rank 0's delay, below 200 us, changes no exit). The next delays."""
        delays = []
        for step in range(steps):
            base = (step + 1) * STEP_NS
            eng.clk[1] = base + int(ARRIVE_US[rank] * 1000)
            ticket = eng.arrive()
            eng.clk[1] = base + int((ARRIVE_US[1] + TRANSFER_US) * 1000)
            eng.exit(ticket)
            eng.end_step(step, 0.0)
            delays.append(float(eng.state["delay"][0, 0]))
        return delays

    def engine():
        return DeviceEngine(cfg, None, rank, world, device="cpu")

    first = engine()
    learnt = run(first, 12)
    saved = checkpoint.gather(first.policy_state(), steps=12, world_size=world, group=None,
                              device=torch.device("cpu"))
    own = first.policy_state()
    loaded, fresh, host = engine(), engine(), HostEngine(cfg, None, rank, world)
    for eng in (loaded, host, first):  # `first`: a load into a running engine
        eng.load_policy_state(checkpoint.unpack(saved, world_size=world, max_sites=2))
    planned = first.state["delay"][0].tolist()  # what its next step would apply
    # A host's int64 counter past the device's int32: held at CALM_MAX, not wrapped
    counted = checkpoint.unpack(saved, world_size=world, max_sites=2)
    counted["calm"] += 3_000_000_000
    clipped = engine()
    clipped.load_policy_state(counted)
    return (learnt, saved, own, loaded.policy_state(), host.policy_state(),
            first.state["counter"][0].tolist(), run(loaded, 3), run(fresh, 3), run(first, 2),
            planned, int(clipped.state["calm"][0, 0]))


def test_a_saved_device_state_is_taken_over_by_a_new_engine_of_either_backend():
    """What a checkpoint carries: the device engine's state, gathered from both ranks, taken
    over by a new device engine and by a host engine, each rank its own; after the load the
    warm-up runs again (one step) and the early rank is paced at once, where a new engine
    waits out the holdoff."""
    results = run_ranks(_state_carried_over, 2)
    saved = results[0][1]
    for name in checkpoint.FIELDS:
        assert torch.equal(saved[name], results[1][1][name]), name  # the same on both ranks
    assert saved["world_size"] == 2 and saved["sites"] == 1
    assert saved["last_seen"].tolist() == [[False], [True]]  # rank 1, always last
    assert saved["calm"][0, 0] >= 6 and saved["floor"][0, 0] > 100.0  # rank 0 held off, then paced
    for rank, (learnt, _, own, loaded, host, counter, after, fresh, again, planned,
               clipped) in enumerate(results):
        assert planned == [0.0, 0.0]  # a load plans no delay
        assert clipped == 1 << 30  # kernels.update.CALM_MAX
        for name, value in own.items():
            np.testing.assert_array_equal(value, saved[name][rank] if saved[name].ndim == 2
                                          else saved[name].numpy(), err_msg=name)
            np.testing.assert_array_equal(loaded[name], value, err_msg=name)
            np.testing.assert_array_equal(host[name], value, err_msg=name)
        # A running engine's policy step count goes back to 0: the warm-up runs again.
        assert counter == [12, 0, 1]
        if rank == 0:
            assert learnt[:6] == [0.0] * 6 and learnt[-1] > 100.0  # the holdoff, then paced
            assert after[0] == 0.0 and after[1] > 100.0  # the warm-up step, then paced at once
            assert fresh == [0.0] * 3  # a new engine holds off
            assert again[0] == 0.0 and again[1] > 100.0
        else:
            assert max(learnt + after + fresh + again) == 0.0  # the last arrival: never delayed

