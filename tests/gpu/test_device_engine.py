"""On a GPU: the device backend end to end. Zero host syncs per step, a single-rank NCCL
all_reduce paced inside a CUDA graph, the exchange's all_gather eager and captured, capture once and replay 200 times with injected skew
while the delays adapt, a DDP step paced by the hook captured and replayed. The capture without warm-up is in test_zz_capture_error.py, last,
as a failed capture is not something to run other tests after. Skipped without CUDA."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from gpupace import PaceConfig, Pacer

pytestmark = pytest.mark.cupy  # the device backend reduces with CuPy


def paced_config(**kw):
    base = dict(mode="pace", warmup_steps=1, on_steps=1, holdoff_factor=0.0, threshold_us=20.0,
                release_us=10.0, gain=1.0, guard_us=5.0, floor_rise=0.25, max_sites=4)
    base.update(kw)
    return PaceConfig(**base)


def test_auto_picks_device_for_nccl(nccl_group):
    pacer = Pacer(paced_config(), nccl_group)
    assert pacer.backend == "device"


def test_zero_host_syncs_per_step(nccl_group, figures):
    import torch.distributed as dist

    pacer = Pacer(paced_config(), nccl_group, backend="device")
    x = torch.ones(1024, device="cuda")
    for _ in range(3):  # compile, NCCL init, pinned buffers: outside the checked loop
        pacer.all_reduce(x)
        pacer.step()
    torch.cuda.synchronize()
    steps = 40
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(steps):
                pacer.all_reduce(x)
                with pacer.site("second"):
                    dist.all_reduce(x)
                pacer.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    figures["host_syncs_per_step"] = len(syncs) / steps
    eng = pacer._engine  # after their first calls, the hot path's launches skip the JIT
    hots = [eng._enter.hot, eng._exit.hot, eng._finish, eng._update.hot]
    figures["direct_launch"] = [h.direct for h in hots]
    figures["launch_path"] = [h.path for h in hots]  # "run": pointers as integers, no hooks
    assert all(figures["direct_launch"])
    assert not syncs, [str(w.message) for w in syncs[:3]]
    torch.cuda.set_sync_debug_mode("error")  # and the strict mode the issue names
    try:
        for _ in range(5):
            pacer.all_reduce(x)
            pacer.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    records = pacer._engine.drain()
    assert records and all(r.step_time_us > 0 for r in records[1:])
    phases = pacer._engine.phase_times()  # eager CUDA-event timing, sampled steps
    assert phases and all(p["collective_us"] > 0 for p in phases)
    assert any(p["compute_us"] == p["compute_us"] for p in phases)  # a timed step had a start


def _warm_and_capture(pacer, step, zero=()):
    """Two eager `step()`s and the pacer's warm-up on a side stream, the tensors of `zero`
    zeroed, then one step captured on that stream. Returns the graph and the device's step
    counter before it."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # eager steps: NCCL initialised, kernels compiled
            step()
        pacer.warmup()  # on the stream the capture will use
    torch.cuda.current_stream().wait_stream(s)
    before = int(pacer._engine.state["counter"][0, 0].item())
    for t in zero:
        t.zero_()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        step()
    return g, before


def test_nccl_all_reduce_paced_inside_a_graph(nccl_group):
    pacer = Pacer(paced_config(), nccl_group, backend="device")
    x = torch.zeros(4096, device="cuda")

    def step():
        x.add_(1.0)
        pacer.all_reduce(x)
        pacer.step()

    g, before = _warm_and_capture(pacer, step, zero=(x,))
    eng = pacer._engine
    for _ in range(50):
        g.replay()
    torch.cuda.synchronize()
    assert x[0].item() == 50.0  # one rank: the all_reduce is the identity, the adds all ran
    assert int(eng.state["counter"][0, 0].item()) == before + 50  # the device step counter moved
    recs = eng.drain()
    assert len(recs) >= 40 and np.isfinite([r.step_time_us for r in recs[-10:]]).all()
    steps, delays = pacer.steps, eng.state["delay"].clone()
    with pytest.raises(RuntimeError, match=r"after g\.replay\(\)"):
        pacer.step()  # after replays: refused, the delays the replays read left alone
    torch.cuda.synchronize()
    assert pacer.steps == steps and torch.equal(eng.state["delay"], delays)


