"""A pacer's state in a checkpoint (`Pacer.state_dict`, `load_state_dict`): gathered from real
gloo ranks, saved with torch.save from one rank, read back with torch.load's default
weights_only, taken over by a restarted job's pacers; and what a load refuses."""

import copy
import os
import re
import time
import warnings

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gpupace import PaceConfig, Pacer, checkpoint
from gpupace.launch import run_ranks

pytestmark = pytest.mark.timeout(150)

# The holdoff: 8 calm steps for each rank that has been last (rank 2 alone here), before an
# early rank's floor may rise.
CONFIG = PaceConfig(mode="pace", warmup_steps=2, on_steps=1, holdoff_factor=8.0,
                    threshold_us=50.0, release_us=10.0)
LATE_S = 0.02  # rank 2's handicap, every step


def _steps(pacer: Pacer, rank: int, world: int, n: int) -> list[float]:
    """`n` steps of one paced all_reduce, rank world-1 late by LATE_S; this rank's next delay
    after each."""
    delays = []
    for _ in range(n):
        time.sleep(LATE_S if rank == world - 1 else 0.0)
        pacer.all_reduce(torch.ones(8))
        pacer.step()
        delays.append(float(pacer.next_delays_us[0]) if pacer.next_delays_us.size else 0.0)
    return delays


def _restart(rank: int, world: int, path: str):
    first = Pacer(CONFIG)
    learnt = _steps(first, rank, world, 20)
    saved = first.state_dict()  # a collective: every rank
    if rank == 0:
        torch.save({"pacer": saved}, path)
    dist.barrier()
    # The restarted job: a new pacer takes the file over, beside one that starts afresh.
    resumed, fresh = Pacer(CONFIG), Pacer(CONFIG)
    resumed.load_state_dict(torch.load(path)["pacer"])  # torch's default: weights_only=True
    return learnt, saved, _steps(resumed, rank, world, 6), _steps(fresh, rank, world, 6)


def test_a_restarted_job_paces_at_once_from_the_saved_state(tmp_path):
    results = run_ranks(_restart, 3, str(tmp_path / "ckpt.pt"))
    saved = results[0][1]
    for _, other, _, _ in results[1:]:  # every rank gets the same dict
        assert other.keys() == saved.keys()
        for key, value in saved.items():
            assert torch.equal(value, other[key]) if torch.is_tensor(value) else value == other[key]
    assert saved["world_size"] == 3 and saved["sites"] == 1 and saved["active"].tolist() == [True]
    assert saved["floor"][:2, 0].min() > 1000.0 and saved["floor"][2, 0] < 1000.0
    for early in (0, 1):
        learnt, _, resumed, fresh = results[early]
        # The warm-up's 2 steps, then held off until its 8th calm step's update lets the
        # floor rise, then paced (on most steps: a loaded VM can hold an early rank back).
        assert max(learnt[:2 + 7]) == 0.0 and np.median(learnt[-4:]) > 1000.0, learnt
        # Resumed: the warm-up's 2 steps again, then paced at once; afresh: held off.
        assert resumed[:2] == [0.0, 0.0] and np.median(resumed[2:]) > 1000.0, resumed
        assert fresh == [0.0] * 6, fresh
    assert sum(d > 0 for d in results[2][2]) <= 1  # the late rank: not paced


