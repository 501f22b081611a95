"""The telemetry file: NaN and infinity round trips, flushing every interval, bad files."""

import contextlib
import json
import math
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from gpupace import PaceConfig
from gpupace.summary import summarize
from gpupace.telemetry import (
    END_FIELDS,
    StepRecord,
    TelemetryWriter,
    first_measured_step,
    make_header,
    read_header,
    read_telemetry,
)


def record(k: int, **kw) -> StepRecord:
    base = dict(step=k, time_s=0.01 * k, step_time_us=1000.0 + k, spread_us=50.0, residual_us=5.0,
                transfer_us=100.0, straggler=1, active=False, earliness_us=[50.0, 0.0],
                wait_us=[150.0, 100.0], delay_us=[0.0, 0.0], step_times_us=[1000.0, 1000.0],
                site_spread_us=[50.0])
    base.update(kw)
    return StepRecord(**base)


def test_non_finite_values_are_written_as_null_and_read_back_as_nan(tmp_path):
    path = tmp_path / "t.jsonl"
    w = TelemetryWriter(path, make_header(source="test", world_size=2), interval=1)
    w.write(record(0, step_time_us=math.nan, spread_us=math.inf, residual_us=-math.inf,
                   wait_us=[math.nan, 1.0]))
    w.close()
    line = path.read_text().splitlines()[1]
    assert "NaN" not in line and "Infinity" not in line
    assert json.loads(line)["spread_us"] is None
    rec = read_telemetry(path).records[0]
    assert math.isnan(rec.step_time_us) and math.isnan(rec.spread_us) and math.isnan(rec.wait_us[0])
    assert rec.wait_us[1] == 1.0


def test_arrays_are_written_to_the_nanosecond(tmp_path):
    """Times in us, written with 3 decimals (1 ns): half the encoding time and the file."""
    path = tmp_path / "t.jsonl"
    w = TelemetryWriter(path, make_header(source="test", world_size=2))
    w.write(record(0, earliness_us=np.array([123.4567891, np.nan])))
    w.close()
    assert '"earliness_us":[123.457,null]' in path.read_text()
    got = read_telemetry(path).records[0].earliness_us
    assert got[0] == 123.457 and np.isnan(got[1])


def test_records_compare_by_value():
    a = record(1, wait_us=np.array([150.0, 100.0]))
    assert a == record(1) and a != record(1, wait_us=np.array([150.0, 99.0]))
    assert a != record(2) and a != record(1, wait_us=np.array([150.0]))


def test_records_reach_the_file_every_interval_before_close(tmp_path):
    path = tmp_path / "t.jsonl"
    w = TelemetryWriter(path, make_header(source="test", world_size=2), interval=3)
    for k in range(7):
        w.write(record(k))
    # not closed: a crash now loses at most the last interval
    assert len(read_telemetry(path).records) == 6
    w.close()
    assert len(read_telemetry(path).records) == 7
    with pytest.raises(ValueError, match="closed"):
        w.write(record(8))


def test_flush_writes_what_the_interval_held_back(tmp_path):
    path = tmp_path / "t.jsonl"
    w = TelemetryWriter(path, make_header(source="test", world_size=2), interval=1000)
    for k in range(5):
        w.write(record(k))
    assert len(read_telemetry(path).records) == 0  # held in the file's buffer
    w.flush()
    assert [r.step for r in read_telemetry(path).records] == list(range(5))
    w.close()


def test_background_writer_keeps_every_record_in_order(tmp_path):
    """What a Pacer uses: `write` only queues; the thread encodes and writes; close drains."""
    path = tmp_path / "t.jsonl"
    w = TelemetryWriter(path, make_header(source="test", world_size=2), interval=7,
                        background=True)
    for k in range(500):
        w.write(record(k, earliness_us=[float(k), 0.0]))
    w.close()
    recs = read_telemetry(path).records
    assert [r.step for r in recs] == list(range(500))
    assert [r.earliness_us[0] for r in recs] == [float(k) for k in range(500)]
    with pytest.raises(ValueError, match="closed"):
        w.write(record(500))
    w.close()  # twice: nothing left to do


def test_background_writer_failure_reaches_the_caller(tmp_path):
    path = tmp_path / "t.jsonl"
    w = TelemetryWriter(path, make_header(source="test", world_size=2), interval=1,
                        background=True)
    w.write(record(0))
    w.close()
    assert len(read_telemetry(path).records) == 1
    w = TelemetryWriter(path, make_header(source="test", world_size=2), interval=1,
                        background=True)
    w.write(record(0, earliness_us=[object()]))  # not JSON: the thread's encoding fails
    with pytest.raises(RuntimeError, match="telemetry writer .* failed"):
        w.close()