def test_a_sync_site_whose_exit_runs_before_an_earlier_async_sites_is_counted(nccl_group):
    """An async site runs on the pacing stream, a sync one after it on the current stream:
    with the pacing stream held back between the async collective and its exit stamp (a sleep
    inside the block; NCCL's stream does not wait for it), the sync site's exit stamp runs
    first. Each step must still count both sites: a count taken from the last exit to run said
    1 against the host's 2, and the step was dropped as a disagreement."""
    import torch.distributed as dist

    pacer = Pacer(paced_config(), nccl_group, backend="device")
    a, b = torch.ones(1024, device="cuda"), torch.ones(1024, device="cuda")
    steps = 12
    for _ in range(steps):
        with pacer.collective("async", async_op=True) as issued:
            work = dist.all_reduce(a, group=nccl_group, async_op=True)
            torch.cuda._sleep(2_000_000)  # ~1 ms on the pacing stream, before its exit stamp
            issued(work)
        pacer.all_reduce(b)  # sync, on the current stream: not ordered after the sleep
        pacer.step()
    pacer.drain()  # the records step() has not returned yet, into the pacer's ring
    recs = list(pacer.ring)
    assert [r.step for r in recs] == list(range(steps))  # no step dropped
    assert all(np.isfinite(r.wait_us).all() for r in recs)


# One rank, five paced steps on the device backend, then exit (argv[3]): "close"d, "exit"
# unclosed, unclosed in a "function" that returned (the pacer collected before exit), or an
# "error" raised with the GPU ~5 s from done (a hung job's Ctrl-C).
_FIVE_STEPS = """
import gc, sys, weakref, torch, torch.distributed as dist
from gpupace import PaceConfig, Pacer
dist.init_process_group("nccl", init_method="file://" + sys.argv[2], rank=0, world_size=1,
                        device_id=torch.device("cuda", 0))
def train():
    pacer = Pacer(PaceConfig(mode="pace", max_sites=4, telemetry_path=sys.argv[1]),
                  backend="device")
    x = torch.ones(1024, device="cuda")
    for _ in range(5):
        pacer.all_reduce(x)
        pacer.step()
    if sys.argv[3] == "close":
        pacer.close()
    return pacer
pacer = train()
if sys.argv[3] == "function":
    collected, pacer = weakref.ref(pacer), None
    gc.collect()
    assert collected() is None, "the pacer outlived its function"
dist.destroy_process_group()
if sys.argv[3] == "error":
    torch.cuda._sleep(10_000_000_000)
    raise RuntimeError("the job's own error")
"""


def test_an_unclosed_device_pacer_writes_its_last_records_at_exit(tmp_path):
    """The device copies its telemetry back every 8 steps: a pacer left unclosed lost the
    records still on the GPU at exit (all five here). Its exit finalizer reads them, as
    close() does, and so does its collection, for one made in a function that returned;
    exiting on an error, with the GPU busy, it waits 3 s (ERROR_DRAIN_S) for them and says
    they are lost."""
    files = {how: tmp_path / f"{how}.jsonl" for how in ("close", "exit", "function", "error")}
    runs = {how: subprocess.Popen([sys.executable, "-c", _FIVE_STEPS, str(path),
                                   str(tmp_path / f"{how}.store"), how],
                                  stderr=subprocess.PIPE, text=True)
            for how, path in files.items()}  # side by side
    errs = {}
    try:
        for how, run in runs.items():
            _, errs[how] = run.communicate(timeout=50)  # the device check allows 60 s a test
            assert run.returncode == (1 if how == "error" else 0), errs[how][-2000:]
    finally:
        for run in runs.values():
            run.kill()
    lines = {how: [json.loads(line) for line in path.read_text().splitlines()]
             for how, path in files.items()}
    steps = {how: [r["step"] for r in got if "gpupace" not in r] for how, got in lines.items()}
    told = "\n".join(f"{how}: {err[-1000:]}" for how, err in errs.items())  # one run must do
    assert len(steps["close"]) >= 4 and steps["exit"] == steps["function"] == steps["close"], \
        (steps, told)
    assert [lines[how][-1]["how"] for how in files] == ["closed", "exit", "exit",
                                                        "error: RuntimeError"], told
    assert "had not finished this rank's queued work after 3 s" in errs["error"], told


def test_closing_waits_a_bounded_time_for_work_that_does_not_end(nccl_group):
    """Closing after a rank died: the GPU's queued work (a collective waiting for it) never
    ends, and a synchronize would hang until the process group's timeout. The close waits
    its bound, says the records on the GPU are lost, and returns."""
    pacer = Pacer(paced_config(), nccl_group, backend="device")
    x = torch.ones(1024, device="cuda")
    for _ in range(2):
        pacer.all_reduce(x)
        pacer.step()
    torch.cuda._sleep(4_000_000_000)  # seconds of work on the current stream
    after = torch.cuda.Event()
    after.record()
    with pytest.warns(RuntimeWarning, match="had not finished this rank's queued work"):
        pacer._drain(0.2)
    assert not after.query()  # it returned with the work still running
    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.step for r in pacer._drain(0.2)] == [0, 1]  # ended: read as before