def _ddp(config: PaceConfig):
    """A 6-layer model under DDP, three gradient buckets after the first step (which has one),
    paced by a pacer of `config`."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(256, 256) for _ in range(6)])
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.3)
    pacer = Pacer(config)
    pacer.attach(ddp)
    return pacer, ddp, torch.optim.SGD(ddp.parameters(), lr=1e-4)


def _train(pacer, ddp, opt, rank: int, world: int, n: int) -> list[tuple[int, list[float]]]:
    """`n` steps, rank world-1 late by 10 ms: each step's site count and this rank's next
    delays."""
    seen = []
    for _ in range(n):
        time.sleep(0.01 if rank == world - 1 else 0.0)
        ddp(torch.randn(4, 256)).sum().backward()
        opt.step()
        opt.zero_grad()
        pacer.step()
        seen.append((pacer._sites_last_step, [float(x) for x in pacer.next_delays_us]))
    return seen


def _ddp_restart(rank: int, world: int, path: str):
    cfg = PaceConfig(mode="pace", warmup_steps=2, on_steps=1, holdoff_factor=2.0,
                     threshold_us=50.0, release_us=10.0)
    first = _ddp(cfg)
    learnt = _train(*first, rank, world, 14)
    saved = first[0].state_dict()
    if rank == 0:
        torch.save({"pacer": saved}, path)
    dist.barrier()
    again = _ddp(cfg)  # the restarted job: a new model, whose first step has one bucket
    again[0].load_state_dict(torch.load(path)["pacer"])
    resumed = _train(*again, rank, world, 5)
    # A load in the middle of a run: the next step applies no delay planned before it.
    first[0].load_state_dict(saved)
    return learnt, saved["sites"], resumed, first[0].next_delays_us.tolist()


def test_a_restarted_ddp_job_paces_every_bucket_after_its_first_step_of_one(tmp_path):
    """DDP's first step has one bucket: it left a loaded state with its first site's alone
    (the others waited out the holdoff again, which the checkpoint is there to spare)."""
    for rank, (learnt, sites, resumed, after_load) in enumerate(
            run_ranks(_ddp_restart, 2, str(tmp_path / "ckpt.pt"))):
        assert learnt[0][0] == 1 and learnt[-1][0] == sites == 3
        assert after_load == [0.0, 0.0, 0.0]  # nothing planned survives a load
        if rank == 0:
            # every bucket paced (on most steps: a loaded VM can hold an early rank back)
            assert sum(min(d) > 1000.0 for _, d in learnt[-4:]) >= 2, learnt[-4:]
            assert [n for n, _ in resumed] == [1, 3, 3, 3, 3]
            # the warm-up's 2 steps, then every bucket delayed at once: each on some step of
            # the 3 after it (a fresh pacer's are exactly 0 through its holdoff). Not every
            # bucket on every step: a loaded VM shrank one bucket's to 414 us beside 2-4 ms (a
            # clean clone's CI run), and zeroed the last one's on 2 of the 3 steps (a fresh
            # clone's run, 2026-12-02: the deadline takes a rank's lateness off its delay)
            delays = np.array([d for _, d in resumed[2:]])
            assert delays.shape == (3, 3) and (delays.max(axis=0) > 0.0).all(), resumed
        else:
            assert all(max(d, default=0.0) == 0.0 for _, d in resumed)  # the late rank


def _rank0_alone(rank: int, world: int):
    """state_dict() inside `if rank == 0`, the others going on without it."""
    pacer = Pacer(CONFIG)
    if rank != 0:
        time.sleep(1.0)  # and leaves: its process group goes with it
        return None
    try:
        pacer.state_dict()
    except RuntimeError as e:
        return str(e)
    return None


def test_state_dict_on_one_rank_alone_fails_saying_it_is_a_collective():
    """Called inside `if rank == 0`, the all_gather waits for ranks that never come: it fails
    with the process group's error, now saying what went wrong."""
    said, _ = run_ranks(_rank0_alone, 2, collective_timeout_s=10, timeout_s=60)
    assert said is not None and "state_dict() is a collective" in said, said
    assert "never inside `if rank == 0`" in said


def _saved(world: int = 2, sites: int = 1) -> dict:
    floor = torch.full((world, sites), 300.0)
    return {"format": checkpoint.FORMAT, "world_size": world, "sites": sites, "floor": floor,
            "calm": torch.full((world, sites), 9), "mean": floor.clone(),
            "var": torch.full((world, sites), 25.0), "active": torch.ones(sites, dtype=bool),
            "above": torch.zeros(sites, dtype=torch.int64),
            "below": torch.zeros(sites, dtype=torch.int64)}


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update(world_size=4), "saved by a job of 4 ranks, and this pacer has 2"),
    (lambda s: s.update(group_ranks=[2, 3]), "saved by the pacer of data-parallel group "
                                             "[2, 3], and this pacer's is the whole world"),
    (lambda s: s.update(format="other"), "not a gpupace pacer state"),
    (lambda s: s.update(sites=-1), "'sites' must be an integer >= 0, got -1"),
    (lambda s: s.update(floor=torch.zeros(2, 3)), "'floor' must be a tensor of shape (2, 1)"),
    (lambda s: s.pop("calm"), "'calm' must be a tensor of shape (2, 1), got NoneType"),
    (lambda s: s["mean"].fill_(float("nan")), "'mean' holds nan, a value no pacer saves"),
    (lambda s: s["floor"].fill_(-1.0), "'floor' holds -1.0, a value no pacer saves"),
    (lambda s: s.update(world_size=None), "'world_size' must be the saving job's rank count, "
                                          "got None"),
    (lambda s: s["var"].fill_(-2.0), "'var' holds values below -1"),
    (lambda s: s.update(last_seen=torch.full((2, 1), 2)), "'last_seen' holds values other "
                                                          "than 0 and 1"),
    (lambda s: s.update(last_seen=torch.ones(1)), "'last_seen' must be a tensor of shape (2, 1)"),
])
def test_a_state_no_pacer_of_this_job_saved_is_refused_saying_why(change, message):
    saved = _saved()
    change(saved)
    with pytest.raises(ValueError, match=re.escape(message)):
        checkpoint.unpack(saved, world_size=2, max_sites=8)
    with pytest.raises(ValueError, match="not a gpupace pacer state"):
        checkpoint.unpack([1, 2], world_size=2, max_sites=8)


