"""A measurement's power and energy completed from the driver's power sample after it.

The driver keeps a power sample every ~20 ms, each the mean power since the one before
(`Backend.power_samples`); a region's power and energy come from them where a sample at
or before its start and one at or after its end are in (gpuenv.telemetry.summary). At a
region's very end the one after it is not out yet: its window, read then, takes its power
from the cheap readings (a 10 ms region from idle read ~1.2 J of its ~11 J on the
simulated H100). `Completion` keeps such a measurement and completes it once the sample is
out, without making the region's end wait for it (a loop of steps does not slow down):

- a `stable()` session's `measure` region: completed at the next region's start (the
  sample is out once one interval has passed), when it is read, or at the session's close
  (one wait, at most `POWER_WAIT_S`); appended to the session's `output` then, in order;
- a measurement whose caller holds the record returned (`record`, `repeat`): completed
  before it is returned, waiting for the sample where it is not out yet. A bench in a
  session does not wait (`Session.keep`): its wall is a figure of its own;
- a `gpuenv.bench` call outside a session: its last reps and the whole call, after its
  clock probe and judging (`after_reps`; `BenchConfig.wait_power`).

The session owns one `Completion`, which owns which measurements wait (`Results` owns the
measurements and their file; the sampler, the samples).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import replace

from gpuenv.results import Measurement, Results
from gpuenv.telemetry import Sampler, SampleSource, Window
from gpuenv.telemetry.sampled import SAMPLE_GAP_MAX_S, SAMPLED_MIN_S
from gpuenv.telemetry.sampler import POWER_SAMPLE_S

log = logging.getLogger(__name__)


class Completion:
    """The measurements of `results` whose power and energy await the driver's power sample
    after them, on `sampler` (`gpus`: where a measurement names none)."""

    def __init__(self, sampler: Sampler, results: Results, gpus: Sequence[int]):
        self.sampler, self.results, self.gpus = sampler, results, list(gpus)
        self._waiting: list[int] = []  # indices in `results`, in order

    def add(self, m: Measurement, *, later: bool) -> int:
        """Keep `m` in `results`; returns its index. `later`: where the sample after it is
        not out yet, it is held (not appended to the file) until `settle` completes it;
        else `m` is taken as it is (see `complete`)."""
        self.settle(wait=False)  # those kept before whose sample is out now
        due = later and self.sampler.power_due(spans(m), m.gpus or self.gpus)
        index = self.results.add(m, held=due)
        if due:
            self._waiting.append(index)
        return index

    def settle(self, *, wait: bool) -> None:
        """Complete the measurements held: those whose sample is out (looked for once a
        sample interval has passed since their end: a drain costs 0.3-0.55 ms per GPU on an
        H200), or, with `wait`, all of them, waiting for it (at most POWER_WAIT_S after
        the last one's end). Each is appended to the file as it is completed."""
        if not self._waiting:
            return
        now = self.sampler.clock.now()
        left = []
        for index in self._waiting:
            m = self.results[index]
            covered, gpus = spans(m), m.gpus or self.gpus
            if not wait and (
                now - max(b for _, b in covered) < POWER_SAMPLE_S
                or self.sampler.power_due(covered, gpus)
            ):
                left.append(index)
                continue
            if wait:
                self.sampler.await_power(covered, gpus)
            try:
                m = self._again(m)
            except Exception as err:  # telemetry never raises into the benchmark
                log.warning("gpuenv: %r keeps its power from the readings: %s", m.name, err)
            self.results.settle(index, m)
        self._waiting = left

    def get(self, index: int) -> Measurement:
        """The measurement at `index`, completed (waiting for its sample where held)."""
        if index in self._waiting:
            self.settle(wait=True)
        return self.results[index]

    def _again(self, m: Measurement) -> Measurement:
        return completed(m, self.sampler)


def completed(m: Measurement, sampler: SampleSource, *, since: float | None = None) -> Measurement:
    """`m` with its windows' power and energy summarised again, from the driver's power
    samples that are in now. `since`: only the rep windows that end after it, and at least
    `SAMPLED_MIN_S` long (the others read no differently: their samples were in, or they
    take the readings), and the whole measurement's (a bench's thousands of reps are not
    each summarised twice)."""

    def again(windows: tuple[Window, ...], after: float, min_s: float) -> tuple[Window, ...]:
        out = list(windows)
        for g in {w.gpu for w in windows} & set(sampler.gpus):
            idx = [
                i
                for i, w in enumerate(windows)
                if w.gpu == g and w.t1 > after and w.duration_s >= min_s
            ]
            if idx:
                fresh = sampler.windows([(windows[i].t0, windows[i].t1) for i in idx], g)
                for i, w in zip(idx, fresh, strict=True):
                    out[i] = windows[i].with_power_of(w)
        return tuple(out)

    reps = (-math.inf, 0.0) if since is None else (since, SAMPLED_MIN_S)
    return replace(
        m,
        windows=again(m.windows, *reps),
        summary_windows=again(m.summary_windows, -math.inf, 0.0),
    )


def power_due(reps: Sequence[tuple[float, float]], sampler: SampleSource, gpu: int) -> bool:
    """Whether the driver's power sample after the last of `reps` (a bench's, just ended)
    is still to come on `gpu`, for a rep's window or the whole call's."""
    if not reps:
        return False
    whole = (min(a for a, _ in reps), max(b for _, b in reps))
    return sampler.power_due([*reps, whole], [gpu])


def after_reps(m: Measurement, sampler: SampleSource, gpu: int) -> Measurement:
    """`m` (a `gpuenv.bench` call outside a session, judged at its last rep's end) with the
    power and energy of its last reps and of the whole call from the driver's power sample
    after the last rep, waited for: at most POWER_WAIT_S after the rep's end, the judging
    and the clock probe since counting towards it. Judged at the rep's end, a call of 10 ms
    of reps read ~12% of its energy (the readings in force, from before its work) and
    0.06-0.57 s of bursts -80% .. +19% on the simulated H100."""
    covered = spans(m)
    if not covered:
        return m
    sampler.await_power(covered, [gpu])
    # spans ending before this had their samples when judged: the newest sample then
    # was at most one stamp (45 ms on an H200) before the last rep's end
    since = max(b for _, b in covered) - 2 * SAMPLE_GAP_MAX_S
    try:
        return completed(m, sampler, since=since)
    except Exception as err:  # telemetry never raises into the benchmark
        log.warning("gpuenv: %r keeps its power from the readings: %s", m.name, err)
        return m


def spans(m: Measurement) -> list[tuple[float, float]]:
    """The spans `m`'s windows cover (its reps', and the whole measurement's)."""
    return sorted({(w.t0, w.t1) for w in (*m.windows, *m.summary_windows)})


__all__ = ["Completion", "after_reps", "completed", "power_due", "spans"]