def test_cut_and_corrupt_lines_are_skipped_and_listed(tmp_path):
    path = tmp_path / "t.jsonl"
    header = json.dumps(make_header(source="test", world_size=2))
    nested = record(3).to_json().replace('"wait_us":[150.0,100.0]', '"wait_us":[[150.0],100.0]')
    words = record(4).to_json().replace('"delay_us":[0.0,0.0]', '"delay_us":["a",0.0]')
    path.write_text("\n".join([header, record(0).to_json(), "{not json", '{"step": 1}',
                               record(2).to_json()[:40], nested, words]) + "\n")
    tel = read_telemetry(path)
    assert [r.step for r in tel.records] == [0]
    assert len(tel.skipped) == 5 and tel.skipped[0].startswith("line 3:")
    assert tel.skipped[3].startswith("line 6: ValueError") and tel.skipped[4].startswith("line 7")
    # A line read back holds float64 arrays, a null as NaN.
    assert tel.records[0].wait_us.dtype == np.float64 and tel.records[0].wait_us[1] == 100.0


@pytest.mark.parametrize("edit, message", [
    (("step", "x"), "step must be a 64-bit integer, got 'x'"),
    (("step", None), "step must be a 64-bit integer, got None"),
    (("straggler", None), "straggler must be a 64-bit integer"),
    (("step", 10**20), "step must be a 64-bit integer, got 100000000000000000000"),
    (("straggler", -2**63 - 1), "straggler must be a 64-bit integer"),
    (("earliness_us", 5), "earliness_us must be a list of numbers, got 5"),
    (("earliness_us", "abc"), "earliness_us must be a list of numbers, got 'abc'"),
    (("spread_us", "1"), "spread_us must be a number or null, got '1'"),
    (("active", 1), "active must be true or false, got 1"),
])
def test_a_record_with_a_value_of_the_wrong_kind_is_skipped_naming_it(tmp_path, edit, message):
    """Valid JSON with a wrong value (a hand-edited or foreign file): the record is skipped
    and the field named, not a crash (a TypeError, NaN to int) when the report reads it."""
    path = tmp_path / "t.jsonl"
    bad = json.loads(record(1).to_json())
    bad[edit[0]] = edit[1]
    path.write_text("\n".join([json.dumps(make_header(source="test", world_size=2)),
                               record(0).to_json(), json.dumps(bad)]) + "\n")
    tel = read_telemetry(path)
    assert [r.step for r in tel.records] == [0]
    assert len(tel.skipped) == 1 and message in tel.skipped[0], tel.skipped


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("", "is empty"),
    ("[1, 2]\n", "not a gpupace telemetry header"),
    ('{"gpupace": "telemetry", "format": 99}\n', "newer than this gpupace reads"),
    ('{"gpupace": "telemetry", "format": "2"}\n', "'format' must be a non-negative integer"),
    ('{"gpupace": "telemetry", "world_size": "abc"}\n', "'world_size' must be a non-negative"),
    ('{"gpupace": "telemetry", "rank": -1}\n', "'rank' must be a non-negative integer, got -1"),
    ('{"gpupace": "telemetry", "world_size": 1000000000}\n', "past the 1048576 ranks"),
])
def test_bad_files_name_themselves(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_telemetry(path)


def test_a_directory_is_not_a_telemetry_file(tmp_path):
    with pytest.raises(ValueError, match=f"{tmp_path} is a directory: give one .jsonl file"):
        read_telemetry(tmp_path)


def test_summary_figures():
    recs = [record(k, step_time_us=t, straggler=s)
            for k, (t, s) in enumerate([(math.nan, 0), (1000.0, 1), (3000.0, 1), (2000.0, 0)])]
    out = summarize(recs, world_size=2, samples_per_step=10)
    assert out["steps"] == 4
    assert out["step_time_mean"] == pytest.approx(2000.0)
    assert out["throughput"] == pytest.approx(10 * 1e6 / 2000.0)
    assert out["step_time_cv"] == pytest.approx((2 / 3) ** 0.5 * 1000 / 2000)
    assert out["straggler_histogram"] == [2, 2]
    # A plain dict (JSON as it is) that prints as a table in ms, naming the ranks most often last.
    assert json.loads(json.dumps(out))["steps"] == 4
    text = str(out).splitlines()
    assert text[0] == "gpupace summary: 4 steps" and "throughput (samples/s)" in text[1]
    assert any(line.startswith("step time mean (ms)") and line.endswith(" 2.00") for line in text)
    assert text[-1] == "most often last: rank 0 (2 steps), rank 1 (2 steps)"
    assert "throughput (steps/s)" in str(summarize(recs, world_size=2))
    one = summarize(recs[:2], world_size=2)
    assert str(one).splitlines()[-1] == "most often last: rank 0 (1 step), rank 1 (1 step)"


def test_every_summary_figure_from_distinct_records():
    """Each figure against NumPy on records whose step times, spreads, entry spreads, delays
    and switch states all differ (a summary that read p50 for p99, the arrival spread for the
    entry spread or forgot to divide the delays by the ranks passed the test above)."""
    rng = np.random.default_rng(3)
    n, world = 40, 3
    st = rng.uniform(900.0, 5000.0, n)
    st[0] = math.nan  # the first step has none
    sp, entry = rng.uniform(10.0, 900.0, n), rng.uniform(0.0, 40.0, n)
    sp[5], entry[7] = math.nan, math.inf  # unknown at those steps: left out, not zeros
    delays = rng.uniform(0.0, 300.0, (n, world)) * (rng.random((n, 1)) < 0.4)
    active = rng.random(n) < 0.6
    recs = [record(k, step_time_us=st[k], spread_us=sp[k], residual_us=entry[k],
                   active=bool(active[k]), delay_us=list(delays[k]), straggler=k % world,
                   earliness_us=[0.0] * world) for k in range(n)]
    out = summarize(recs, world_size=world, samples_per_step=8)
    known, sp_known, entry_known = st[1:], np.delete(sp, 5), np.delete(entry, 7)
    want = {
        "step_time_mean": known.mean(), "step_time_cv": known.std() / known.mean(),
        "step_time_p50": np.percentile(known, 50), "step_time_p99": np.percentile(known, 99),
        "step_time_max": known.max(), "throughput": 8 * 1e6 / known.mean(),
        "spread_mean": sp_known.mean(), "spread_p99": np.percentile(sp_known, 99),
        "entry_spread_mean": entry_known.mean(),
        "entry_spread_p99": np.percentile(entry_known, 99),
        "delay_mean": delays.sum() / n / world, "active_fraction": active.mean(),
        "delayed_fraction": (delays > 0).any(axis=1).mean(),
    }
    for key, value in want.items():
        assert out[key] == pytest.approx(value, rel=1e-12), key
    assert 0 < out["delayed_fraction"] < out["active_fraction"] < 1  # inputs tell them apart
    assert out["step_time_p50"] < out["step_time_p99"] < out["step_time_max"]
    assert out["straggler_histogram"] == [14, 13, 13]


def test_chunked_encoding_is_the_same_text():
    """The background writer encodes long lists in chunks; the line must not change."""
    r = record(3, step_time_us=math.nan, earliness_us=[0.5 * k for k in range(1500)],
               wait_us=[math.inf] * 700 + [1.0] * 800, delay_us=[math.nan] * 513)
    assert r.to_json(chunk=512) == r.to_json() == r.to_json(chunk=1)


def test_first_measured_step_comes_from_the_header():
    assert first_measured_step({"config": {"warmup_steps": 5}}) == 5
    assert first_measured_step({"config": {"warmup_steps": 5}, "first_measured_step": 30}) == 30
    assert first_measured_step({"source": "sim", "config": {"warmup_steps": 5}}) == 0
    assert first_measured_step({"first_measured_step": True, "config": {}}) == 0
    assert first_measured_step({}) == 0
    # a corrupt one is no step number: the config's warm-up, not none at all
    assert first_measured_step({"first_measured_step": -5, "config": {"warmup_steps": 5}}) == 5


def test_make_record_sums_sites_as_nansum_and_picks_the_site_of_largest_spread():
    """The record's per-rank totals leave NaN out (as np.nansum over sites); its scalars come
    from the first site of largest spread, a NaN spread counting as none; a rank whose row
    the policy found invalid has no earliness (NaN)."""
    from gpupace import policy
    from gpupace.telemetry import make_record

    rng = np.random.default_rng(5)
    n, s = 6, 3
    rows = rng.uniform(0, 500, (n, 2 + 2 * s))
    w, d, steps = rows[:, 2:2 + s], rows[:, 2 + s:], rows[:, 1]
    w[1, 2], d[4, 0], w[5], d[5, 1] = np.nan, np.inf, np.nan, np.nan
    params = policy.PolicyParams.from_config(PaceConfig(mode="observe"), n)
    _, stats = policy.update(params, policy.init_state(n, s), w, d, steps)
    stats.spread[:] = [np.nan, 40.0, 40.0]
    rec = make_record(7, 1.5, stats, steps, rank=2)
    np.testing.assert_allclose(rec.wait_us, np.nansum(w, axis=1))
    np.testing.assert_allclose(rec.delay_us, np.nansum(d, axis=1))
    assert rec.wait_us[5] == 0.0 and rec.delay_us[4] == np.inf
    assert rec.spread_us == 40.0 and rec.step_time_us == steps[2]
    # Earliness at site 1 behind the last valid arrival; invalid rows (ranks 1, 4, 5) NaN.
    arrival = (w + d)[:, 1]
    want = arrival - arrival[[0, 2, 3]].min()
    want[[1, 4, 5]] = np.nan
    np.testing.assert_allclose(rec.earliness_us, want)
    np.testing.assert_array_equal(rec.step_times_us, steps)
    assert rec.site_spread_us[0] != rec.site_spread_us[0]  # NaN kept per site
    # Copies: the next in-place update reuses the buffers the record was made from.
    sources = (rows, stats.wait, stats.applied, stats.spread, stats.lowest, stats.valid)
    for name in ("earliness_us", "wait_us", "delay_us", "step_times_us", "site_spread_us"):
        a = getattr(rec, name)
        assert isinstance(a, np.ndarray) and a.dtype == np.float64, name
        assert not any(np.shares_memory(a, b) for b in sources), name


def test_a_record_of_read_only_inputs_is_made_from_copies():
    """The NumPy update passes float64 inputs through as they are, read-only ones too; the
    record's compiled pass, which takes writable ones only, then works on copies."""
    from gpupace import policy
    from gpupace.telemetry import make_record

    n, s = 4, 2
    w, d, steps = np.full((n, s), 300.0), np.zeros((n, s)), np.full(n, 2e4)
    w[1] += 500.0
    for a in (w, d, steps):
        a.flags.writeable = False
    params = policy.PolicyParams.from_config(PaceConfig(mode="observe"), n)
    _, stats = policy.update(params, policy.init_state(n, s), w, d, steps, fused=False)
    assert not stats.wait.flags.writeable  # what the compiled pass would refuse
    stats.valid.flags.writeable = False  # and stats built or edited by hand
    stats.spread = stats.spread.astype(np.float32)
    rec = make_record(0, 0.0, stats, steps, 0)
    np.testing.assert_array_equal(rec.earliness_us, [0.0, 500.0, 0.0, 0.0])  # rank 1 early
    np.testing.assert_array_equal(rec.wait_us, [600.0, 1600.0, 600.0, 600.0])


def test_threads_that_make_their_first_record_and_update_together_all_get_one():
    """The compiled record pass and policy kernel are readied on first use, once: before a
    lock, a thread that came second found compiling disabled by the first and raised
    (5 of 6 threads, reproduced). A fresh process, so that nothing is ready yet."""
    script = """
import threading
import numpy as np
from gpupace import PaceConfig, policy
from gpupace.telemetry import make_record

n, s = 300, 3  # large enough for the fused kernel by default
rng = np.random.default_rng(1)
w, d, steps = rng.uniform(0, 500, (n, s)), np.zeros((n, s)), np.full(n, 2e4)
params = policy.PolicyParams.from_config(PaceConfig(mode="observe"), n)
start, out = threading.Barrier(6), []

def run():
    start.wait()
    try:
        stats = policy.update(params, policy.init_state(n, s), w, d, steps)[1]
        out.append(make_record(0, 0.0, stats, steps, 0).spread_us)
    except Exception as e:
        out.append(repr(e))

threads = [threading.Thread(target=run) for _ in range(6)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(out)
assert len(set(out)) == 1 and isinstance(out[0], float), out
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=100)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_ring_is_bounded_by_memory_as_well_as_by_count():
    """~0.13 MB a record at 4096 ranks: the default 100,000 records would take 13 GB on every
    rank; 128 MB keeps ~960. A small job keeps `ring_size` records."""
    from gpupace.telemetry import ring_capacity

    cfg = PaceConfig()
    assert 900 < ring_capacity(cfg.ring_size, cfg.ring_memory_mb, 4096, 64) < 1000
    assert ring_capacity(cfg.ring_size, cfg.ring_memory_mb, 2, 4) == cfg.ring_size
    assert ring_capacity(10, 1e-9, 4096, 4) == 1  # never less than one


def test_a_background_writer_that_falls_behind_warns_then_drops_and_counts_the_drops(tmp_path):
    """Past 64 MB of queued records (~120 at 16384 ranks) the writer warns; past 256 MB it
    drops records and counts them in the next record it writes, so the file says what it
    lacks. (The writer sizes a record by its earliness: one wide list keeps the test quick.)"""
    path = tmp_path / "t.jsonl"
    w = TelemetryWriter(path, make_header(source="test", world_size=16384), background=True)
    wide = np.full(16384, 0.5)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with w._lock:  # the thread cannot write while the file is held: steps outrun it
            w.write(record(0, earliness_us=wide))
            # The thread takes step 0 and waits on the file. Were it to take it late, in the
            # flood, the queue would shrink by one and a later step would slip in.
            while w._queue.qsize() > 0:
                time.sleep(0.01)
            for k in range(1, 600):
                w.write(record(k, earliness_us=wide))
        while w._queue.qsize() > 0:  # the thread catches up
            time.sleep(0.05)
        w.write(record(600))
        w.close()
    said = [str(x.message) for x in seen]
    behind = [m for m in said if "records behind" in m]
    assert len(behind) == 1 and "telemetry_every" in behind[0] and "16384 ranks" in behind[0]
    assert 110 < int(behind[0].split(" is ")[1].split()[0]) < 130
    recs = read_telemetry(path).records
    assert 100 < w.dropped < 150 and len(recs) == 601 - w.dropped
    # Every drop is counted in the record written after it: here the last one.
    assert recs[-1].step == 600 and recs[-1].dropped_before == w.dropped
    assert sum(r.dropped_before for r in recs) == w.dropped
    assert [r.step for r in recs[:-1]] == list(range(len(recs) - 1))  # the first ones, in order

def test_closing_a_writer_with_a_long_queue_says_what_it_waits_for(tmp_path):
    w = TelemetryWriter(tmp_path / "t.jsonl", make_header(source="test", world_size=16384),
                        background=True)
    wide = np.full(16384, 0.5)
    queued = w._queue

    class Held:  # the writer's queue; the thread writes nothing until close() has looked at it
        get, qsize = queued.get, queued.qsize

        def put(self, item):
            if item is None:  # close()'s end mark, put once it has read the queue's length
                w._lock.release()
            queued.put(item)

    w._queue = Held()
    w._lock.acquire()  # the writing thread waits for the file's lock
    for k in range(40):  # ~21 MB queued by the writer's estimate, over its 16 MB notice
        w.write(record(k, earliness_us=wide))
    with pytest.warns(RuntimeWarning, match=r"writing the \d+ telemetry records still queued"):
        w.close()
    assert len(read_telemetry(tmp_path / "t.jsonl").records) == 40


def test_the_report_notes_records_the_writer_dropped(tmp_path, capsys):
    from gpupace.report.load import load_runs

    path = tmp_path / "t.jsonl"
    w = TelemetryWriter(path, make_header(source="test", world_size=2), interval=1)
    for k in range(12):
        w.write(record(k, dropped_before=5 if k == 7 else 0))
    w.close()
    (run,) = load_runs([path])
    assert any("dropped 5 records" in n for n in run.notes), run.notes
    from gpupace.cli import main

    assert main(["report", str(path), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    assert "  note: t.jsonl: the writer dropped 5 records" in capsys.readouterr().out


def test_a_header_that_says_null_reads_as_one_that_says_nothing(tmp_path):
    path = tmp_path / "t.jsonl"
    header = dict(make_header(source="test", world_size=2), world_size=None, format=None,
                  rank=None)
    path.write_text(json.dumps(header) + "\n" + record(0).to_json() + "\n")
    assert [r.step for r in read_telemetry(path).records] == [0]


def test_a_header_value_json_cannot_encode_is_written_as_text(tmp_path):
    header = make_header(source="test", world_size=2, out_dir=tmp_path, batch=np.int64(256))
    TelemetryWriter(tmp_path / "t.jsonl", header).close()
    written = read_header(tmp_path / "t.jsonl")
    assert written["out_dir"] == str(tmp_path) and written["batch"] == 256  # a number still


def test_a_file_another_writer_of_this_process_writes_is_refused(tmp_path):
    """Two Pacers given one telemetry_path: the second renamed the first's live file to .1,
    which the first went on writing."""
    from gpupace import PaceConfig, Pacer

    path = tmp_path / "t.jsonl"
    first = Pacer(PaceConfig(mode="observe", telemetry_path=str(path)))
    with pytest.warns(RuntimeWarning, match="being written by another telemetry writer of this "
                                            r"process \(two Pacers given one telemetry_path\?\)"):
        second = Pacer(PaceConfig(mode="observe", telemetry_path=str(path)))
    assert second._writer is None and first._writer is not None  # the second goes on without
    for _ in range(3):
        with first.site("x"):
            pass
        first.step()
    first.close()
    second.close()
    assert len(read_telemetry(path).records) == 3 and not (tmp_path / "t.jsonl.1").exists()
    with pytest.warns(RuntimeWarning, match="already held a run: kept it as"):  # free again
        third = Pacer(PaceConfig(mode="observe", telemetry_path=str(path)))
    assert third._writer is not None and third._writer.kept == tmp_path / "t.jsonl.1"
    del third  # dropped unclosed (a notebook cell run again): its file is closed, the path free
    with pytest.warns(RuntimeWarning, match="already held a run: kept it as"):
        fourth = Pacer(PaceConfig(mode="observe", telemetry_path=str(path)))
    assert fourth._writer is not None and fourth._writer.kept == tmp_path / "t.jsonl.2"
    fourth.close()


def _unclosed(rank, world, path):
    from gpupace import PaceConfig, Pacer

    pacer = Pacer(PaceConfig(mode="observe", telemetry_path=path))
    for _ in range(40):
        with pacer.site("x"):
            pass
        pacer.step()
    return pacer.steps  # no close(): the rank's process ends with records still queued


def test_a_rank_that_never_closes_its_pacer_still_writes_every_record(tmp_path):
    """Forked and fork-server children end with os._exit, which runs no atexit handler: the
    records still queued were lost (24 of 30 in one run)."""
    from gpupace.launch import run_ranks

    path = tmp_path / "t.jsonl"
    assert run_ranks(_unclosed, 1, str(path), timeout_s=100) == [40]
    assert [r.step for r in read_telemetry(path).records] == list(range(40))


def test_a_writer_whose_close_fails_frees_its_path(tmp_path):
    path = tmp_path / "t.jsonl"
    w = TelemetryWriter(path, make_header(source="test", world_size=2))

    def disk_full():
        raise OSError(28, "No space left on device")

    w._flush = disk_full
    with pytest.raises(OSError, match="No space left"):
        w.close()
    TelemetryWriter(path, make_header(source="test", world_size=2)).close()  # not "being written"


def test_a_process_that_exits_without_closing_its_writer_still_writes_every_record(tmp_path):
    """The main process's interpreter exit: multiprocessing's atexit hook runs the writer's
    finalizer, which writes what is still queued (the forked case is the test above)."""
    path = tmp_path / "t.jsonl"
    script = (
        "import sys; from gpupace.telemetry import TelemetryWriter, make_header\n"
        "from tests.test_telemetry import record\n"
        "w = TelemetryWriter(sys.argv[1], make_header(source='test', world_size=2), 1000,"
        " background=True)\n"
        "for k in range(3000): w.write(record(k))\n"  # queued faster than the thread writes
    )
    subprocess.run([sys.executable, "-c", script, str(path)], check=True, timeout=60,
                   cwd=Path(__file__).resolve().parent.parent)
    assert [r.step for r in read_telemetry(path).records] == list(range(3000))


@pytest.mark.parametrize("path", ["runs/", "runs/.", ".", ".."])
def test_a_path_that_names_a_folder_is_refused_whatever_is_on_disk(tmp_path, path):
    """Path('runs/') and Path('runs/.') are 'runs': a file of that name was made."""
    from gpupace.telemetry import names_a_folder

    assert names_a_folder(path) and not names_a_folder("runs/run.jsonl")
    with pytest.raises(IsADirectoryError, match="names a folder"):
        TelemetryWriter(f"{tmp_path}/{path}", make_header(source="test", world_size=2))
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("background", [False, True])
def test_a_header_is_restated_until_the_first_record_and_never_after(tmp_path, background):
    path = tmp_path / "t.jsonl"
    header = make_header(source="test", world_size=2, label="long label " * 200)
    w = TelemetryWriter(path, header, interval=1, background=background)
    assert w.restate_header({**header, "label": "", "resumed_at_step": 40})  # a shorter line
    w.write(record(40))
    assert not w.restate_header({**header, "resumed_at_step": 99})
    w.close()
    assert not w.restate_header(header)  # closed
    assert read_header(path)["resumed_at_step"] == 40
    read = read_telemetry(path)
    assert [r.step for r in read.records] == [40] and read.skipped == []


def _lines_within(path: Path, n: int, seconds: float = 10.0) -> int:
    """The file's line count once it reaches `n`, or when `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while (lines := len(path.read_text().splitlines())) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return lines


def test_the_background_writer_hands_its_lines_to_the_os_once_caught_up(tmp_path):
    """Records reached the file only every `interval` (50 by default): a rank killed during
    a hang (a scheduler's SIGKILL, NCCL's abort) lost the steps before it, the ones to read."""
    path = tmp_path / "t.jsonl"
    w = TelemetryWriter(path, make_header(source="test", world_size=2), interval=1000,
                        background=True)
    for k in range(5):
        w.write(record(k))
    assert _lines_within(path, 6) == 6  # the header and 5 records, read by another handle
    w.close()


def test_close_gives_up_on_a_writer_stuck_in_the_file_system(tmp_path, monkeypatch):
    """A hung file system (an fsync that never returns) kept close(), and the rank's exit,
    waiting forever; now it gives the queued records up after CLOSE_STALL_S without progress."""
    import os
    import threading

    from gpupace import telemetry

    monkeypatch.setattr(telemetry, "CLOSE_STALL_S", 1.0)
    release, fsync = threading.Event(), os.fsync

    def hung_fsync(fd):  # in the writer's thread alone: the file system stops answering
        if threading.current_thread().name == "gpupace-telemetry":
            release.wait(30)
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", hung_fsync)
    path = tmp_path / "t.jsonl"
    w = TelemetryWriter(path, make_header(source="test", world_size=2), interval=1,
                        background=True)
    try:
        for k in range(4):
            w.write(record(k))
        t0 = time.monotonic()
        with pytest.warns(RuntimeWarning, match=r"wrote nothing to .* for 1 s .* stopped waiting for the "
                                                r"3 records still queued"):
            w.close()
        assert time.monotonic() - t0 < 10.0
        w.close()  # again: nothing left to do
    finally:
        release.set()
    # The file system back, the thread writes what was queued and closes the file itself.
    assert _lines_within(path, 5) == 5
    w._thread.join(10)
    assert not w._thread.is_alive() and w._file is None


FORKED = """
import os, sys
from gpupace.telemetry import StepRecord, TelemetryWriter, make_header, read_telemetry

def record(k):
    return StepRecord(step=k, time_s=0.0, step_time_us=1.0, spread_us=0.0, residual_us=0.0,
                      transfer_us=0.0, straggler=0, active=False, earliness_us=[0.0],
                      wait_us=[0.0], delay_us=[0.0], step_times_us=[1.0], site_spread_us=[0.0])

path = sys.argv[1]
w = TelemetryWriter(path, make_header(source="test", world_size=1), interval=1000)
for k in range(5):
    w.write(record(k))  # in the file object's buffer: interval 1000
pid = os.fork()
if pid == 0:  # the child: ends as a script does, its exit hooks run
    w.close()
    sys.exit(0)
os.waitpid(pid, 0)
for k in range(5, 8):
    w.write(record(k))
w.close()
print([r.step for r in read_telemetry(path).records])
"""


def test_a_forked_child_leaves_its_parents_file_alone(tmp_path):
    """A child forked with a writer open (os.fork, not multiprocessing) flushed its copy of
    the parent's buffer into the parent's file when it ended: records written twice."""
    done = subprocess.run([sys.executable, "-c", FORKED, str(tmp_path / "t.jsonl")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(list(range(8))), done.stdout


def test_paths_a_writer_cannot_use_are_refused_clearly_and_leave_nothing_open(tmp_path):
    """A FIFO (as a stuck mount does) kept Pacer() waiting in open() for ever; a folder that is
    a file was reported as "File exists: '/etc/passwd'"; a header that could not be written
    left its file open (a ResourceWarning)."""
    import gc

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="is a FIFO or socket, not a file"):
        TelemetryWriter(fifo, {})
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="a part of its folder, .*file', is a file"):
        TelemetryWriter(tmp_path / "file" / "run.jsonl", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(OSError, match="No space left on device"):
            TelemetryWriter("/dev/full", {})
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)], caught