def test_a_state_refused_says_what_to_do_instead():
    """The whole checkpoint given in place of its pacer entry said 'got None'; a group's
    state loaded by a whole-world pacer (group= forgotten at the restart) said the job had
    another size and to start without it."""
    with pytest.raises(ValueError, match=re.escape("a dict whose 'pacer' entry is one: pass "
                                                   "state['pacer']")):
        checkpoint.unpack({"model": {}, "pacer": _saved()}, world_size=2, max_sites=8)
    group = {**_saved(), "group_ranks": [0, 1]}
    with pytest.raises(ValueError, match=re.escape("saved by the pacer of data-parallel group "
                                                   "[0, 1], and this pacer's is the whole world: "
                                                   "build the pacer on that group")):
        checkpoint.unpack(group, world_size=4, max_sites=8)


def test_a_state_of_more_sites_than_max_sites_keeps_the_first_and_none_is_no_state():
    out = checkpoint.unpack(_saved(sites=5), world_size=2, max_sites=3)
    assert out["floor"].shape == (2, 3) and out["active"].shape == (3,)
    assert checkpoint.unpack({**_saved(), "sites": 0}, world_size=2, max_sites=3) is None


def test_a_state_saved_before_last_seen_was_kept_loads_with_the_holdoff_of_its_day():
    """States saved before 2026-12-01 hold no 'last_seen' (`_saved`): every rank is taken for a
    past straggler, so that the holdoff stays holdoff_factor x N, as when they were saved. The
    count of ranks last at each site follows from the flags."""
    old = checkpoint.unpack(_saved(sites=3), world_size=2, max_sites=2)
    assert old["last_seen"].tolist() == [[True, True]] * 2 and old["n_last"].tolist() == [2, 2]
    flags = torch.tensor([[True, False], [False, False]])
    new = checkpoint.unpack({**_saved(sites=2), "last_seen": flags}, world_size=2, max_sites=8)
    assert new["last_seen"].tolist() == flags.tolist() and new["n_last"].tolist() == [1, 0]


def test_a_single_rank_pacer_saves_and_loads_without_a_process_group():
    pacer = Pacer(PaceConfig(mode="pace"))
    assert pacer.state_dict()["sites"] == 0  # nothing learnt yet
    pacer.load_state_dict(_saved(world=1, sites=2))
    assert pacer.state_dict()["floor"].tolist() == [[300.0, 300.0]]
    with pacer.collective("grads"):  # refused inside a step
        with pytest.raises(RuntimeError, match="inside a step"):
            pacer.state_dict()
    with pytest.raises(RuntimeError, match="copied pacer"):
        copy.deepcopy(pacer).load_state_dict(_saved(world=1))