def test_eager_steps_replay_their_tail_from_a_graph_per_site_count(nccl_group, figures):
    """GPUPACE_TAIL_GRAPH=1: from the second eager step, the step's reduction and update are
    captured once per site count and replayed: no host sync (the captures included), every
    step updated and recorded, and the last replay's reduction what its NumPy twin makes of
    that step's gathered rows (a graph that left the reduction out would leave stale ones)."""
    import time

    from gpupace.kernels.reduce import reduce_reference

    pacer = Pacer(paced_config(), nccl_group, backend="device")
    eng = pacer._engine
    eng.gather_alone = True  # the exchange's all_gather runs at world size 1 too
    eng.use_tail_graphs(True)
    x = torch.ones(1024, device="cuda")
    host_ms = []

    def step(sites):
        t0 = time.perf_counter()
        for _ in range(sites):
            pacer.all_reduce(x)
        pacer.step()
        host_ms.append((time.perf_counter() - t0) * 1e3)

    step(2)  # compiles; launches its tail
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(22):  # the first of these captures the 2-site graph
            step(2)
        for _ in range(5):  # and this the 3-site one
            step(3)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    want = reduce_reference(eng.gathered.cpu().numpy(), 3)
    for key, value in want.items():  # the kernel writes the sites of the step alone
        got = eng.red[key].cpu().numpy()
        cut = {"site": np.s_[:, :3], "straggler": np.s_[:3]}.get(key, np.s_[...])
        np.testing.assert_allclose(got[cut], value[cut], rtol=1e-6, err_msg=key)
    pacer.drain()
    recs = list(pacer.ring)
    figures["tail_graph"] = {"graphs": sorted(eng._tail.graphs),
                             "capture_steps_host_ms": [host_ms[1], host_ms[23]],
                             "replay_step_host_ms_p50": float(np.median(host_ms[2:23]))}
    assert eng._tail.failed is None and sorted(eng._tail.graphs) == [2, 3]
    assert int(eng.state["counter"][0, 0].item()) == 28  # every step's update ran
    assert [r.step for r in recs] == list(range(28))
    assert [len(r.site_spread_us) for r in recs] == [2] * 23 + [3] * 5
    assert np.isfinite([r.step_time_us for r in recs[1:]]).all()


def test_gather_rows_on_nccl_eager_and_inside_a_graph(nccl_group):
    """The device backend's exchange as a multi-rank job runs it: all_gather_single into a
    preallocated [N, W] float32 buffer. At world size 1 the backend copies instead, so no other
    GPU test reaches this call."""
    from gpupace.backends import gather_rows

    row = torch.zeros(10, dtype=torch.float32, device="cuda")
    out = torch.full((1, 10), -1.0, dtype=torch.float32, device="cuda")
    row.copy_(torch.arange(10, dtype=torch.float32))
    gather_rows(out, row, nccl_group)
    torch.cuda.synchronize()
    assert out[0].tolist() == list(range(10))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        gather_rows(out, row, nccl_group)
    for k in range(3):  # a replay gathers what the row holds then
        row.fill_(float(k))
        g.replay()
        torch.cuda.synchronize()
        assert out[0].tolist() == [float(k)] * 10


