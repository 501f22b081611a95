"""`gpupace demo` through its CLI at a small size, its scenarios and its errors."""

import json

import numpy as np
import pytest

from gpupace.cli import main
from gpupace.demo import SCENARIOS, make_schedule
from gpupace.telemetry import read_telemetry


def test_demo_cli_small_run_writes_json_and_telemetry(tmp_path, capsys):
    out = tmp_path / "demo.json"
    rc = main(["demo", "--ranks", "2", "--steps", "40", "--scenario", "persistent",
               "--straggle-ms", "4", "--json", str(out), "--telemetry", str(tmp_path / "tel"),
               "--timeout", "150"])
    assert rc == 0
    table = capsys.readouterr().out
    assert "baseline" in table and "paced" in table and "throughput" in table
    result = json.loads(out.read_text())
    assert (result["scenario"], result["world_size"], result["steps"]) == ("persistent", 2, 40)
    for side in ("baseline", "paced"):
        for key in ("throughput", "step_time_cv", "step_time_p50", "step_time_p99",
                    "spread_mean", "spread_p99"):
            assert isinstance(result[side][key], float) and result[side][key] >= 0, (side, key)
        assert result[side]["throughput"] > 0
    assert result["baseline"]["delay_mean"] == 0.0  # observe mode never delays
    # rank 1 carries the injected work: it is the last arrival on most steady steps
    hist = result["baseline"]["straggler_histogram"]
    assert hist[1] > hist[0]
    for label in ("baseline-1", "paced-1", "paced-2", "baseline-2"):  # the four phases
        tel = read_telemetry(tmp_path / "tel" / f"{label}.jsonl")
        assert tel.header["label"] == label and tel.header["scenario"] == "persistent"
        assert len(tel.records) == 20 and not tel.skipped


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_schedules_are_seeded_and_shaped(scenario):
    a = make_schedule(scenario, 4, 50, 8.0, seed=3)
    assert a.shape == (50, 4) and (a >= 0).all()
    np.testing.assert_array_equal(a, make_schedule(scenario, 4, 50, 8.0, seed=3))
    assert not np.array_equal(a, make_schedule(scenario, 4, 50, 8.0, seed=4))


def test_schedule_scenarios_put_the_work_where_they_say():
    persistent = make_schedule("persistent", 4, 200, 8.0, 0).mean(axis=0)
    assert persistent[3] > 8.0 > persistent[:3].max()
    locality = make_schedule("locality", 4, 200, 8.0, 0).mean(axis=0)
    assert np.all(np.diff(locality) > 2.0)
    random = make_schedule("random", 4, 2000, 8.0, 0)
    assert np.ptp(random.mean(axis=0)) < 0.3 * random.mean()  # no rank is reliably slow


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ranks", "0"], "--ranks must be >= 1, got 0"),
        (["--steps", "30"], "--steps must be >= 40"),
        (["--straggle-ms", "nan"], "--straggle-ms must be a finite number"),
        (["--batch", "0"], "--batch must be >= 1"),
    ],
)
def test_demo_bad_options_give_one_clear_error(argv, message, capsys):
    assert main(["demo", *argv]) == 2
    assert message in capsys.readouterr().err


def test_unknown_scenario_is_refused_by_argparse(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--scenario", "chaos"])
    assert "invalid choice: 'chaos'" in capsys.readouterr().err
