"""Validated configuration of the pacer: mode, thresholds, control-law gains and telemetry.

Precedence for every field: an explicit argument, then the environment variable
``GPUPACE_<FIELD NAME IN CAPITALS>`` (read in the constructor, never at import), then the default.
A field left at ``None`` means "not given". ``release_us`` defaults to half of ``threshold_us``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import re
import sys
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .warn import _PACKAGE_DIR

MODES = ("off", "observe", "pace")
ENV_PREFIX = "GPUPACE_"
# The largest max_delay_us: 1 s a step is a broken setting, and the device's spin stops there
# (`kernels.spin.HARD_CAP_US`, a test holds them equal), where the host's would go on.
MAX_DELAY_LIMIT_US = 1e6
# GPUPACE_* variables that are not PaceConfig fields: the device backend's launch switches
# (kernels/launch.py, backends/tail.py), and the device check's and its tests'.
OTHER_ENV = {"GPUPACE_DIRECT_LAUNCH", "GPUPACE_TAIL_GRAPH", "GPUPACE_CHECK_T0",
             "GPUPACE_CHECK_RESTARTED", "GPUPACE_COMMIT", "GPUPACE_FIGURES"}


@dataclass(frozen=True, kw_only=True, slots=True)
class PaceConfig:
    """Pacing settings, validated once when made and frozen then (a field set afterwards
    would skip the checks, and a pacer reads its settings on every call): `replace` gives a
    changed copy."""

    mode: str | None = None
    """`off`: no measuring, no delay; `observe`: measure and report, never delay; `pace`: delay early ranks."""

    threshold_us: float | None = None
    """Arrival spread (us) above which pacing switches on, after `on_steps` consecutive steps."""

    release_us: float | None = None
    """Arrival spread (us) below which pacing switches off, after `off_steps` consecutive steps.
    Must not exceed `threshold_us` (hysteresis); half of it when not given."""

    on_steps: int | None = None
    """Consecutive steps above `threshold_us` before pacing switches on (K)."""

    off_steps: int | None = None
    """Consecutive steps below `release_us` before pacing switches off (M)."""

    gain: float | None = None
    """Fraction of a rank's earliness floor that is turned into delay, in [0, 1]."""

    guard_us: float | None = None
    """Margin (us) subtracted from every delay, so a paced rank still arrives before the last one."""

    max_delay_us: float | None = None
    """Hard upper bound (us) on a rank's delays in one step, at one site and summed over its
    sites; at most 1 s (`MAX_DELAY_LIMIT_US`, past which the device's spin never spins)."""

    cap_fraction: float | None = None
    """Upper bound on a rank's delays in one step (at one site and summed over its sites) as a
    fraction of the step time, in (0, 1]."""

    floor_rise: float | None = None
    """Rate (0, 1] at which the earliness floor follows a larger earliness (slow up); also the
    rate of the running mean and variance of each rank's earliness."""

    floor_fall: float | None = None
    """Rate (0, 1] at which the earliness floor follows a smaller earliness (fast down; 1 = at once)."""

    holdoff_factor: float | None = None
    """A rank's floor starts to rise only after it has not been late (within `guard_us` of the
    last arrival) for a holdoff: `holdoff_factor x world size` steps for a rank that has been
    the site's last arrival, `holdoff_factor` steps for each rank that has been for one that
    never has (`gpupace.policy.holdoff`). Where the last arrival is random over k ranks, each
    is last about once in k steps, so a holdoff of 5k holds about 99% of them (1 - e^-5) at
    zero delay at any one step (over a long run most pass it now and then). Measured in the
    simulator (bench/sim_holdoff.py, 2026-12-01): one rank always last, the first delay came
    at step 10 at 64, 512 and 4096 ranks (a holdoff of 5N for all, the rule until then: not
    before 325, 2565 and 20,485); two slow GPUs a node taking turns (1% compute noise), 16 at
    64 ranks and 128 at 512, at step 85 and 645 (5N: 325, 2565); random stalls on any of 512
    ranks, at step 2557 (5N: 2565, the code of 60917ff, one-off)."""

    holdoff_max: int | None = None
    """Upper bound on the holdoff in steps (default 1,000,000: none below 200,000 ranks). A
    lower bound H below 5N lets about e^(-H/N) of the ranks pass the holdoff by chance under
    random stragglers, and each such delay costs throughput where nothing couples waiting to
    compute: with the bound at 1000 (the default until 2026-12-01), the simulator's `jitter`
    preset at 512 ranks lost 0.033% against 0.0017% with none (6,000 steps, seed 0, one-off
    runs)."""

    overshoot_risk: float | None = None
    """Target probability, per step and site, that pacing delays some rank past the last
    arrival. A rank's delay stays below its mean earliness less z standard deviations, z the
    (1 - overshoot_risk / world size) quantile of the normal law: 1.96 at 4 ranks, 3.0 at 64,
    4.1 at 4096 for the default 0.1."""

    warmup_steps: int | None = None
    """Steps measured but never paced at the start (allocators, autotuning, DDP bucket rebuild)."""

    telemetry_interval: int | None = None
    """Records written between fsyncs of the telemetry file: a machine that goes down loses at
    most this many records (of one step in `telemetry_every` each). A killed process loses
    only the records still queued: the writer hands its lines to the OS whenever it has
    caught up with the steps."""

    telemetry_every: int | None = None
    """Write the record of one step in this many to the telemetry file and TensorBoard (the
    in-memory ring keeps every step). A record is ~31 bytes of JSON a rank: 125 KB at 4096
    ranks (bench/report_load.py's file), 8-9 ms to encode on the 2-core VM, more while
    training holds the GIL. None (the
    default): every step up to 127 ranks, then one in world_size // 64 (64 at 4096 ranks)."""

    telemetry_path: str | None = None
    """JSON-lines file for per-step records; `{rank}` in it (the global rank; `{rank:05d}`
    pads it; no other field is filled in) gives one file per rank, without it only rank 0
    writes (it holds every rank's row), and for a pacer on a data-parallel subgroup each
    group's rank 0, in a file named after the group's global ranks (run.jsonl:
    run.group0-1.jsonl, run.group2-3.jsonl, ...). A folder ("runs/") is
    refused with a warning (give it as text: a pathlib.Path drops the slash). None or empty: no
    file ("" also overrides a GPUPACE_TELEMETRY_PATH, which None leaves in force)."""

    ring_size: int | None = None
    """Most per-step records kept in memory for `summary()` (the newest ones); `ring_memory_mb`
    bounds them too."""

    ring_memory_mb: float | None = None
    """Memory those records may take, in MB. A record holds four values per rank and one per
    site as float64 arrays: ~0.13 MB at 4096 ranks, where 100,000 records would take 13 GB on
    every rank. The default 128 keeps ~960 steps at 4096 ranks, ~13,000 at 256 and ~72,000 at
    8 (the estimate counts `max_sites` sites a record)."""

    max_sites: int | None = None
    """Paced collectives per step that take part in the exchange (a DDP bucket is one). The
    timing row has a fixed size so that every rank's all_gather matches; sites past this many
    in a step are timed for nobody and never delayed. At most MAX_SITES (4096), on either
    backend, so that a config runs on both: the device kernels hold a step's sites in one
    block."""

    def __post_init__(self) -> None:
        _warn_unknown_env()
        from_env = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is not None and not (f.name == "telemetry_path" and value == ""):
                _warn_overridden(f.name, value)  # "": the documented way to turn a path off
            if value is None:
                env = os.environ.get(ENV_PREFIX + f.name.upper())
                if env is not None:
                    from_env[f.name] = env
                    value = _parse_env(f.name, env)
                elif f.name == "release_us":  # after threshold_us, which comes first
                    value = self.threshold_us * RELEASE_FRACTION \
                        if _is_number(self.threshold_us) else DEFAULTS[f.name]
                else:
                    value = DEFAULTS[f.name]
            object.__setattr__(self, f.name, _plain(f.name, value))
        try:
            self._validate()
        except ValueError as e:
            if not from_env:
                raise
            # the variables of the fields the error names (GPUPACE_MODE was blamed for a gain)
            named = _fields_named(e, from_env)
            if not named:
                raise
            given = ", ".join(f"{ENV_PREFIX}{k.upper()}={from_env[k]!r}" for k in named)
            raise ValueError(f"{e} (from the environment: {given})") from None

    def _validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        _check_range("threshold_us", self.threshold_us, 0.0, math.inf, lo_open=True)
        _check_range("release_us", self.release_us, 0.0, math.inf)
        if self.release_us > self.threshold_us:
            raise ValueError(
                f"release_us must be <= threshold_us ({self.threshold_us}) for hysteresis, "
                f"got {self.release_us}"
            )
        _check_int("on_steps", self.on_steps, 1)
        _check_int("off_steps", self.off_steps, 1)
        _check_range("gain", self.gain, 0.0, 1.0)
        _check_range("guard_us", self.guard_us, 0.0, math.inf)
        _check_range("max_delay_us", self.max_delay_us, 0.0, MAX_DELAY_LIMIT_US, lo_open=True)
        _check_range("cap_fraction", self.cap_fraction, 0.0, 1.0, lo_open=True)
        _check_range("floor_rise", self.floor_rise, 0.0, 1.0, lo_open=True)
        _check_range("floor_fall", self.floor_fall, 0.0, 1.0, lo_open=True)
        _check_range("holdoff_factor", self.holdoff_factor, 0.0, 1000.0)
        _check_int("holdoff_max", self.holdoff_max, 0)
        _check_range("overshoot_risk", self.overshoot_risk, 0.0, 1.0, lo_open=True)
        _check_int("warmup_steps", self.warmup_steps, 0)
        _check_int("telemetry_interval", self.telemetry_interval, 1)
        if self.telemetry_every is not None:  # None: chosen by the world size
            _check_int("telemetry_every", self.telemetry_every, 1)
        _check_int("ring_size", self.ring_size, 1)
        _check_range("ring_memory_mb", self.ring_memory_mb, 0.0, 1e7, lo_open=True)
        _check_int("max_sites", self.max_sites, 1)
        if self.max_sites > MAX_SITES:
            raise ValueError(f"max_sites must be at most {MAX_SITES} (the device kernels hold a "
                             f"step's sites in one block), got {self.max_sites}")
        if self.telemetry_path is not None and not isinstance(self.telemetry_path, str):
            raise ValueError(f"telemetry_path must be a string, a path or None, got "
                             f"{type(self.telemetry_path).__name__}")
        if self.telemetry_path:
            _check_rank_fields(self.telemetry_path)

    def replace(self, **changes: Any) -> PaceConfig:
        """A copy with `changes` applied; fields not changed keep their resolved values, except
        a `release_us` that was half of `threshold_us`, which follows a new threshold."""
        values = self.to_dict()
        unknown = set(changes) - set(values)
        if unknown:
            raise ValueError(f"unknown PaceConfig fields {sorted(unknown)}; known: {sorted(values)}")
        if ("threshold_us" in changes and "release_us" not in changes
                and self.release_us == self.threshold_us * RELEASE_FRACTION):
            values["release_us"] = None
        values.update(changes)
        return PaceConfig(**values)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