def test_capture_once_replay_200_with_skew_delays_adapt(figures):
    """World of 3 in one process: rank 0 is real, ranks 1 and 2 are synthetic rows made on the
    device from rank 0's row. Rank 0 arrives first; the last rank arrives 300 us later and the
    transfer takes 20 us, so rank 0's collective (a spin standing in for it) lasts until
    320 us after its arrival. The whole step is captured once; the replays alone must learn
    the delay, with no host work."""
    from gpupace.backends.device import DeviceEngine
    from gpupace.kernels import spin

    eng = DeviceEngine(paced_config(), None, 0, 3)
    m = eng.max_sites
    late = torch.tensor([0.0, 300.0, 150.0], device="cuda")[:, None]
    compute = torch.tensor([1000.0], device="cuda")  # the step's compute, so the cap is ~650 us
    need = torch.zeros(1, device="cuda")
    scratch = torch.zeros(1, device="cuda")
    reads = torch.zeros(1, dtype=torch.int32, device="cuda")
    clk = torch.zeros(2, dtype=torch.int64, device="cuda")

    def exchange():
        eng.gathered.copy_(eng.row.expand_as(eng.gathered))
        arrival = eng.gathered[0:1, 2:2 + m] + eng.gathered[0:1, 2 + m:]  # w + d of rank 0
        eng.gathered[1:, 2:2 + m] = (arrival - late[1:]).clamp_min(0.0)
        eng.gathered[1:, 2 + m:] = 0.0

    eng._exchange = exchange

    def step():
        spin.spin(compute, scratch, reads, clk, cap_us=5000.0)
        t = eng.arrive()
        torch.clamp_min(320.0 - eng.row[2 + m:3 + m], 20.0, out=need)  # wait for the last
        spin.spin(need, scratch, reads, clk, cap_us=5000.0)
        eng.exit(t)
        eng.end_step(0, 0.0)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
        eng.warmup()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            step()
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(200):
        g.replay()
    torch.cuda.synchronize()
    d = float(eng.state["delay"][0, 0].item())
    figures["graph_replay_learned_delay_us"] = d
    # rank 0 arrives 300 us before the last; it is paced to about 300 - guard
    assert 250.0 <= d <= 300.0, d
    recs = eng.drain()
    # the estimator, inside the replays: rank 0 300 us early, rank 1 last, rank 2 150 us early
    np.testing.assert_allclose(recs[-1].earliness_us, [300.0, 0.0, 150.0], atol=5.0)
    assert recs[-1].delay_us[0] > 250.0  # the spin applied it inside the replays
    assert recs[-1].spread_us == pytest.approx(300.0, abs=5.0)
    assert int(eng.state["counter"][0, 0].item()) == 201


