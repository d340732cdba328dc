"""The session as the harness sees it: `BenchSession`, a typed joint between two doors.

`gpuenv.bench(fn, session=env)` runs inside a `gpuenv.stable()` session: it borrows the
session's backend, sampler, facts, policy and mode, tells it when work ended (burst
mode waits from there), asks it to wait until fn's GPU has recovered, borrows its
conditioner (what the session's measurements learned: warmups, state references, fn's
temperature slope), and hands it the measurement to keep. The harness
(gpuenv.timing) cannot import gpuenv.session (the session imports the harness), so the
session is named here, below both, by what the harness uses of it. `Session` is checked
against it where it passes itself to `bench` (mypy): a member renamed on one side is a
type error, not a burst wait that silently stops moving. `session_gpus` is the one reading
of which GPUs a session's bench calls run on.

The sampler's side of the joint is `gpuenv.telemetry.SampleSource`; a held lock's is
`gpuenv.locking.HeldLock`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from gpuenv.backend import Backend
from gpuenv.conditioning import Condition, Conditioner
from gpuenv.results import Measurement
from gpuenv.telemetry import SampleSource
from gpuenv.verdict import GpuFacts, Policy, VerdictConfig


class BenchSession(Protocol):
    """What `gpuenv.bench` uses of the `gpuenv.stable()` session it runs in."""

    @property
    def backend(self) -> Backend: ...

    @property
    def sampler(self) -> SampleSource: ...

    @property
    def gpus(self) -> list[int]: ...

    @property
    def facts(self) -> Mapping[int, GpuFacts]:
        """Each GPU's facts, read when the session opened (its lock's range included)."""
        ...

    @property
    def policy(self) -> Policy: ...

    @property
    def mode(self) -> Condition:
        """ "burst" or "sustained": the condition a bench in this session measures in."""
        ...

    @property
    def config(self) -> VerdictConfig: ...

    def keep(self, m: Measurement) -> Measurement:
        """Keep a finished measurement: its trace attached, appended to the output."""
        ...

    def work_ended(self, t: float) -> None:
        """Work ran on the GPU until `t` (sampler clock): a burst wait starts there."""
        ...

    def wait_until_recovered(
        self, fn: Callable[..., object] | None = None, *, gpus: Sequence[int] | None = None
    ) -> float:
        """Burst mode: wait until `gpus` (default: the session's) are cool and uncapped;
        seconds waited."""
        ...

    @property
    def conditioner(self) -> Conditioner:
        """What a measurement in the session waits for, and what the session's measurements
        learned (gpuenv.conditioning.Conditioner): the session owns it, a bench borrows it."""
        ...


def session_gpus(session: BenchSession) -> list[int]:
    """The GPUs a session's bench calls run on: the session's own, else those its sampler
    watches."""
    return list(session.gpus or session.sampler.gpus)


__all__ = ["BenchSession", "session_gpus"]