MAX_SITES = 4096  # sites a step: the update kernel's block over them spills registers past it

# Defaults. Spreads and delays are in microseconds: NCCL all-reduces of DDP buckets take
# hundreds of us to ms, and the stragglers the study describes cost ms per step.
DEFAULTS: dict[str, Any] = {
    "mode": "pace",
    "threshold_us": 200.0,
    "release_us": 100.0,  # when threshold_us is not a number: its own check then fails
    "on_steps": 3,
    "off_steps": 20,
    "gain": 0.9,
    "guard_us": 20.0,
    "max_delay_us": 50_000.0,
    "cap_fraction": 0.5,
    # Fast down, slow up: the floor drops to a smaller earliness at once and climbs 5% of the
    # way per step, so a rank that is early only sometimes keeps a floor near zero.
    "floor_rise": 0.05,
    "floor_fall": 1.0,
    "holdoff_factor": 5.0,
    "holdoff_max": 1_000_000,
    "overshoot_risk": 0.1,
    "warmup_steps": 5,
    "telemetry_interval": 50,
    "telemetry_every": None,
    "telemetry_path": None,
    "ring_size": 100_000,
    "ring_memory_mb": 128.0,
    "max_sites": 64,
}

RELEASE_FRACTION = 0.5  # release_us when not given, as a fraction of threshold_us