def test_each_record_counts_the_drops_just_before_it(tmp_path):
    """Two backlogs apart: each record after one says what that one dropped, not the count
    since the start (a cumulative count went unseen with one backlog a test)."""
    path = tmp_path / "t.jsonl"
    w = TelemetryWriter(path, make_header(source="test", world_size=2), background=True)
    queued = w._queue

    class Backlog:  # the writer's queue, as long as the test says
        size = 0
        get, put = queued.get, queued.put

        def qsize(self):
            return self.size

    w._queue = backlog = Backlog()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "records behind"
        for k, size in enumerate((0, 10**6, 10**6, 0, 10**6, 0)):  # 1 GB queued, or none
            backlog.size = size
            w.write(record(k))
    w.close()
    recs = read_telemetry(path).records
    assert [(r.step, r.dropped_before) for r in recs] == [(0, 0), (3, 2), (5, 1)]
    assert w.dropped == 3


_ENDING = """
import sys
from gpupace import PaceConfig, Pacer
def train():
    pacer = Pacer(PaceConfig(mode="observe", telemetry_path=sys.argv[1]))
    for _ in range(3):
        with pacer.site("x"):
            pass
        pacer.step()
    return pacer
pacer = train()
if sys.argv[2] == "function":
    pacer = None  # collected unclosed, before the exit
if sys.argv[2] == "raise":
    1 / 0
"""