def test_ddp_hook_on_the_device_backend_trains_like_plain_ddp(nccl_group):
    """The DDP hook issues each bucket's all_reduce under Pacer.collective: on the device
    backend, on the pacing stream forked from the backward's stream and joined back by the
    future and by step(). One rank: the gradients, hence the weights, must equal plain DDP's."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    # 1.6 MB of parameters: DDP's first bucket holds 1 MB whatever bucket_cap_mb says (a
    # 75 KB model made one bucket on the H200 run of 2026-11-30).
    make = lambda: torch.nn.Sequential(torch.nn.Linear(64, 640), torch.nn.ReLU(),  # noqa: E731
                                       torch.nn.Linear(640, 600)).cuda()
    plain, paced = make(), make()
    paced.load_state_dict(plain.state_dict())
    ddp_plain = DDP(plain, device_ids=[0], bucket_cap_mb=0.5, process_group=nccl_group)
    ddp_paced = DDP(paced, device_ids=[0], bucket_cap_mb=0.5, process_group=nccl_group)
    pacer = Pacer(paced_config(max_sites=16), nccl_group, backend="device")
    pacer.attach(ddp_paced)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (ddp_plain, ddp_paced)]
    for _ in range(6):
        x = torch.randn(32, 64, device="cuda")
        for model, opt in zip((ddp_plain, ddp_paced), opts, strict=True):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
        pacer.step()
    torch.cuda.synchronize()
    for a, b in zip(plain.parameters(), paced.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert len(pacer.site_names) > 1  # several buckets, each one paced site


def test_a_saved_state_loads_into_the_device_buffers_that_a_captured_step_reads(nccl_group):
    """`load_state_dict` writes into the buffers in place, so a step captured before the load
    replays from the loaded state; `state_dict` reads them back, and refuses to run in a
    capture."""
    from gpupace import checkpoint

    pacer = Pacer(paced_config(warmup_steps=0), nccl_group, backend="device")
    x = torch.zeros(1024, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            pacer.all_reduce(x)
            pacer.step()
        pacer.warmup()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        pacer.all_reduce(x)
        pacer.step()
        with pytest.raises(RuntimeError, match="inside a CUDA graph capture"):
            pacer.state_dict()
    saved = {"format": checkpoint.FORMAT, "world_size": 1, "sites": 1,
             "floor": torch.tensor([[250.0]]), "calm": torch.tensor([[7]]),
             "mean": torch.tensor([[300.0]]), "var": torch.tensor([[16.0]]),
             "active": torch.tensor([True]), "above": torch.tensor([3]),
             "below": torch.tensor([0]), "last_seen": torch.tensor([[True]])}
    pacer.load_state_dict(saved)
    back = pacer.state_dict()
    for name in checkpoint.PER_RANK + checkpoint.PER_SITE:
        assert torch.equal(back[name].to(saved[name].dtype), saved[name]), name
    eng = pacer._engine
    assert eng.state["counter"][0, 1:].tolist() == [0, 1]
    g.replay()
    torch.cuda.synchronize()
    assert eng.state["counter"][0, 1:].tolist() == [1, 1]  # the replay took the loaded count
    records = pacer.drain()
    assert records[-1].active  # the loaded switch: one rank alone never turns it on
    assert not any(r.active for r in records[:-1])
    assert pacer.state_dict()["floor"].tolist() == [[250.0]]  # one rank learns nothing


def test_an_async_paced_collective_forks_and_joins_inside_a_graph(nccl_group):
    """The path a DDP step's buckets take, captured: an async collective on the engine's
    pacing stream (forked from the capturing stream), its work awaited there, the exit stamp,
    and the join back in step(). After the captures of synchronous sites: a capture that fails
    here must not cost the tests before it. At one rank the
    all_reduce is the identity, so this checks that the capture is valid and that each replay
    runs the step, not the order of the collective against the copy after it (a premul-sum
    op, which is not one, is made and freed by NCCL at each call: not for a graph)."""
    import torch.distributed as dist

    pacer = Pacer(paced_config(), nccl_group, backend="device")
    x, y = torch.zeros(4096, device="cuda"), torch.zeros(4096, device="cuda")

    def step():
        x.add_(1.0)
        with pacer.collective("async", async_op=True) as issued:
            work = dist.all_reduce(x, group=nccl_group, async_op=True)
            issued(work)
        work.wait()  # the caller's wait, on its own stream
        y.copy_(x)
        pacer.step()

    g, before = _warm_and_capture(pacer, step, zero=(x,))
    eng = pacer._engine
    for _ in range(20):
        g.replay()
    torch.cuda.synchronize()
    assert y[0].item() == 20.0  # the adds, the all_reduce (identity at one rank), the copy
    assert int(eng.state["counter"][0, 0].item()) == before + 20
    recs = eng.drain()
    assert len(recs) >= 20 and all(np.isfinite(r.wait_us).all() for r in recs[-10:])


def test_a_ddp_step_paced_by_the_hook_captures_and_replays_like_eager_training(nccl_group):
    """The whole DDP step captured as torch's CUDA-graph notes describe it: DDP built on a
    side stream, 11 eager iterations there first (DDP rebuilds its buckets in the second and
    samples its logging up to the tenth), the pacing hook's async all_reduces forked onto the
    pacing stream from autograd's thread, their futures' callbacks, and pacer.step() inside
    the graph. One rank: DDP's average is the identity, so each replay must train as an eager
    step of a plain model does, on the same inputs, and every replay's record must hold each
    bucket's site. Last in the file: the riskiest capture (not yet run on a GPU when
    written)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(64, 640), torch.nn.ReLU(),  # noqa: E731
                                       torch.nn.Linear(640, 600)).cuda()
    plain, paced = make(), make()
    paced.load_state_dict(plain.state_dict())
    inputs = [torch.randn(32, 64, device="cuda") for _ in range(20)]
    static_x = inputs[0].clone()
    pacer = Pacer(paced_config(max_sites=16), nccl_group, backend="device")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ddp = DDP(paced, device_ids=[0], bucket_cap_mb=0.5, process_group=nccl_group)
        pacer.attach(ddp)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)

        def step():
            ddp(static_x).square().mean().backward()
            opt.step()
            pacer.step()

        for _ in range(11):
            opt.zero_grad(set_to_none=True)
            step()
        pacer.warmup()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    eng = pacer._engine
    before = int(eng.state["counter"][0, 0].item())
    sites = len(pacer.site_names)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g, stream=s):
        step()
    for x in inputs[1:]:
        static_x.copy_(x)
        g.replay()
    torch.cuda.synchronize()
    ref_opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for x in [inputs[0]] * 11 + inputs[1:]:
        ref_opt.zero_grad(set_to_none=True)
        plain(x).square().mean().backward()
        ref_opt.step()
    torch.cuda.synchronize()
    for a, b in zip(plain.parameters(), paced.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert sites > 1 and int(eng.state["counter"][0, 0].item()) == before + len(inputs) - 1
    recs = eng.drain()[-(len(inputs) - 1):]  # the replays'
    assert len(recs) == len(inputs) - 1 and all(np.isfinite(r.wait_us).all() for r in recs)
    assert all(len(r.site_spread_us) == sites for r in recs)  # every bucket paced in each
    assert all(np.isfinite(r.site_spread_us).all() for r in recs)