_INT_FIELDS = {"holdoff_max", "on_steps", "off_steps", "warmup_steps", "telemetry_interval",
               "telemetry_every", "ring_size", "max_sites"}
_STR_FIELDS = {"mode", "telemetry_path"}


def _parse_env(name: str, raw: str) -> Any:
    var = ENV_PREFIX + name.upper()
    if name in _STR_FIELDS:
        return (raw or None) if name == "telemetry_path" else raw
    try:
        return int(raw) if name in _INT_FIELDS else float(raw)
    except ValueError:
        kind = "an integer" if name in _INT_FIELDS else "a number"
        raise ValueError(f"{var} must be {kind}, got {raw!r}") from None


_RANK_FIELD = re.compile(r"\{rank(?::([^{}]*))?\}")  # {rank}, {rank:05d}


def per_rank_path(path: str) -> bool:
    """Whether a telemetry path names one file a rank: it has a `{rank}` field."""
    return _RANK_FIELD.search(path) is not None


def fill_rank(path: str, rank: int) -> str:
    """`path` with each `{rank}` (or `{rank:05d}`, a format spec) filled in."""
    return _RANK_FIELD.sub(lambda m: format(rank, m.group(1) or ""), path)


def _check_rank_fields(path: str) -> None:
    """A ValueError for a field other than `{rank}` in a telemetry path, or a spec that does
    not format a rank: left as they were, they named a file no one expected."""
    other = re.findall(r"\{[^{}]*\}", _RANK_FIELD.sub("", path))
    if other:
        raise ValueError(f"telemetry_path {path!r}: only {{rank}} (or {{rank:05d}}) is filled "
                         f"in, got {other[0]}")
    try:
        fill_rank(path, 0)
    except ValueError as e:
        raise ValueError(f"telemetry_path {path!r}: its {{rank}} field does not format a rank "
                         f"number ({e})") from None


