"""What bench did before and around its reps, as frozen records: the condition it measured
in and for which GPUs, the warmup, how the first
burst began (with what the state probe found and what a session knew of the
temperature, records of their own), the burst schedule, and the sustained precondition.

A `Measurement` publishes them in its `extra`, under the keys results files have always
held them (`warmup_reps`, `burst_first_wait_s`, `precondition_s`, ...), so a file written
before these records existed loads the same and a file written now reads the same to
every tool that reads the JSON. Each record is the one place that names its keys: its
writer publishes `to_extra()`, and a reader asks the measurement (`m.warmup`,
`m.first_burst`, `m.bursts`, `m.precondition`, `m.wall`), which reads the record back with
`from_extra` (None where the measurement holds none, or holds values of the wrong type).
The order of `to_extra`'s keys is the order files hold them in.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard


@dataclass(frozen=True)
class Conditioned:
    """The state bench measured in, why it was chosen, and the GPUs its waits were for
    (gpuenv.conditioning.Conditioner: the GPU fn runs on, never another of a session)."""

    condition: str  # "burst", "sustained" or "none"
    why: str  # 'clocks not locked: each burst starts from the cool, uncapped state'
    gpus: tuple[int, ...] = ()  # the GPUs waited for or preconditioned (() in older files)

    def to_extra(self) -> dict[str, Any]:
        return {
            "condition": self.condition,
            "condition_why": self.why,
            "condition_gpus": list(self.gpus),
        }

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> Conditioned | None:
        condition, why = extra.get("condition"), extra.get("condition_why")
        gpus = extra.get("condition_gpus", [])
        if not (isinstance(condition, str) and isinstance(why, str)):
            return None
        if not (isinstance(gpus, Sequence) and all(_int(g) for g in gpus)):
            return None
        return cls(condition, why, tuple(gpus))


@dataclass(frozen=True)
class Warmup:
    """bench's warmup: reps until the rep times and clocks stop trending, or a fixed count."""

    reps: int
    seconds: float
    steady: bool  # False: warmup_max_s or warmup_max_reps ran out while it still trended
    # fn was warmed up before on this GPU in this process (gpuenv.timing.memo): only the
    # clock's ramp was left (False in a file written before gpuenv remembered warmups)
    known: bool = False

    def to_extra(self) -> dict[str, Any]:
        return {
            "warmup_reps": self.reps,
            "warmup_s": self.seconds,
            "warmup_steady": self.steady,
            "warmup_known": self.known,
        }

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> Warmup | None:
        reps, seconds, steady = (
            extra.get("warmup_reps"),
            extra.get("warmup_s"),
            extra.get("warmup_steady"),
        )
        known = extra.get("warmup_known", False)
        if not (_int(reps) and _real(seconds) and _bool(steady) and _bool(known)):
            return None
        return cls(reps, float(seconds), steady, known)


@dataclass(frozen=True)
class StateProbe:
    """What the state probe found before the first burst (gpuenv.timing.stateprobe): fn's
    reference from a measurement begun on a ready GPU, the clock now, and, where the clock
    could tell, a few reps of fn now. Numbers keep the type they were written with (a
    clock read from a sample is an int), so a file reads back as it was written."""

    ref_s: float  # fn's time on a GPU found ready
    ref_clock_mhz: float  # its reps' probed clock then
    clock_mhz: float | None  # the clock now (None: nothing could read it)
    # fn drew under STATE_LIGHT_FRAC of the power limit then (None: a file written before
    # gpuenv judged light kernels)
    light: bool | None
    free: bool  # the state does not move fn's time: measured without a wait
    time_s: float | None = None  # the probe's reps now, their median (None: not run)
    reps: int | None = None  # how many reps the probe ran
    moved: float | None = None  # time_s against ref_s, relative (0.002: 0.2% slower)

    def to_extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "ref_s": self.ref_s,
            "ref_clock_mhz": self.ref_clock_mhz,
            "clock_mhz": self.clock_mhz,
        }
        if self.light is not None:
            out["light"] = self.light
        ran = {"time_s": self.time_s, "reps": self.reps, "moved": self.moved}
        out.update((k, v) for k, v in ran.items() if v is not None)
        out["free"] = self.free
        return out

    @classmethod
    def from_extra(cls, got: object) -> StateProbe | None:
        if not isinstance(got, Mapping):
            return None
        ref_s, ref_mhz, free = got.get("ref_s"), got.get("ref_clock_mhz"), got.get("free")
        clock, light, time_s, reps, moved = (
            got.get(k) for k in ("clock_mhz", "light", "time_s", "reps", "moved")
        )
        if not (_real(ref_s) and _real(ref_mhz) and _bool(free)):
            return None
        if not all(x is None or _real(x) for x in (clock, time_s, moved)):
            return None
        if not ((light is None or _bool(light)) and (reps is None or _int(reps))):
            return None
        return cls(ref_s, ref_mhz, clock, light, free, time_s, reps, moved)


