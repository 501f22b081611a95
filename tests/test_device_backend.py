"""The device backend on a machine without a GPU: backend selection and its errors, and the
whole `DeviceEngine` step loop on the CPU under TRITON_INTERPRET=1 (clock-free kernels, the
NumPy twin of the reduction), driven by a test clock, against the NumPy policy."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch

from gpupace import PaceConfig, Pacer, policy
from gpupace.backends import DEVICE_MAX_RANKS, blocking_wait_note, device_backend_missing


@pytest.fixture(scope="module")
def interp(k):
    """The kernels under TRITON_INTERPRET=1 (conftest's `k`), for tests that only need the mode."""
    return k


# -- selection ---------------------------------------------------------------------------------

@pytest.fixture
def fake_cuda(monkeypatch):
    """Pretend CUDA is there, so the package checks come next."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return monkeypatch


def test_auto_picks_host_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert Pacer._pick_backend("auto", "nccl") == "host"
    assert Pacer._pick_backend("auto", "gloo") == "host"
    assert Pacer._pick_backend("host", "nccl") == "host"


def test_forced_device_without_cuda_says_why(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        Pacer._pick_backend("device", "nccl")
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        Pacer(PaceConfig(mode="pace"), backend="device")


@pytest.mark.parametrize("missing", ["triton", "cupy"])
def test_forced_device_names_the_missing_package_and_extra(fake_cuda, missing):
    fake_cuda.setitem(sys.modules, missing, None)  # import of it raises ImportError
    with pytest.raises(RuntimeError, match=rf"{missing} is not installed.*gpupace\[cuda12\]"):
        Pacer._pick_backend("device", "nccl")
    assert Pacer._pick_backend("auto", "nccl") == "host"  # auto falls back quietly


@pytest.mark.parametrize("broken", ["triton", "cupy"])
def test_a_package_that_is_installed_but_broken_is_named_with_its_error(fake_cuda, tmp_path,
                                                                       broken):
    """An import that raises more than ImportError (cupy loading a CUDA library of the wrong
    version) is a reason like a missing package, not a crash of backend selection (nor of the
    GPU tests' collection, which asks the same)."""
    (tmp_path / f"{broken}.py").write_text("raise RuntimeError('libcudart.so.12: wrong version')\n")
    fake_cuda.syspath_prepend(str(tmp_path))
    fake_cuda.delitem(sys.modules, broken, raising=False)
    if broken == "cupy":
        _stand_in_cupy(fake_cuda, (12, 8))
        fake_cuda.delitem(sys.modules, "cupy")  # the file above, not the stand-in
    why = device_backend_missing()
    assert why.startswith(f"{broken} is installed but does not import (RuntimeError: "
                          "libcudart.so.12: wrong version); reinstall it: pip install"), why
    assert Pacer._pick_backend("auto", "nccl") == "host"
    with pytest.raises(RuntimeError, match=f"{broken} is installed but does not import"):
        Pacer._pick_backend("device", "nccl")


def _stand_in_cupy(patch, nvrtc_version) -> None:
    """A stand-in cupy whose NVRTC loader returns its version, or raises as cupy 14.2 does
    without libnvrtc (a RuntimeError from its library finder)."""
    def get_version():
        if nvrtc_version is None:
            raise RuntimeError('Failure finding "libnvrtc.so.13 or libnvrtc.so.12"\n')
        return nvrtc_version

    libs = type(sys)("cupy_backends.cuda.libs")
    libs.nvrtc = type(sys)("nvrtc")
    libs.nvrtc.getVersion = get_version
    patch.setitem(sys.modules, "cupy", type(sys)("cupy"))
    patch.setitem(sys.modules, "cupy_backends.cuda.libs", libs)


def test_cupy_without_nvrtc_is_named_and_auto_falls_back(fake_cuda):
    _stand_in_cupy(fake_cuda, None)
    why = device_backend_missing()
    assert why.startswith("cupy cannot load NVRTC, which its reduction compiles with "
                          '(Failure finding "libnvrtc.so.13 or libnvrtc.so.12"); install'), why
    assert Pacer._pick_backend("auto", "nccl") == "host"
    with pytest.raises(RuntimeError, match="cupy cannot load NVRTC"):
        Pacer._pick_backend("device", "nccl")


def test_auto_picks_device_for_nccl_groups_when_it_can_run(fake_cuda):
    _stand_in_cupy(fake_cuda, (12, 8))
    assert device_backend_missing() is None
    assert Pacer._pick_backend("auto", "nccl") == "device"
    assert Pacer._pick_backend("auto", "gloo") == "host"
    assert Pacer._pick_backend("auto", "none") == "host"
    assert Pacer._pick_backend("device", "none") == "device"
    with pytest.raises(RuntimeError, match="nccl"):
        Pacer._pick_backend("device", "gloo")


def test_groups_past_the_reductions_size_are_paced_by_the_host(fake_cuda, interp):
    """The device reduction sorts the ranks in one thread block: a bigger group picked it,
    and its first step() failed in the reduction after the exchange."""
    from gpupace.backends.device import DeviceEngine
    from gpupace.kernels import reduce

    _stand_in_cupy(fake_cuda, (12, 8))
    most = DEVICE_MAX_RANKS
    assert most == reduce.MAX_SORT and reduce.sort_len_for(most) <= reduce.MAX_SORT
    assert reduce.sort_len_for(most + 1) > reduce.MAX_SORT  # what the reduction refuses
    assert Pacer._pick_backend("auto", "nccl", most) == "device"
    assert Pacer._pick_backend("auto", "nccl", most + 1) == "host"
    with pytest.raises(RuntimeError, match=f"at most {most} ranks .*this one has {most + 1}; "
                                           "use backend='host'"):
        Pacer._pick_backend("device", "nccl", most + 1)
    with pytest.raises(ValueError, match=f"at most {most} ranks"):
        DeviceEngine(PaceConfig(), None, 0, most + 1, device="cpu")


def test_a_model_on_another_gpu_than_the_device_engine_is_refused_at_attach():
    """Every rank's pacer made before torch.cuda.set_device(local_rank) is on cuda:0, its
    models elsewhere: their first exchange failed in NCCL (duplicate GPU). Said at attach()."""
    from gpupace.pacer import _device_mismatch

    cuda = torch.device
    why = _device_mismatch(cuda("cuda", 3), cuda("cuda", 0))
    assert why.startswith("the DDP model is on cuda:3 and this pacer's device backend on cuda:0")
    assert "torch.cuda.set_device(3) before making the Pacer" in why
    for model, engine in [(cuda("cuda", 1), cuda("cuda", 1)), (cuda("cpu"), cuda("cuda", 0)),
                          (cuda("cuda", 1), cuda("cpu")), (cuda("cuda", 1), None),
                          (None, cuda("cuda", 0))]:  # a host engine has no device
        assert _device_mismatch(model, engine) is None


@pytest.mark.parametrize("env, named", [
    ({}, None), ({"TORCH_NCCL_BLOCKING_WAIT": "0"}, None),
    ({"TORCH_NCCL_BLOCKING_WAIT": "1"}, "TORCH_NCCL_BLOCKING_WAIT=1"),
    ({"NCCL_BLOCKING_WAIT": "true"}, "NCCL_BLOCKING_WAIT=true"),
])
def test_nccl_blocking_wait_is_named_as_a_host_stall(env, named):
    """With it, the device engine's work.wait() on every paced async collective waits on the
    host (the engine warns when it is made on a CUDA group of more than one rank)."""
    note = blocking_wait_note(env)
    assert note is None if named is None else (named in note and "block the host" in note)


def test_host_pacer_warmup_is_a_no_op_without_cuda():
    """Between steps, as a CUDA-graph user calls it: nothing of the pacer's changes (no graph
    capture can follow here)."""
    pacer = Pacer(PaceConfig(mode="pace", warmup_steps=0), backend="host")
    for _ in range(3):
        with pacer.site("x"):
            pass
        pacer.step()
    engine, state = pacer._engine, pacer._engine.state.copy()
    records = list(pacer.ring)
    pacer.warmup()
    assert pacer.backend == "host" and pacer._engine is engine and pacer.steps == 3
    assert list(pacer.ring) == records and engine.n_sites == 0
    for name in ("floor", "calm", "mean", "var", "delay", "active", "above", "below"):
        np.testing.assert_array_equal(getattr(engine.state, name), getattr(state, name))
    assert engine.state.step == state.step


def test_host_pacer_where_cuda_is_warns_at_warmup_and_refuses_a_capture(monkeypatch):
    """With CUDA present, warmup() (a no-op) warns that no graph can capture the host backend;
    a capture that reaches a host site or an empty step() raises, naming backend='device',
    and leaves no site counted: the pacer goes on eagerly (here a capture is what torch's query
    answers: there is no GPU to capture on)."""
    capture = {"on": False}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capture["on"])
    pacer = Pacer(PaceConfig(mode="pace", warmup_steps=0), backend="host")
    with pacer.site("x"):
        pass
    pacer.step()
    with pytest.warns(RuntimeWarning, match="warmup.. does nothing on the host backend.*"
                                            "backend='device'"):
        pacer.warmup()
    capture["on"] = True
    with pytest.raises(RuntimeError, match="cannot capture it"):
        with pacer.site("x"):
            pass
    assert pacer._sites_this_step == 0 and pacer._open_blocks == 0
    with pytest.raises(RuntimeError, match="cannot capture it"):
        pacer.step()
    assert pacer.steps == 1
    capture["on"] = False
    pacer.pause()  # between steps still
    with pacer.site("y"):
        pass
    pacer.step()
    assert pacer.steps == 2 and pacer.site_names == ["y"]
    Pacer(PaceConfig(mode="off"), backend="host").warmup()  # nothing paced: nothing said


def test_a_refused_host_capture_names_what_keeps_the_device_backend_off(monkeypatch):
    from gpupace import backends
    from gpupace.backends import DEVICE_MAX_RANKS, host

    monkeypatch.setattr(backends, "device_backend_missing", lambda: None)
    assert host.capture_refused("nccl", 8).endswith("backend='device'")
    assert "this one is 'gloo'" in host.capture_refused("gloo", 2)
    assert f"at most {DEVICE_MAX_RANKS} ranks" in host.capture_refused("nccl", DEVICE_MAX_RANKS + 1)
    monkeypatch.setattr(backends, "device_backend_missing", lambda: "cupy is not installed")
    assert host.capture_refused("gloo", 2).endswith("which cannot run here: cupy is not installed")


def test_engine_on_cpu_needs_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    from gpupace.backends.device import DeviceEngine
    from gpupace.kernels import clock

    if clock.interpreting():
        pytest.skip("kernels are loaded under the interpreter in this process")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        DeviceEngine(PaceConfig(), None, 0, 1, device="cpu")


# -- the engine's step loop on the CPU ----------------------------------------------------------

ARRIVE_US = [0.0, 200.0, 250.0]  # rank 0 (this one) is early; rank 2 is last
TRANSFER_US = 50.0
STEP_NS = 10_000_000


def paced_config():
    return PaceConfig(mode="pace", warmup_steps=1, on_steps=1, holdoff_factor=0.0,
                      threshold_us=20.0, release_us=10.0, gain=1.0, guard_us=10.0,
                      floor_rise=0.5, max_sites=3)


def run_engine(n_steps: int, n_sites: int = 2, before_step=None):
    """Drives a 3-rank DeviceEngine (this rank 0, the other two synthetic) with a test clock.
    Returns the engine, the gathered matrices it saw, the records it returned, its delays.
    `before_step(engine, step)` runs before each step."""
    from gpupace.backends.device import DeviceEngine

    eng = DeviceEngine(paced_config(), None, 0, 3, device="cpu", ring_len=16)
    m = eng.max_sites
    seen, returned, delays = [], [], []
    others: dict[int, np.ndarray] = {}

    def exchange():
        eng.gathered[0].copy_(eng.row)
        for i, r in others.items():
            eng.gathered[i].copy_(torch.from_numpy(r))
        seen.append(eng.gathered.numpy().astype(np.float64).copy())

    eng._exchange = exchange
    for step in range(n_steps):
        if before_step is not None:
            before_step(eng, step)
        base = (step + 1) * STEP_NS
        rows = {i: np.r_[n_sites, 10_000.0, np.full(m, np.nan), np.zeros(m)] for i in (1, 2)}
        for k in range(n_sites):
            eng.clk[1] = base + k * 1_000_000
            ticket = eng.arrive()
            d0 = (int(eng.clk[1]) - base - k * 1_000_000) / 1e3  # the delay the kernel applied
            exit_us = max(d0, ARRIVE_US[2]) + TRANSFER_US
            eng.clk[1] = base + k * 1_000_000 + int(exit_us * 1e3)
            eng.exit(ticket)
            for i in (1, 2):
                rows[i][2 + k] = exit_us - ARRIVE_US[i]
        others.update(rows)
        rec = eng.end_step(step, step * 0.01)
        if rec is not None:
            returned.append(rec)
        delays.append(eng.next_delays())
    return eng, seen, returned, delays


def test_engine_loop_agrees_with_policy_and_paces_the_early_rank(interp):
    n_steps, n_sites = 11, 2
    eng, seen, returned, delays = run_engine(n_steps, n_sites)
    m = eng.max_sites
    params = policy.PolicyParams.from_config(paced_config(), 3)
    state = policy.init_state(3, n_sites)
    stats_all = []
    for k, g in enumerate(seen):
        w, d, st_us = g[:, 2:2 + n_sites], g[:, 2 + m:2 + m + n_sites], g[:, 1]
        state, stats = policy.update_reference(params, state, w, d, st_us)
        stats_all.append(stats)
        np.testing.assert_allclose(delays[k], state.delay[0], rtol=1e-4, atol=1e-2)
    # own row: measured waits and step time from the test clock, applied delays from the spin
    assert np.isnan(seen[0][0, 1]) and seen[1][0, 1] == pytest.approx(STEP_NS / 1e3)
    assert seen[0][0, 0] == n_sites
    assert delays[-1][0] > 200.0  # rank 0 arrives 250 us early and is paced
    last_d = seen[-1][0, 2 + m:2 + m + n_sites]
    np.testing.assert_allclose(last_d, np.ceil(delays[-2]), atol=1e-3)  # 1 us virtual ticks
    # pacing leaves the natural spread and shrinks the entry spread (the residual)
    assert stats_all[-1].spread.max() == pytest.approx(ARRIVE_US[2])
    assert stats_all[-1].residual.max() < 0.25 * stats_all[0].residual.max()
    # telemetry: records arrive lazily, in order, and drain() returns the rest
    records = returned + eng.drain()
    assert [r.step for r in records] == list(range(n_steps))
    assert len(returned) >= 1 and returned[0].step == 0
    for r, stats in zip(records, stats_all, strict=True):
        s = int(np.argmax(np.nan_to_num(stats.spread, nan=-1.0)))
        assert r.spread_us == pytest.approx(stats.spread[s], abs=1e-3)
        assert r.straggler == stats.straggler[s] == 2
        assert len(r.site_spread_us) == n_sites and len(r.earliness_us) == 3
    assert eng.drain() == []


def test_ring_slots_by_hand():
    from gpupace.backends.device import ring_slots

    assert ring_slots(0, 8, 16) == [(0, 8)]
    assert ring_slots(8, 16, 16) == [(8, 16)]
    assert ring_slots(12, 20, 16) == [(12, 16), (0, 4)]
    assert ring_slots(5, 5, 16) == []
    assert ring_slots(0, 40, 16) == [(8, 16), (0, 8)]  # only the last 16 steps are still there
    assert ring_slots(3, 35, 16) == [(3, 16), (0, 3)]


def test_eager_ring_copies_take_only_the_new_slots_and_lose_no_record(interp, monkeypatch):
    """In eager mode each copy of the telemetry ring takes the slots of the steps since the
    last one (8 of 16 here), and the host's never-copied slots are skipped, not read as
    records; once a step has been captured, each copy takes the whole ring. Either way every
    step's record arrives once, in order. (Not yet timed on a GPU: at 4096 ranks a whole copy
    is 16.8 MB every 8 steps, an eager one 0.5 MB.)"""
    from gpupace.backends import device

    copied, ring_slots = [], device.ring_slots

    def spy(start, end, ring_len):
        spans = ring_slots(start, end, ring_len)
        copied.append(sum(hi - lo for lo, hi in spans))
        return spans

    monkeypatch.setattr(device, "ring_slots", spy)
    n_steps = 36

    def capture_after_20(eng, step):
        if step == 20:
            eng._captured = True  # as end_step sets it when a step is captured

    eng, _, returned, _ = run_engine(n_steps, 1, before_step=capture_after_20)
    assert copied == [8, 8] and eng.ring_len == 16  # steps 0-7, 8-15; whole copies after 20
    records = returned + eng.drain()
    assert [r.step for r in records] == list(range(n_steps))
    assert len(returned) >= 24


def test_tail_graphs_are_for_cuda_alone(interp, monkeypatch):
    """GPUPACE_TAIL_GRAPH=1 asks eager steps to replay their tail from a CUDA graph; on a CPU
    device there is none, and the steps launch their tail as before."""
    from gpupace.backends.device import DeviceEngine

    monkeypatch.setenv("GPUPACE_TAIL_GRAPH", "1")
    eng = DeviceEngine(PaceConfig(mode="observe", max_sites=1), None, 0, 1, device="cpu")
    assert eng._tail is None
    for step in range(2):
        eng.clk[1] += 5000
        eng.exit(eng.arrive())
        eng.end_step(step, 0.0)
    assert int(eng.state["counter"][0, 0]) == 2  # both steps' updates ran


def test_an_eager_step_asks_about_a_capture_at_its_first_site_and_its_end_alone(interp):
    """Each query is a CUDA call on the eager hot path: before warm-up one at a step's first
    site (a capture there is refused), one at the first exit ever, and one in step(); after
    it, step()'s alone. (On a CPU device the answer is always no; what is counted is the
    asking.)"""
    from gpupace.backends.device import DeviceEngine

    eng = DeviceEngine(PaceConfig(mode="observe", max_sites=8), None, 0, 1, device="cpu")
    asked = []
    eng._capturing = lambda: asked.append(eng.n_sites) or False

    def step(k: int) -> list[int]:
        asked.clear()
        for _ in range(8):
            eng.clk[1] += 5000
            eng.exit(eng.arrive())
        eng.end_step(k, 0.0)
        return list(asked)

    # at site 0 (none counted yet), at the first exit ever (it compiles its kernel), in step()
    assert step(0) == [0, 1, 8] and step(1) == [0, 8]
    eng.warmup()
    assert step(2) == [8]


@pytest.mark.parametrize("from_site", [0, 3])
def test_a_capture_before_warmup_is_refused_at_its_first_site_or_at_step(interp, from_site):
    """A capture that starts at a step's first site is refused there; one that starts later
    (the site kernels compiled by then) is refused at step(). Here the capture is a flag the
    engine reads where it would ask CUDA."""
    from gpupace.backends.device import DeviceEngine, WarmupError

    eng = DeviceEngine(PaceConfig(mode="observe", max_sites=8), None, 0, 1, device="cpu")
    eng.clk[1] += 5000
    eng.exit(eng.arrive())
    eng.end_step(0, 0.0)  # one eager step: the kernels are compiled
    capture = {"on": False}
    eng._capturing = lambda: capture["on"]
    for _ in range(from_site):
        eng.exit(eng.arrive())
    capture["on"] = True
    with pytest.raises(WarmupError, match="warmup"):
        for _ in range(from_site, 8):
            eng.exit(eng.arrive())
        eng.end_step(1, 0.0)
    # where it was refused: at the first site, before it counted, or at step() after all 8
    assert eng.n_sites == (0 if from_site == 0 else 8)


def test_an_eager_step_without_sites_after_a_capture_is_refused(interp):
    """A step() after graph replays passes no paced collective: once a step was captured it is
    refused (it would zero the delays the replays read). An eager step with its sites still
    runs, and before any capture an empty step is only left out. The capture is a flag the
    engine reads where it would ask CUDA."""
    from gpupace.backends.device import DeviceEngine

    eng = DeviceEngine(PaceConfig(mode="observe", max_sites=2), None, 0, 1, device="cpu")

    def step(k: int, sites: int) -> None:
        for _ in range(sites):
            eng.clk[1] += 5000
            eng.exit(eng.arrive())
        if not sites:
            eng.check_empty_step()  # as Pacer.step asks
        eng.end_step(k, 0.0)

    step(0, 2)
    step(1, 0)  # before a capture: allowed (the step is left out)
    eng.warmup()
    capture = {"on": True}
    eng._capturing = lambda: capture["on"]
    step(2, 2)  # "captured"
    capture["on"] = False
    with pytest.raises(RuntimeError, match=r"after g\.replay\(\)"):
        step(3, 0)
    step(3, 2)  # an eager step with its sites, after the capture


def test_a_pacer_asks_its_engine_about_an_empty_step_before_the_step_counts():
    """step() asks its engine (`check_empty_step`) about a step with no paced collective,
    before anything of the step changes: a refusal leaves the pacer's step count and its
    telemetry end line as they were. A step with sites does not ask."""
    pacer = Pacer(PaceConfig(mode="pace"), backend="host")
    asked = []

    def refuse() -> None:
        asked.append(pacer._sites_this_step)
        raise RuntimeError("refused")

    pacer._engine.check_empty_step = refuse
    with pytest.raises(RuntimeError, match="refused"):
        pacer.step()
    assert pacer.steps == 0 and pacer._end["steps"] == 0
    with pacer.site("x"):
        pass
    pacer.step()
    assert asked == [0] and pacer.steps == 1


def test_engine_warmup_leaves_the_state_alone(interp):
    eng, *_ = run_engine(3)
    before = {k: v.clone() for k, v in eng.state.items()}
    ring, row = eng.ring.clone(), eng.row.clone()
    eng.warmup()
    assert eng._warm
    for k, v in eng.state.items():
        assert torch.equal(v.nan_to_num(-1), before[k].nan_to_num(-1)), k  # usual: NaN
    assert torch.equal(eng.ring.nan_to_num(-1), ring.nan_to_num(-1))
    assert torch.equal(eng.row.nan_to_num(-1), row.nan_to_num(-1))


def test_engine_ignores_stale_and_surplus_sites(interp):
    from gpupace.backends.device import DeviceEngine

    eng = DeviceEngine(PaceConfig(mode="observe", max_sites=1), None, 0, 1, device="cpu")
    t1 = eng.arrive()
    t2 = eng.arrive()  # past max_sites: neither timed nor delayed
    eng.clk[1] += 5000
    eng.exit(t1)
    eng.exit(t2)
    assert eng.row[2] == 0.0  # site 0 marked exited, and nothing else
    eng.end_step(0, 0.0)
    assert eng.gathered[0, 0] == 1 and eng.gathered[0, 2] == pytest.approx(5.0)  # as exchanged
    eng.exit(t1)  # an exit from the previous step changes nothing
    assert eng.row[0] == 0 and math.isnan(eng.row[2])


def test_a_device_step_cut_short_leaves_no_sites_to_the_next(interp):
    """Ctrl-C in step()'s all_gather: the step's sites stayed counted (the host engine's
    test in test_pacer_dist), and the next step's row said two sites for its one."""
    from gpupace.backends.device import DeviceEngine

    eng = DeviceEngine(PaceConfig(mode="observe", max_sites=4), None, 0, 1, device="cpu")
    for _ in range(3):  # three sites, the next step one: the row's marks counted as sites
        eng.exit(eng.arrive())
    exchange = eng._exchange

    def interrupted():
        raise KeyboardInterrupt

    eng._exchange = interrupted
    with pytest.raises(KeyboardInterrupt):
        eng.end_step(0, 0.0)
    eng._exchange = exchange
    assert eng.n_sites == 0
    eng.exit(eng.arrive())
    eng.end_step(1, 0.0)
    assert eng.gathered[0, 0] == 1  # one site, as this step had
    assert torch.isnan(eng.gathered[0, 3:6]).all() and (eng.gathered[0, 7:] == 0).all()


def test_a_pause_forgets_the_exits_the_next_step_is_timed_from(interp):
    """pause() on the device: the next step's time and its arrival are unknown (a NaN step
    time; the usual arrival not learnt from the pause), as on the host."""
    from gpupace.backends.device import DeviceEngine

    eng = DeviceEngine(PaceConfig(mode="observe", max_sites=2), None, 0, 1, device="cpu")
    for step in range(4):
        eng.clk[1] += 5_000_000 if step != 3 else 900_000_000  # 0.9 s of eval before step 3
        if step == 3:
            usual = eng.usual.clone()
            eng.forget_exits()
        eng.exit(eng.arrive())
        eng.end_step(step, 0.0)
        if step == 2:
            assert eng.gathered[0, 1] == pytest.approx(5000.0)  # the 5 ms step, us
    assert math.isnan(eng.gathered[0, 1])
    assert eng.usual[0] == usual[0] == pytest.approx(5000.0)  # the pause not learnt as an arrival


def test_the_engine_buffers_do_not_follow_torch_defaults(interp):
    """The kernels read and write float32 and int32, and the telemetry ring's copy lands in
    host memory, whatever torch's default dtype (float64, bfloat16) and device (a model
    built under set_default_device("cuda"); "meta" stands in for it here) are."""
    from gpupace.backends.device import DeviceEngine
    from gpupace.kernels import reduce

    want = {"valid": torch.int32, "n_valid": torch.int32, "site": torch.float32,
            "straggler": torch.int32, "median": torch.float32, "sums": torch.float32,
            "counts": torch.int32}
    before = torch.get_default_dtype()
    for dtype in (torch.float64, torch.bfloat16):
        torch.set_default_dtype(dtype)
        try:
            assert {k: v.dtype for k, v in reduce.outputs(8, 4, "cpu").items()} == want
        finally:
            torch.set_default_dtype(before)
    torch.set_default_device("meta")
    try:
        eng = DeviceEngine(PaceConfig(mode="observe", max_sites=2), None, 0, 1, device="cpu")
    finally:
        torch.set_default_device(None)
    assert eng._host_ring.device.type == "cpu" and eng._host_ring_step.device.type == "cpu"
    eng.exit(eng.arrive())
    eng.end_step(0, 0.0)
    assert eng.gathered[0, 0] == 1


def test_a_capture_cut_short_in_its_exchange_raises_the_exchange_error(interp):
    """NCCL refusing the all_gather inside a capture invalidates it: the cut-short path must
    not launch into it (its error would hide the exchange's), and the next step starts with
    no sites. The capture state is stood in for: there is no CUDA here."""
    from gpupace.backends.device import DeviceEngine

    class Capturing(DeviceEngine):
        capturing = False

        def _check_capture(self):
            return self.capturing

        def _reset_row(self):
            if self.capturing:
                raise RuntimeError("operation not permitted when stream is capturing")
            super()._reset_row()

    eng = Capturing(PaceConfig(mode="observe", max_sites=2), None, 0, 1, device="cpu")
    eng.exit(eng.arrive())
    eng.end_step(0, 0.0)
    eng.capturing = True
    eng.exit(eng.arrive())

    def refused():
        raise ValueError("the exchange's own error")

    eng._exchange = refused
    with pytest.raises(ValueError, match="the exchange's own error"):
        eng.end_step(1, 0.0)
    assert eng.n_sites == 0


@pytest.mark.parametrize("fork, capturing, generation, action", [
    (None, False, 3, "drop"),  # no collective went through issue() this step
    (None, True, 3, "drop"),
    ((3, False), False, 3, "join"),  # eager step
    ((3, True), True, 3, "join"),  # the whole step captured
    ((2, False), True, 3, "drop"),  # an eager step's fork, never joined, met by a capture
    ((2, True), False, 3, "drop"),  # a failed capture's fork, met by an eager step
    ((3, False), True, 3, "refuse"),  # eager collectives, captured step()
    ((3, True), False, 3, "refuse"),  # captured collectives, eager step()
])
def test_pacing_stream_join_never_crosses_a_capture_boundary(fork, capturing, generation,
                                                             action):
    """The device engine joins its pacing stream back at the end of a step only in the
    capture state it was forked in: a capturing stream waiting on an uncaptured event (or the
    reverse) is a CUDA error that invalidates the capture."""
    from gpupace.backends.device import join_action

    assert join_action(fork, capturing, generation) == action


def test_engine_site_buffers_are_the_states_so_the_update_resets_them(interp):
    from gpupace.backends.device import DeviceEngine

    eng = DeviceEngine(PaceConfig(mode="observe", max_sites=3), None, 0, 1, device="cpu")
    assert eng.usual.data_ptr() == eng.state["usual"].data_ptr()
    assert eng.stamps.data_ptr() == eng.state["stamps"].data_ptr()
    for n_sites in (3, 1):  # three sites a step, then one: the two that went are reset
        for _ in range(2):
            for _ in range(n_sites):
                eng.clk[1] += 1000  # the clock-free path's virtual clock, in ns
                eng.exit(eng.arrive())
            eng.end_step(0, 0.0)
    assert torch.isnan(eng.usual[1:]).all() and (eng.stamps[1:, 2] == 0).all()
    assert eng.stamps[0, 2] != 0  # the site kept keeps its last exit


def test_a_record_of_a_step_the_host_did_not_see_counts_on_from_the_nearest_it_did():
    """Graph replays move the device's step counter unseen: their records take the step of
    the nearest eager call the engine holds, counted on (a resumed pacer's steps are not its
    calls), with no host time."""
    from collections import deque
    from types import SimpleNamespace

    from gpupace.backends.device import DeviceEngine

    engine = SimpleNamespace(_times=deque([(5, 105, 1.5), (6, 106, 2.5)]))
    assert DeviceEngine._time_of(engine, 6) == (106, 2.5)
    step, t = DeviceEngine._time_of(engine, 9)
    assert step == 109 and math.isnan(t)
    assert DeviceEngine._time_of(engine, 2)[0] == 102  # older than the calls held
    assert DeviceEngine._time_of(SimpleNamespace(_times=deque()), 3)[0] == 3