def _plain(name: str, value: Any) -> Any:
    """NumPy scalars as Python numbers, a path as a string: what the checks and the JSON
    header take."""
    if name == "telemetry_path" and isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    return float(value) if isinstance(value, numbers.Real) else value


def _is_number(v: Any) -> bool:
    """A finite int or float (not a bool): one that can be computed with."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and _finite(v)


_env_checked = False


def _warn_unknown_env() -> None:
    """Once per process: a GPUPACE_* variable that names no field is most likely a typo that
    would otherwise be ignored without a word."""
    global _env_checked
    if _env_checked:
        return
    _env_checked = True
    if unknown := unknown_env(os.environ):
        warnings.warn(f"gpupace: ignoring unknown environment variables {unknown}; the known "
                      f"ones are {sorted(field_env())}", RuntimeWarning, stacklevel=4)


_overridden_told: set[tuple[str, str]] = set()


def _warn_overridden(name: str, value: Any) -> None:
    """Once per field and variable: a GPUPACE_* variable set for a field that the code gives
    another value, which wins (GPUPACE_MODE=off in a job script, over mode="pace" in its
    code, was ignored without a word)."""
    raw = os.environ.get(ENV_PREFIX + name.upper())
    if raw is None or (name, raw) in _overridden_told:
        return
    try:
        same = _plain(name, _parse_env(name, raw)) == _plain(name, value)
    except (ValueError, TypeError):  # unreadable, or the code's value is: said elsewhere
        return
    level = None if same else _maker_level()
    if level is not None:
        _overridden_told.add((name, raw))
        warnings.warn(f"gpupace: {ENV_PREFIX}{name.upper()}={raw!r} is ignored: the code gives "
                      f"PaceConfig({name}={value!r}), which wins over the environment; leave "
                      f"{name} out of PaceConfig(...) for the variable to set it",
                      RuntimeWarning, stacklevel=level)


def _maker_level() -> int | None:
    """The warnings stacklevel, from `_warn_overridden`, of the line that made the PaceConfig
    (past this module's frames, dataclasses' and the generated __init__); None where that
    line is gpupace's own (the simulator's policy, the demo's pinned settings)."""
    frame, level = sys._getframe(2), 2  # 1: _warn_overridden, which calls warnings.warn
    while frame is not None and (frame.f_code.co_filename in (__file__, dataclasses.__file__)
                                 or frame.f_code is PaceConfig.__init__.__code__):
        frame, level = frame.f_back, level + 1
    if frame is None or frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        return None
    return level