@dataclass(frozen=True)
class TemperatureFacts:
    """What a `stable()` session's wait before a bench knew of the temperature
    (`Session.temperature_facts`). Numbers keep the type they were written with."""

    idle_c: float | None  # where the session began (None: no sample then)
    start_c: float | None  # where the GPU was when the bench began (None: no sample)
    slope_per_c: float | None  # fn's time against the temperature, relative (None: not learned)
    margin_c: float | None  # how far above idle_c the wait allowed (None: not waited)
    note: str | None = None  # what a GPU warmer than that costs fn (None: nothing to say)

    def to_extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "idle_c": self.idle_c,
            "start_c": self.start_c,
            "slope_per_c": self.slope_per_c,
            "margin_c": self.margin_c,
        }
        if self.note is not None:
            out["note"] = self.note
        return out

    @classmethod
    def from_extra(cls, got: object) -> TemperatureFacts | None:
        if not isinstance(got, Mapping):
            return None
        numbers = [got.get(k) for k in ("idle_c", "start_c", "slope_per_c", "margin_c")]
        note = got.get("note")
        if not all(x is None or _real(x) for x in numbers):
            return None
        if not (note is None or isinstance(note, str)):
            return None
        idle, start, slope, margin = numbers
        return cls(idle, start, slope, margin, note)