@pytest.mark.parametrize("sites, max_sites", [(2, 64), (3, 64), (3, 2)])
def test_a_checkpoint_of_other_sites_than_the_models_is_warned_about(sites, max_sites):
    """Sites are matched by order: a model whose buckets changed (bucket_cap_mb, its layers)
    took a checkpoint's floors into the wrong buckets without a word. The second step with
    sites is compared (a DDP model's first has one bucket)."""
    pacer = Pacer(PaceConfig(mode="pace", max_sites=max_sites))
    pacer.load_state_dict(_saved(world=1, sites=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(4):
            for k in range(1 if step == 0 else sites):
                with pacer.collective(f"bucket{k}"):
                    pass
            pacer.step()
    said = [str(w.message) for w in caught if "checkpoint loaded" in str(w.message)]
    if sites == 2 or max_sites == 2:  # a state holds max_sites sites, a step more
        assert said == []
    else:
        assert said == ["gpupace: the checkpoint loaded holds 2 paced sites and this step has 3: "
                        "sites are matched by order, so what was learnt at one DDP bucket now "
                        "paces another (the model, its bucket_cap_mb or its dtypes changed?); "
                        "start without the checkpoint's pacer state if so"]


def _one_rank_steps(pacer: Pacer, n: int) -> list[int | None]:
    """`n` steps of one paced block (no collective: one rank); the step of each record."""
    out = []
    for _ in range(n):
        with pacer.collective("grads"):
            time.sleep(0.001)
        record = pacer.step()
        out.append(None if record is None else record.step)
    return out


def test_a_resumed_pacer_numbers_its_steps_on_from_the_checkpoint(tmp_path):
    """A job saves at step 5, runs 3 more and dies; its restart loads the state: its records,
    telemetry file and TensorBoard points go on from step 5, TensorBoard hides the dead run's
    points from there, and summary() and the report leave out the warm-up after the restart."""
    pytest.importorskip("tensorboard", reason="needs tensorboard (pip install tensorboard)")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from gpupace.report.load import load_runs
    from gpupace.telemetry import read_header

    cfg = PaceConfig(mode="observe", warmup_steps=2, telemetry_path=str(tmp_path / "run.jsonl"))
    first = Pacer(cfg, tensorboard_dir=tmp_path / "tb")
    assert _one_rank_steps(first, 5) == [0, 1, 2, 3, 4]
    saved = first.state_dict()
    assert saved["steps"] == 5
    _one_rank_steps(first, 3)  # steps 5-7, lost with the job
    first.close()

    with pytest.warns(RuntimeWarning, match=r"already held a run: kept it as .*run.jsonl.1"):
        resumed = Pacer(cfg, tensorboard_dir=tmp_path / "tb")
    resumed.load_state_dict(saved)
    assert _one_rank_steps(resumed, 4) == [5, 6, 7, 8]
    assert resumed.summary()["steps"] == 2  # 7 and 8: 5 and 6 are the restart's warm-up
    resumed.close()

    header = read_header(tmp_path / "run.jsonl")
    assert header["resumed_at_step"] == 5 and header["first_measured_step"] == 7
    [run] = load_runs([tmp_path / "run.jsonl"])
    assert run.step.tolist() == [5, 6, 7, 8] and run.first_measured_step == 7
    assert read_header(tmp_path / "run.jsonl.1").get("resumed_at_step") is None  # the first

    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    # step 0 and the restart's first step have no step time (one exit alone)
    assert [e.step for e in acc.Scalars("gpupace/step_time_ms")] == [1, 2, 3, 4, 6, 7, 8]


def test_a_pacer_that_has_stepped_keeps_its_count_and_a_bad_count_is_refused():
    saved = {**_saved(world=1), "steps": 40}
    pacer = Pacer(PaceConfig(mode="observe"))
    _one_rank_steps(pacer, 3)
    pacer.load_state_dict(saved)
    assert _one_rank_steps(pacer, 1) == [3]  # its own records go on as they were
    fresh = Pacer(PaceConfig(mode="observe"))
    for bad in (-1, 2.5, True, "40"):
        with pytest.raises(ValueError, match="'steps' must be an integer >= 0"):
            fresh.load_state_dict({**saved, "steps": bad})
    assert fresh.state_dict()["sites"] == 0  # nothing taken from a refused state
    fresh.load_state_dict({k: v for k, v in saved.items() if k != "steps"})  # an older state
    assert _one_rank_steps(fresh, 1) == [0]
    # Two loads before a step: the second's count with its state (it kept the first's count)
    twice = Pacer(PaceConfig(mode="observe"))
    twice.load_state_dict({**saved, "steps": 30})
    twice.load_state_dict({**saved, "steps": 10})
    assert _one_rank_steps(twice, 1) == [10]


def test_a_telemetry_file_that_fails_at_a_resume_warns_and_the_load_goes_on(tmp_path):
    """A full disk when the resumed header is rewritten raised from load_state_dict() on the
    writing rank alone (the others went on to their next collective), the load half done."""
    saved = {**_saved(world=1), "steps": 40}
    pacer = Pacer(PaceConfig(mode="observe", telemetry_path=str(tmp_path / "run.jsonl")))
    writer = pacer._writer
    full = os.open("/dev/full", os.O_WRONLY)  # the disk fills up under the writer
    os.dup2(full, writer._file.fileno())
    os.close(full)
    with pytest.warns(RuntimeWarning, match="failed, training goes on without it"):
        pacer.load_state_dict(saved)
    assert pacer._writer is None and _one_rank_steps(pacer, 1) == [40]
    pacer.close()


def test_summary_leaves_out_the_warm_up_a_load_in_the_middle_of_a_run_starts_again():
    """A pacer that has stepped keeps its count when it loads a state, and its warm-up runs
    again: summary() counted those steps, which measure and pace nothing, among the paced."""
    pacer = Pacer(PaceConfig(mode="observe", warmup_steps=3))

    def steps(n):
        for _ in range(n):
            with pacer.site("x"):
                pass
            pacer.step()

    steps(20)
    assert pacer.summary()["steps"] == 17
    pacer.load_state_dict(pacer.state_dict())
    steps(10)
    assert pacer.steps == 30 and pacer.summary()["steps"] == 17 + 7