def env_errors() -> list[str]:
    """Every GPUPACE_* setting of this process's environment that `PaceConfig()` would refuse,
    not only the first it meets: each value that does not parse, then what the checks say of
    the others (those that do not parse taken at their defaults)."""
    errors, unreadable, readable = [], {}, []
    for f in dataclasses.fields(PaceConfig):
        raw = os.environ.get(ENV_PREFIX + f.name.upper())
        if raw is not None:
            try:
                _parse_env(f.name, raw)
                readable.append(f.name)
            except ValueError as e:
                errors.append(str(e))
                unreadable[f.name] = _stand_in(f.name)
    # A PaceConfig stops at the first check that fails: the settings it names are put back
    # to their defaults and it is made again, until it passes. A check of two settings
    # (release_us <= threshold_us) names both, with the values given.
    given = dict(unreadable)
    while True:
        try:
            PaceConfig(**given)
            return errors
        except ValueError as e:
            named = _fields_named(e, [n for n in readable if n not in given])
            errors.append(str(e))
            if not named:  # nothing left to put back
                return errors
            given.update({n: _stand_in(n) for n in named})


def _fields_named(error: ValueError, names: Iterable[str]) -> list[str]:
    """Those of `names` that `error`'s message names as words: the fields its check read."""
    return [n for n in names if re.search(rf"\b{n}\b", str(error))]


def _stand_in(name: str) -> Any:
    """A value of field `name` that its checks take, given in place of the environment's
    (None, the default of telemetry_every, would read the variable again)."""
    default = DEFAULTS[name]
    return 1 if default is None else default


# The settings the control law reads (`policy.PolicyParams`): what a simulated policy takes.
CONTROL_LAW = ("threshold_us", "release_us", "on_steps", "off_steps", "gain", "guard_us",
               "max_delay_us", "cap_fraction", "floor_rise", "floor_fall", "holdoff_factor",
               "holdoff_max", "overshoot_risk", "warmup_steps")


def env_settings(skip: Iterable[str] = ()) -> list[str]:
    """The GPUPACE_* settings of PaceConfig's fields in this process's environment, as
    NAME=value, sorted, but for the fields in `skip`: a PaceConfig takes them, and they change
    what a run does (GPUPACE_GAIN=0 delays nobody), so a run says so."""
    left_out = {ENV_PREFIX + name.upper() for name in skip}
    return [f"{k}={os.environ[k]}" for k in sorted(field_env() - left_out) if k in os.environ]


def field_env() -> set[str]:
    """The environment variables that set PaceConfig's fields."""
    return {ENV_PREFIX + f.name.upper() for f in dataclasses.fields(PaceConfig)}


def unknown_env(env: Mapping[str, str]) -> list[str]:
    """The GPUPACE_* names in `env` that gpupace does not read, sorted."""
    known = field_env() | OTHER_ENV
    return sorted(k for k in env if k.startswith(ENV_PREFIX) and k not in known)


def _check_range(name: str, v: Any, lo: float, hi: float, lo_open: bool = False) -> None:
    ok = _is_number(v) and (v > lo if lo_open else v >= lo) and v <= hi
    if not ok:
        if math.isinf(hi):
            within = f"{'>' if lo_open else '>='} {lo}"
        else:
            within = f"in {'(' if lo_open else '['}{lo}, {hi}]"
        raise ValueError(f"{name} must be a finite number {within}, got {v!r}")


def _finite(v: float) -> bool:
    try:
        return math.isfinite(v)
    except OverflowError:  # an int past float's range: 10**400
        return False


def _check_int(name: str, v: Any, lo: int) -> None:
    if not isinstance(v, int) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
