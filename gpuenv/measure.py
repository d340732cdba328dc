"""`with env.measure(name) as m:` -- one timed region of a `gpuenv.stable()` session.

The block is timed on the host (or with CUDA events when the session asks), burst
mode first waits for the cool, uncapped state, sustained mode preconditions once;
the session's `record()` then judges the region through gpuenv.judge like every
other measurement.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from gpuenv.errors import ConfigError, GpuenvError

if TYPE_CHECKING:
    from gpuenv.results import Measurement


class MeasureContext:
    """`with env.measure(name) as m:` times the block; afterwards `m` reads as its Measurement.

    `m.telemetry`, `m.findings`, `m.verdict`, `m.times_s` ... are the Measurement's
    (`m.measurement` is the record itself). They exist once the block has ended.
    """

    def __init__(self, session: Any, name: str):
        self._session = session
        self.name = name
        self.measurement: Measurement | None = None
        self._t0 = 0.0
        self._started = 0.0
        self._events: tuple[Any, Any] | None = None

    def __enter__(self) -> MeasureContext:
        env = self._session
        if self.measurement is not None or self._t0:
            raise GpuenvError(f"measure({self.name!r}) was already used; call env.measure() again")
        if env.mode == "burst":
            env.wait_until_recovered()
        elif not env._preconditioned:
            if env._default_load() is not None:
                env.precondition()
            else:
                env._warn_once(
                    "no-load",
                    "mode='sustained' has no load to precondition the GPU with before "
                    f"measure({self.name!r}): pass load=fn to gpuenv.stable(), or use "
                    "env.repeat(fn)/env.bench(fn); measuring as it is",
                )
        if env.cuda_events:
            torch = sys.modules.get("torch")
            if torch is None or not torch.cuda.is_available():
                raise ConfigError(
                    "cuda_events=True needs torch imported and a CUDA device",
                    hint="import torch first, or use the host clock (cuda_events=False)",
                )
            self._events = (
                torch.cuda.Event(enable_timing=True),
                torch.cuda.Event(enable_timing=True),
            )
        self._started = env.clock.wall()
        self._t0 = env.sampler.mark()
        if self._events is not None:
            self._events[0].record()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        env = self._session
        timer = "host"
        device_s = None
        if self._events is not None:
            self._events[1].record()
            self._events[1].synchronize()
            device_s = self._events[0].elapsed_time(self._events[1]) / 1e3
            timer = "cuda_events"
        t1 = env.sampler.mark()
        if exc_type is not None:
            return  # the region failed: nothing to record, the exception propagates
        host_s = t1 - self._t0
        extra = {"host_s": host_s} if device_s is not None else {}
        self.measurement = env.record(
            self.name,
            [device_s if device_s is not None else host_s],
            [(self._t0, t1)],
            timer=timer,
            started_at=self._started,
            extra=extra,
            policy="reject" if env.policy == "retry" else env.policy,
        )

    def __getattr__(self, attr: str) -> Any:
        m = self.__dict__.get("measurement")
        if m is None:
            raise AttributeError(
                f"measure({self.__dict__.get('name')!r}) has no {attr!r} yet: read it after "
                "the with-block ends"
            )
        return getattr(m, attr)

    def __str__(self) -> str:
        return str(self.measurement) if self.measurement else f"<measuring {self.name!r}>"

    def __repr__(self) -> str:
        verdict = self.measurement.verdict if self.measurement else "running"
        return f"<gpuenv measurement {self.name!r}: {verdict}>"