@dataclass(frozen=True)
class FirstBurst:
    """How the first burst began (condition "burst"): the wait for a cool, uncapped GPU."""

    wait_s: float  # the wait before the first burst (0.0: none)
    ready: bool  # the GPU was found ready (False: the wait ran out first)
    # the first burst began with bench, its warmup the burst's beginning; None: a session's
    # wait, which does not decide it (see gpuenv.timing.harness._Run._first_burst)
    from_start: bool | None = None
    cold_start: bool = False  # begun on an idle GPU: waited for samples a refresh later
    state_probe: StateProbe | None = None  # what the state probe found (None: no probe)
    temperature: TemperatureFacts | None = None  # what a session's wait knew of the temperature

    def to_extra(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.from_start is not None:
            out["burst_from_start"] = self.from_start
        if self.cold_start:
            out["burst_cold_start"] = True
        if self.state_probe is not None:
            out["state_probe"] = self.state_probe.to_extra()
        if self.temperature is not None:
            out["temperature"] = self.temperature.to_extra()
        out["burst_first_wait_s"] = self.wait_s
        out["burst_first_ready"] = self.ready
        return out

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> FirstBurst | None:
        wait, ready = extra.get("burst_first_wait_s"), extra.get("burst_first_ready")
        from_start = extra.get("burst_from_start")
        cold = extra.get("burst_cold_start", False)
        probe, temperature = extra.get("state_probe"), extra.get("temperature")
        if not (_real(wait) and _bool(ready) and _bool(cold)):
            return None
        if not (from_start is None or _bool(from_start)):
            return None
        # held but unreadable: no record, as a field of the wrong type is
        read_probe, read_temperature = (
            StateProbe.from_extra(probe),
            TemperatureFacts.from_extra(temperature),
        )
        if (probe is None) != (read_probe is None):
            return None
        if (temperature is None) != (read_temperature is None):
            return None
        return cls(float(wait), ready, from_start, cold, read_probe, read_temperature)


@dataclass(frozen=True)
class BurstSchedule:
    """What the burst schedule did over the reps (gpuenv.conditioning.Bursts).

    A measurement in another condition holds `BurstSchedule(rests=0)`: no rest, and
    nothing else to say. The other fields are None there, and in a file written before
    gpuenv recorded them.
    """

    rests: int  # rests taken between bursts
    bursts: int | None = None  # bursts the reps ran in
    max_s: float | None = None  # the longest burst, the warmup's included where it began one
    rest_s: float | None = None  # time spent resting
    waits: int | None = None  # rests that waited for the GPU (not the model's fixed rest)
    clock_redos: int | None = None  # reps measured again because the clock fell under them
    in_bursts_s: float | None = None  # time inside bursts: the budget where it counts them
    # the power model saw the work's power in a reading (None: no power model)
    power_seen: bool | None = None
    # reps dropped and measured again, by why ("clock fell", "power cap", "thermal" ...)
    redone: Mapping[str, int] | None = None
    limit_s: float | None = None  # the longest unbroken work it allowed (the cap's onset)
    lengths_s: tuple[float, ...] | None = None  # each burst's length, in order
    rests_s: tuple[float, ...] | None = None  # each rest after a burst, in order

    def to_extra(self) -> dict[str, Any]:
        keys = {
            "burst_rests": self.rests,
            "bursts": self.bursts,
            "burst_max_s": self.max_s,
            "burst_rest_s": self.rest_s,
            "burst_waits": self.waits,
            "burst_clock_redos": self.clock_redos,
            "in_bursts_s": self.in_bursts_s,
            "burst_power_seen": self.power_seen,
            "burst_redone": dict(self.redone) if self.redone is not None else None,
            "burst_limit_s": self.limit_s,
            "burst_lengths_s": _rounded(self.lengths_s),
            "burst_rests_each_s": _rounded(self.rests_s),
        }
        return {k: v for k, v in keys.items() if v is not None}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> BurstSchedule | None:
        rests = extra.get("burst_rests")
        if not _int(rests):
            return None
        ints = {k: extra.get(k) for k in ("bursts", "burst_waits", "burst_clock_redos")}
        reals = {k: extra.get(k) for k in ("burst_max_s", "burst_rest_s", "in_bursts_s")}
        seen = extra.get("burst_power_seen")
        if not all(x is None or _int(x) for x in ints.values()):
            return None
        if not all(x is None or _real(x) for x in reals.values()):
            return None
        if not (seen is None or _bool(seen)):
            return None
        redone = extra.get("burst_redone")
        if redone is not None and not (
            isinstance(redone, Mapping)
            and all(isinstance(k, str) and _int(v) for k, v in redone.items())
        ):
            return None
        limit = extra.get("burst_limit_s")
        lists = [extra.get(k) for k in ("burst_lengths_s", "burst_rests_each_s")]
        if not (limit is None or _real(limit)) or not all(
            x is None or (isinstance(x, list) and all(_real(v) for v in x)) for x in lists
        ):
            return None
        return cls(
            rests,
            ints["bursts"],
            _float(reals["burst_max_s"]),
            _float(reals["burst_rest_s"]),
            ints["burst_waits"],
            ints["burst_clock_redos"],
            _float(reals["in_bursts_s"]),
            seen,
            dict(redone) if redone is not None else None,
            _float(limit),
            tuple(float(v) for v in lists[0]) if lists[0] is not None else None,
            tuple(float(v) for v in lists[1]) if lists[1] is not None else None,
        )


@dataclass(frozen=True)
class Conditioning:
    """What preconditioning did (condition "sustained")."""

    seconds: float
    steady: bool
    sm_mhz: float | None
    temp_c: float | None
    limited: bool  # a reason holding the clock down was seen in the last chunk
    residual: float | None  # predicted drift still to come, relative (tau x slope)

    def to_extra(self) -> dict[str, Any]:
        return {
            "precondition_s": self.seconds,
            "precondition_steady": self.steady,
            "precondition_sm_mhz": self.sm_mhz,
            "precondition_temp_c": self.temp_c,
            "precondition_limited": self.limited,
            "precondition_residual": self.residual,
        }

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> Conditioning | None:
        seconds, steady = extra.get("precondition_s"), extra.get("precondition_steady")
        limited = extra.get("precondition_limited", False)
        optional = [
            extra.get(k)
            for k in ("precondition_sm_mhz", "precondition_temp_c", "precondition_residual")
        ]
        if not (_real(seconds) and _bool(steady) and _bool(limited)):
            return None
        if not all(x is None or _real(x) for x in optional):
            return None
        sm, temp, residual = (_float(x) for x in optional)
        return cls(float(seconds), steady, sm, temp, limited, residual)


# bench's phases, in the order they run (`Wall`)
WALL_PHASES = ("open", "warmup", "method", "condition", "measure", "judge", "close")


@dataclass(frozen=True)
class Wall:
    """Where a bench call's wall time went, phase by phase, in seconds of real time
    (`time.perf_counter`, whatever clock the measurement runs on):

    - open: the backend, the sampler and the GPU's facts;
    - warmup: the warmup's reps;
    - method: choosing how fn is timed (on CUDA, CUPTI's set-up) and the clock's probe;
    - condition: the state probe and the wait for a ready GPU (burst), or the sustained
      precondition;
    - measure: the reps, with the bursts' rests;
    - judge: telemetry windows, findings, statistics, and (outside a session) the wait
      for the driver's power sample after the last rep (`BenchConfig.wait_power`);
    - close: the sampler stopped.

    Their sum is the call's wall time, less the argument checks before and the results
    file after."""

    phases: tuple[tuple[str, float], ...]

    @classmethod
    def between(cls, marks: Sequence[float]) -> Wall:
        """From the `perf_counter` read at each phase's start and at the last one's end."""
        if len(marks) != len(WALL_PHASES) + 1:
            raise ValueError(f"{len(marks)} marks for {len(WALL_PHASES)} phases")
        spans = (b - a for a, b in itertools.pairwise(marks))
        return cls(tuple(zip(WALL_PHASES, spans, strict=True)))

    def seconds(self, phase: str) -> float:
        return dict(self.phases)[phase]

    @property
    def total_s(self) -> float:
        return sum(s for _, s in self.phases)

    def to_extra(self) -> dict[str, Any]:
        return {"wall_s": dict(self.phases)}

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> Wall | None:
        got = extra.get("wall_s")
        if not isinstance(got, Mapping) or tuple(got) != WALL_PHASES:
            return None
        if not all(_real(got[k]) for k in WALL_PHASES):
            return None
        return cls(tuple((k, float(got[k])) for k in WALL_PHASES))


def _int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool)


def _real(x: object) -> TypeGuard[float]:
    """A number a file can hold (JSON writes a float's inf as Infinity, so it may be one)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def _bool(x: object) -> TypeGuard[bool]:
    return isinstance(x, bool)


def _rounded(xs: Sequence[float] | None) -> list[float] | None:
    """Seconds to the tenth of a millisecond (a list in a record: a few bytes each)."""
    return None if xs is None else [round(x, 4) for x in xs]


def _float(x: object) -> float | None:
    return float(x) if isinstance(x, (int, float)) else None


__all__ = [
    "WALL_PHASES",
    "BurstSchedule",
    "Conditioning",
    "FirstBurst",
    "StateProbe",
    "TemperatureFacts",
    "Wall",
    "Warmup",
]