def _three_steps(pacer) -> None:
    for _ in range(3):
        with pacer.site("x"):
            pass
        pacer.step()


def _steps_then(rank, world, path, end):
    from gpupace import PaceConfig, Pacer

    pacer = Pacer(PaceConfig(mode="observe", telemetry_path=path))  # alive to the end
    _three_steps(pacer)
    if end == "raise":
        raise ValueError("the rank's own error")
    sys.exit(0)


@pytest.mark.parametrize("how", ["close", "with", "sys.exit(0)", "exit", "function", "raise",
                                 "rank raise", "rank sys.exit(0)"])
def test_how_a_pacer_ended_is_its_files_last_line(tmp_path, how):
    """The end line tells a finished run from one cut short (a file without it) and says how
    it ended: closed, an exception out of `with Pacer(...)` (sys.exit(0) is no error), the
    interpreter's exit without close(), or an uncaught exception there, in a script or in a
    spawned rank (whose exception its finalizers see while it is handled)."""
    from gpupace import PaceConfig, Pacer
    from gpupace.launch import run_ranks

    path = tmp_path / "t.jsonl"
    if how in ("close", "with", "sys.exit(0)"):
        with contextlib.suppress(ValueError, SystemExit), \
                Pacer(PaceConfig(mode="observe", telemetry_path=str(path))) as pacer:
            _three_steps(pacer)
            if how == "with":
                raise ValueError("out of the block")
            if how == "sys.exit(0)":
                sys.exit(0)
    elif how.startswith("rank"):
        with contextlib.suppress(RuntimeError):  # run_ranks names the rank that failed
            run_ranks(_steps_then, 1, str(path), how.split()[1], timeout_s=100)
    else:
        subprocess.run([sys.executable, "-c", _ENDING, str(path), how], timeout=120,
                       capture_output=True, cwd=Path(__file__).resolve().parent.parent)
    tel = read_telemetry(path)
    want = {"close": "closed", "with": "error: ValueError", "sys.exit(0)": "closed",
            "exit": "exit", "function": "exit", "raise": "error: ZeroDivisionError",
            "rank raise": "error: ValueError", "rank sys.exit(0)": "exit"}[how]
    assert tel.end == {"gpupace": "end", "steps": 3, "how": want, "records": 3, "dropped": 0}
    assert tuple(tel.end) == END_FIELDS
    assert tel.header["end_mark"] is True and not tel.skipped and len(tel.records) == 3


