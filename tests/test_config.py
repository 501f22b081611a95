"""PaceConfig: defaults, environment overrides and their precedence, and clear errors."""

import warnings

import numpy as np
import pytest

from gpupace import PaceConfig, config
from gpupace.config import DEFAULTS


def test_defaults_are_valid_and_complete():
    cfg = PaceConfig()
    assert cfg.to_dict() == DEFAULTS


def test_env_overrides_default_but_not_an_explicit_argument(monkeypatch):
    monkeypatch.setenv("GPUPACE_MAX_DELAY_US", "1234.5")
    monkeypatch.setenv("GPUPACE_MODE", "observe")
    monkeypatch.setenv("GPUPACE_ON_STEPS", "7")
    monkeypatch.setattr(config, "_overridden_told", set())
    with pytest.warns(RuntimeWarning, match="GPUPACE_MODE='observe' is ignored"):
        cfg = PaceConfig(mode="pace")
    assert cfg.max_delay_us == 1234.5
    assert cfg.on_steps == 7
    assert cfg.mode == "pace"


def test_env_is_read_in_the_constructor_not_at_import(monkeypatch):
    assert PaceConfig().gain == DEFAULTS["gain"]
    monkeypatch.setenv("GPUPACE_GAIN", "0.5")
    assert PaceConfig().gain == 0.5


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"mode": "fast"}, r"mode must be one of .* got 'fast'"),
        ({"max_delay_us": -1.0}, r"max_delay_us must be .* got -1.0"),
        # past the device's hard cap, where the host's spin alone would go on (a review)
        ({"max_delay_us": 2e6}, r"max_delay_us must be .* got 2000000.0"),
        ({"gain": 1.5}, r"gain must be .*\[0.0, 1.0\], got 1.5"),
        ({"cap_fraction": 0.0}, r"cap_fraction must be .*\(0.0, 1.0\], got 0.0"),
        ({"threshold_us": float("nan")}, r"threshold_us must be a finite number"),
        ({"threshold_us": -1.0}, r"threshold_us must be a finite number > 0.0, got -1.0"),
        ({"guard_us": -1.0}, r"guard_us must be a finite number >= 0.0, got -1.0"),
        ({"release_us": 500.0, "threshold_us": 100.0}, r"release_us must be <= threshold_us"),
        ({"on_steps": 0}, r"on_steps must be an integer >= 1, got 0"),
        ({"warmup_steps": 2.5}, r"warmup_steps must be an integer >= 0, got 2.5"),
        ({"telemetry_interval": True}, r"telemetry_interval must be an integer"),
        ({"max_sites": 0}, r"max_sites must be an integer >= 1"),
        ({"max_sites": 4097}, r"max_sites must be at most 4096 .* got 4097"),
        ({"telemetry_every": 0}, r"telemetry_every must be an integer >= 1, got 0"),
        ({"ring_memory_mb": 0}, r"ring_memory_mb must be .*\(0.0, 10000000.0\], got 0"),
        ({"telemetry_path": "run-{host}.jsonl"}, r"only \{rank\} .* is filled in, got \{host\}"),
        ({"telemetry_path": "run-{rank:q}.jsonl"}, r"its \{rank\} field does not format a rank"),
    ],
)
def test_bad_values_name_the_field_and_value(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        PaceConfig(**kwargs)


def test_bad_env_value_names_the_variable(monkeypatch):
    monkeypatch.setenv("GPUPACE_OFF_STEPS", "many")
    with pytest.raises(ValueError, match="GPUPACE_OFF_STEPS must be an integer, got 'many'"):
        PaceConfig()
    monkeypatch.setenv("GPUPACE_OFF_STEPS", "-3")
    with pytest.raises(ValueError, match="off_steps must be an integer >= 1, got -3 "
                       r"\(from the environment: GPUPACE_OFF_STEPS='-3'\)"):
        PaceConfig()
    monkeypatch.setenv("GPUPACE_OFF_STEPS", "3")
    monkeypatch.setenv("GPUPACE_MODE", "bogus")
    with pytest.raises(ValueError, match="got 'bogus' .*GPUPACE_MODE='bogus'"):
        PaceConfig()


def test_release_follows_a_threshold_given_alone(monkeypatch):
    assert PaceConfig(threshold_us=50.0).release_us == 25.0
    assert PaceConfig().release_us == DEFAULTS["threshold_us"] / 2 == DEFAULTS["release_us"]
    monkeypatch.setenv("GPUPACE_THRESHOLD_US", "80")
    assert PaceConfig().release_us == 40.0
    monkeypatch.setenv("GPUPACE_RELEASE_US", "10")
    monkeypatch.setattr(config, "_overridden_told", set())
    with pytest.warns(RuntimeWarning, match="GPUPACE_THRESHOLD_US='80' is ignored"):
        assert PaceConfig(threshold_us=50.0).release_us == 10.0


def test_replace_moves_a_derived_release_with_the_threshold():
    assert PaceConfig().replace(threshold_us=50.0).release_us == 25.0
    assert PaceConfig().replace(threshold_us=1000.0).release_us == 500.0
    assert PaceConfig(release_us=80.0).replace(threshold_us=1000.0).release_us == 80.0
    with pytest.raises(ValueError, match="release_us must be <= threshold_us"):
        PaceConfig(release_us=80.0).replace(threshold_us=50.0)  # given, so kept


def test_an_empty_telemetry_path_overrides_the_environment(monkeypatch):
    monkeypatch.setenv("GPUPACE_TELEMETRY_PATH", "/tmp/x.jsonl")
    assert PaceConfig().replace(telemetry_path=None).telemetry_path == "/tmp/x.jsonl"
    assert PaceConfig().replace(telemetry_path="").telemetry_path == ""


def test_a_variable_that_the_code_overrides_is_said_to_be_ignored_once(monkeypatch):
    """GPUPACE_MODE=off in a job script, over mode="pace" in its code (as the README's example
    had it), was ignored without a word. Said once, at the user's line; not where the code
    gives the variable's own value, nor for an empty telemetry_path (the way to turn the
    variable's path off), nor for gpupace's own configs (the simulator's policy)."""
    monkeypatch.setattr(config, "_overridden_told", set())
    monkeypatch.setenv("GPUPACE_MODE", "off")
    monkeypatch.setenv("GPUPACE_GAIN", "0.5")
    monkeypatch.setenv("GPUPACE_TELEMETRY_PATH", "/tmp/x.jsonl")
    with pytest.warns(RuntimeWarning, match=r"GPUPACE_MODE='off' is ignored: the code gives "
                                            r"PaceConfig\(mode='pace'\)") as seen:
        PaceConfig(mode="pace", gain=0.5, telemetry_path="")
    assert len(seen) == 1 and seen[0].filename == __file__
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PaceConfig(mode="pace")  # told once
        PaceConfig().replace(gain=0.5)  # the variable's value
        monkeypatch.setattr(config, "_overridden_told", set())  # as if never told
        from gpupace.sim.presets import quiet
        from gpupace.sim.simulate import simulate

        simulate(quiet(1), "gpupace", steps=20)  # PaceConfig(mode="pace") inside gpupace


def test_numpy_scalars_and_paths_are_taken_as_plain_values(tmp_path):
    cfg = PaceConfig(ring_size=np.int64(10), gain=np.float32(0.5), telemetry_path=tmp_path / "t")
    assert (cfg.ring_size, cfg.gain, cfg.telemetry_path) == (10, 0.5, str(tmp_path / "t"))
    assert type(cfg.ring_size) is int and type(cfg.gain) is float


def test_an_unknown_gpupace_variable_warns_once(monkeypatch):
    monkeypatch.setattr(config, "_env_checked", False)
    monkeypatch.setenv("GPUPACE_MAXDELAY_US", "5")
    with pytest.warns(RuntimeWarning, match=r"unknown environment variables \['GPUPACE_MAXDELAY_US'\]"):
        PaceConfig()
    monkeypatch.setenv("GPUPACE_MODEE", "off")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PaceConfig()  # once per process


def test_replace_keeps_resolved_values_and_rejects_unknown_fields():
    cfg = PaceConfig(gain=0.3).replace(mode="observe")
    assert (cfg.gain, cfg.mode) == (0.3, "observe")
    with pytest.raises(ValueError, match="unknown PaceConfig fields \\['gian'\\]"):
        cfg.replace(gian=0.5)
    with pytest.raises(TypeError):
        PaceConfig(gian=0.5)


def test_a_config_is_frozen_once_validated():
    """A field set afterwards would skip the checks (cap_fraction 50, a mode 'Pace'), and a
    live pacer reads its settings on every call: a changed copy comes from `replace`."""
    import dataclasses

    c = PaceConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.cap_fraction = 50.0
    with pytest.raises(ValueError, match="cap_fraction"):
        c.replace(cap_fraction=50.0)
    assert c.replace(gain=0.5).gain == 0.5 and c.gain != 0.5


def test_an_error_names_the_environment_variables_of_its_field_alone(monkeypatch):
    """GPUPACE_MODE=observe and PaceConfig(gain=2): the error said the gain came 'from the
    environment: GPUPACE_MODE=...' (a review)."""
    monkeypatch.setenv("GPUPACE_MODE", "observe")
    with pytest.raises(ValueError) as e:
        PaceConfig(gain=2.0)
    assert "gain must be" in str(e.value) and "environment" not in str(e.value)
    monkeypatch.setenv("GPUPACE_GAIN", "2")
    with pytest.raises(ValueError, match=r"gain must be .* \(from the environment: "
                                         r"GPUPACE_GAIN='2'\)$"):
        PaceConfig()


def test_an_integer_past_floats_range_is_refused_by_name():
    with pytest.raises(ValueError, match="threshold_us must be a finite number"):
        PaceConfig(threshold_us=10**400)  # it raised OverflowError from math.isfinite