_CUT_SHORT = """
import sys
from gpupace import PaceConfig, Pacer
pacers = [Pacer(PaceConfig(mode="observe", telemetry_path=path)) for path in sys.argv[1:]]
for pacer in pacers:
    for _ in range(3):
        with pacer.site("x"):
            pass
        pacer.step()
    def drain(timeout_s):  # the device's wait for its queued work, cut short by Ctrl-C
        raise KeyboardInterrupt
    pacer._engine.drain = drain
"""


def test_ctrl_c_in_the_exit_drain_still_closes_every_file(tmp_path):
    """A Ctrl-C in an unclosed device pacer's wait at exit skipped its file's close and ended
    multiprocessing's exit hook, so that no file got its end line (the writer's own finalizer
    ran after it, in that hook)."""
    paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    done = subprocess.run([sys.executable, "-c", _CUT_SHORT, *map(str, paths)], timeout=120,
                          capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    for path in paths:
        tel = read_telemetry(path)
        assert tel.end is not None and tel.end["how"] == "error: KeyboardInterrupt", path
        assert len(tel.records) == 3


def test_a_writer_given_no_end_promises_none_and_writes_none(tmp_path):
    path = tmp_path / "t.jsonl"
    w = TelemetryWriter(path, make_header(source="test", world_size=2))
    w.write(record(0))
    w.close()
    tel = read_telemetry(path)
    assert tel.end is None and "end_mark" not in tel.header and len(tel.records) == 1
