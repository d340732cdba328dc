"""`gpuenv monitor`: what makes a GPU's numbers lie, live.

nvitop and nvidia-smi show processes and memory well; none of them shows why a
clock is where it is. This view does: per GPU the SM clock against its maximum
and the locked range with a minute of history, power against the limit,
temperature against the slowdown threshold, the active clock-event reasons in
words with how long each has been active, who holds the lock, and the
processes on the GPU.

Three layers, each usable alone:
  - `MonitorModel.update()` reads the backend and returns one immutable
    `GpuView` per GPU (a failed read becomes `GpuView.error`, never an exception);
  - `render()` lays views out for a terminal of a given size as lines of styled
    segments (plain text for `--once`, ANSI colours, or curses);
  - `run_tui()` is the curses loop (`q` quit, `p` pause, arrows or digits pick a
    GPU), `stream()` prints `--json` / `--csv` lines like `nvidia-smi dmon`.
"""

from __future__ import annotations

import collections
import contextlib
import csv
import dataclasses
import io
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from gpuenv.backend import Backend, reason_names
from gpuenv.errors import GpuenvError
from gpuenv.timebase import REAL_CLOCK, Clock

# What each clock-event reason means for a benchmark, in words.
REASON_WORDS: dict[int, str] = {
    0x1: "no work: clocks parked",
    0x2: "held by locked or application clocks",
    0x4: "clock lowered to stay under the power limit",
    0x8: "clock cut hard by the hardware (heat or power brake)",
    0x10: "held to the slowest GPU of its group",
    0x20: "clock lowered: the GPU is too hot",
    0x40: "clock cut hard: the GPU is too hot",
    0x80: "the board asked for less power",
    0x100: "held by the display clock",
    0x200: "held by a board limit",
    0x400: "held by a reliability limit",
}
REASON_SHORT: dict[int, str] = {
    0x1: "idle",
    0x2: "clock setting",
    0x4: "power cap",
    0x8: "HW slowdown",
    0x10: "sync boost",
    0x20: "thermal",
    0x40: "HW thermal",
    0x80: "power brake",
    0x100: "display clock",
    0x200: "board limit",
    0x400: "reliability",
}
# Which cumulative counter (backend.REASON_COUNTERS) measures time under each reason bit.
REASON_COUNTER: dict[int, str] = {
    0x1: "low_utilization",
    0x4: "power",
    0x10: "sync_boost",
    0x20: "thermal",
    0x40: "thermal",
    0x200: "board_limit",
    0x400: "reliability",
}
BAD_REASONS = 0x8 | 0x20 | 0x40 | 0x80  # the clock is cut because of heat or power delivery
WARN_REASONS = 0x4 | 0x10 | 0x200 | 0x400


# -- the model ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcView:
    pid: int
    user: str
    command: str
    used_memory_mib: int | None


@dataclass(frozen=True)
class ReasonView:
    bit: int
    name: str  # NVML's name, e.g. "SwPowerCap"
    words: str
    active_s: float | None  # how long it has been active without a break, as observed
    at_least: bool  # active since the monitor started: it may have been active longer
    share: float | None  # fraction of the last `history_s` under it, from the cumulative counter


@dataclass(frozen=True)
class LockView:
    locked_sm: tuple[int, int] | None
    known: bool  # False: nothing gpuenv knows of (NVML cannot read locked clocks)
    owner: str | None  # who holds it, in words
    holds: bool | None  # SM clock inside the range now (None: cannot tell, or unlocked)
    why: str | None = None  # why it does not hold


@dataclass(frozen=True)
class GpuView:
    """One GPU at one instant, everything the monitor shows."""

    index: int
    t: float  # clock.now()
    wall: float  # seconds since the epoch
    name: str = ""
    uuid: str = ""
    sm_mhz: int | None = None
    max_sm_mhz: int | None = None
    mem_mhz: int | None = None
    max_mem_mhz: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temp_c: float | None = None
    slowdown_c: float | None = None
    reasons: int = 0
    active: tuple[ReasonView, ...] = ()
    below_max_share: float | None = None  # share of counter_span_s below app/max clocks (counter)
    counter_span_s: float | None = None  # the span the counter shares cover (up to history_s)
    util_gpu: int | None = None
    util_mem: int | None = None
    lock: LockView | None = None
    processes: tuple[ProcView, ...] = ()
    history: tuple[tuple[float, int], ...] = ()  # (t, SM MHz) over the last history_s
    error: str | None = None


class _ProcessNames:
    """pid -> (user, command) through psutil, cached: a process's name does not change."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[float, str, str]] = {}

    def lookup(self, pid: int) -> tuple[str, str]:
        import psutil

        try:
            proc = psutil.Process(pid)
            start = proc.create_time()
            hit = self._cache.get(pid)
            if hit and hit[0] == start:
                return hit[1], hit[2]
            with proc.oneshot():
                try:
                    user = proc.username()
                except (psutil.AccessDenied, KeyError):
                    user = "?"
                try:
                    cmd = " ".join(proc.cmdline()) or proc.name()
                except psutil.AccessDenied:
                    cmd = proc.name()
            self._cache[pid] = (start, user, cmd)
            return user, cmd
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            self._cache.pop(pid, None)
            return "-", "(exited)"
        except psutil.AccessDenied:
            return "?", "?"  # another PID namespace or a hidepid /proc


LockLookup = Callable[[Backend, int], "LockView | None"]


def clocks_lock_view(backend: Backend, index: int) -> LockView:
    """The lock on one GPU as gpuenv's journal knows it (NVML has no getter for locked clocks)."""
    from gpuenv.clocks import lock_status

    st = lock_status(backend, index)
    return LockView(
        locked_sm=st.range if st.locked else None,
        known=st.locked is not None,
        owner=(st.owner + ("; stale: run 'gpuenv restore'" if st.stale else ""))
        if st.owner
        else None,
        holds=st.holds,
        why=st.reason_if_not_held,
    )


class MonitorModel:
    """Reads the GPUs and keeps a short history; `update()` returns one GpuView per GPU.

    Reads: the cheap values, power limit, utilization and processes every update;
    the cumulative reason counters (with the energy counter, ~3 ms on an H100) at
    most every `slow_period`; the lock from the journal at most every
    `lock_period` (whether it holds is checked against every update's clock).
    """

    def __init__(
        self,
        backend: Backend,
        gpus: Sequence[int],
        *,
        clock: Clock | None = None,
        history_s: float = 60.0,
        slow_period: float = 2.0,
        lock_period: float = 2.0,
        processes: bool = True,
        lock_lookup: LockLookup | None = clocks_lock_view,
    ):
        self.backend = backend
        self.gpus = list(gpus)
        self.clock = clock or REAL_CLOCK
        self.history_s = history_s
        self.slow_period = slow_period
        self.want_processes = processes
        self.lock_lookup = lock_lookup
        self.lock_period = lock_period
        self._locks: dict[int, tuple[float, LockView | None]] = {}
        self._names = _ProcessNames()
        self._static: dict[int, dict[str, Any]] = {}
        self._history: dict[int, collections.deque[tuple[float, int]]] = {
            i: collections.deque() for i in self.gpus
        }
        self._counters: dict[int, collections.deque[tuple[float, dict[str, int]]]] = {
            i: collections.deque() for i in self.gpus
        }
        self._last_slow: dict[int, float] = {}
        self._since: dict[int, dict[int, tuple[float, bool]]] = {i: {} for i in self.gpus}
        self._updates = 0

    def _static_of(self, i: int) -> dict[str, Any]:
        st = self._static.get(i)
        if st is None:
            info = self.backend.device_info(i)
            limits = self.backend.clock_limits(i)
            thresholds = self.backend.thresholds(i)
            st = {
                "name": info.name,
                "uuid": info.uuid,
                "max_sm": limits.max_sm_mhz,
                "max_mem": limits.max_mem_mhz,
                "slowdown": thresholds.slowdown_c,
            }
            self._static[i] = st
        return st

    def update(self) -> list[GpuView]:
        views = [self._read(i) for i in self.gpus]
        self._updates += 1
        return views

    def _read(self, i: int) -> GpuView:
        t = self.clock.now()
        wall = self.clock.wall()
        try:
            st = self._static_of(i)
            fast = self.backend.read_fast(i)
        except GpuenvError as err:
            return GpuView(index=i, t=t, wall=wall, error=str(err))
        hist = self._history[i]
        hist.append((t, fast.sm_mhz))
        while hist and hist[0][0] < t - self.history_s:
            hist.popleft()
        shares, below, span = self._counter_shares(i, t)
        active = self._active_reasons(i, t, fast.reasons, shares)
        view = GpuView(
            index=i,
            t=t,
            wall=wall,
            name=st["name"],
            uuid=st["uuid"],
            sm_mhz=fast.sm_mhz,
            max_sm_mhz=st["max_sm"],
            mem_mhz=fast.mem_mhz,
            max_mem_mhz=st["max_mem"],
            power_w=fast.power_w,
            temp_c=fast.temp_c,
            slowdown_c=st["slowdown"],
            reasons=fast.reasons,
            active=active,
            below_max_share=below,
            counter_span_s=span,
            history=tuple(hist),
        )
        extras: dict[str, Any] = {}
        # Each optional read on its own: one failing (not supported, no permission)
        # must not hide the others.
        with contextlib.suppress(GpuenvError):
            extras["power_limit_w"] = self.backend.power_limits(i).limit_w
        with contextlib.suppress(GpuenvError):
            util = self.backend.utilization(i)
            if util is not None:
                extras["util_gpu"], extras["util_mem"] = util
        if self.want_processes:
            with contextlib.suppress(GpuenvError):
                procs = []
                for p in sorted(self.backend.processes(i), key=lambda p: p.pid):
                    user, cmd = self._names.lookup(p.pid)
                    procs.append(ProcView(p.pid, user, cmd, p.used_memory_mib))
                extras["processes"] = tuple(procs)
        if self.lock_lookup is not None:
            extras["lock"] = self._lock(i, t, fast.sm_mhz)
        return _replace(view, **extras)

    def _lock(self, i: int, t: float, sm_mhz: int) -> LockView | None:
        cached = self._locks.get(i)
        if cached is None or t - cached[0] >= self.lock_period:
            assert self.lock_lookup is not None
            try:
                lk = self.lock_lookup(self.backend, i)
            except GpuenvError:
                lk = None
            self._locks[i] = cached = (t, lk)
            return lk
        lk = cached[1]
        if lk is None or lk.locked_sm is None or t == cached[0]:
            return lk
        lo, hi = lk.locked_sm  # between journal reads: does it hold at this update's clock?
        holds = lo - 1 <= sm_mhz <= hi + 1
        return dataclasses.replace(lk, holds=holds, why=None if holds else lk.why)

    def _counter_shares(
        self, i: int, t: float
    ) -> tuple[dict[str, float], float | None, float | None]:
        """Share of the last history_s under each cumulative counter."""
        ring = self._counters[i]
        if t - self._last_slow.get(i, -1e18) >= self.slow_period:
            try:
                slow = self.backend.read_slow(i)
            except GpuenvError:
                slow = None
            if slow is not None and slow.reason_ns:
                ring.append((t, dict(slow.reason_ns)))
                self._last_slow[i] = t
        while len(ring) > 2 and ring[1][0] <= t - self.history_s:
            ring.popleft()
        if len(ring) < 2 or ring[-1][0] - ring[0][0] <= 0:
            return {}, None, None
        (t0, c0), (t1, c1) = ring[0], ring[-1]
        span_ns = (t1 - t0) * 1e9
        shares = {k: min(1.0, max(0.0, (c1[k] - c0.get(k, c1[k])) / span_ns)) for k in c1}
        return shares, shares.get("total_app_clocks"), t1 - t0

    def _active_reasons(
        self, i: int, t: float, mask: int, shares: dict[str, float]
    ) -> tuple[ReasonView, ...]:
        since = self._since[i]
        first = self._updates == 0
        for bit in list(since):
            if not mask & bit:
                del since[bit]
        out = []
        bit = 1
        while bit <= mask:
            if mask & bit:
                if bit not in since:
                    since[bit] = (t, first)
                t0, at_least = since[bit]
                name = reason_names(bit)[0]
                counter = REASON_COUNTER.get(bit)
                out.append(
                    ReasonView(
                        bit=bit,
                        name=name,
                        words=REASON_WORDS.get(bit, name),
                        active_s=t - t0,
                        at_least=at_least,
                        share=shares.get(counter) if counter else None,
                    )
                )
            bit <<= 1
        return tuple(out)


def _replace(view: GpuView, **changes: Any) -> GpuView:
    return dataclasses.replace(view, **changes) if changes else view


# -- rendering ---------------------------------------------------------------------------

Segment = tuple[str, str]  # (text, style); styles: "" bold dim title ok warn bad sel bar
Line = list[Segment]


@dataclass
class Glyphs:
    bar_full: str = "█"
    bar_empty: str = "░"
    spark: str = "▁▂▃▄▅▆▇█"
    sep: str = "·"
    sel: str = "▶"
    yes: str = "✓"
    no: str = "✗"

    @classmethod
    def for_encoding(cls, encoding: str | None) -> Glyphs:
        if encoding and encoding.lower().replace("-", "") in ("utf8", "utf16", "utf32"):
            return cls()
        return cls(bar_full="#", bar_empty=".", spark="_.-=^", sep="|", sel=">", yes="ok", no="NO")


@dataclass
class Frame:
    """What the header says about the whole screen."""

    source: str = ""  # "NVML" / "SIMULATED GPU (scenario load)"
    simulated: bool = False
    interval_s: float = 1.0
    paused: bool = False
    selected: int = 0  # position in the views list
    keys: bool = True  # show the key help
    glyphs: Glyphs = field(default_factory=Glyphs)


def fmt_duration(seconds: float) -> str:
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {(s % 3600) // 60:02d} min"


def bar(frac: float | None, width: int, g: Glyphs) -> str:
    if width <= 0:
        return ""
    if frac is None:
        return " " * width
    n = round(max(0.0, min(1.0, frac)) * width)
    return g.bar_full * n + g.bar_empty * (width - n)


def sparkline(values: Sequence[float], width: int, lo: float, hi: float, g: Glyphs) -> str:
    """`values` in `width` cells (means of buckets when there are more values than cells),
    scaled from `lo` (lowest glyph) to `hi` (highest); a flat line sits mid-height."""
    if width <= 0 or not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        buckets = [
            values[int(k * step) : max(int(k * step) + 1, int((k + 1) * step))]
            for k in range(width)
        ]
        values = [sum(b) / len(b) for b in buckets]
    levels = len(g.spark)
    if hi <= lo:
        return g.spark[levels // 2] * len(values)
    span = hi - lo
    return "".join(g.spark[min(levels - 1, max(0, int((v - lo) / span * levels)))] for v in values)


def _clock_style(v: GpuView) -> str:
    if v.reasons & BAD_REASONS or (v.lock and v.lock.holds is False):
        return "bad"
    if v.reasons & WARN_REASONS:
        return "warn"
    return "ok"


def _reason_style(bit: int) -> str:
    if bit & BAD_REASONS:
        return "bad"
    if bit & WARN_REASONS:
        return "warn"
    return "dim"


def _not_held_why(v: GpuView) -> str:
    lk = v.lock
    if lk is not None and lk.locked_sm and v.sm_mhz is not None and v.sm_mhz > lk.locked_sm[1]:
        return "clock above the lock: not in force (reset by the driver or another tool?)"
    if v.reasons & 0x4:
        return "the power cap pulls the clock below the lock"
    if v.reasons & (0x20 | 0x40):
        return "thermal slowdown pulls the clock below the lock"
    if v.reasons & (0x8 | 0x80):
        return "a hardware slowdown pulls the clock below the lock"
    if v.reasons & 0x1:
        return "the GPU is idle"
    return (lk.why if lk and lk.why else "") or "below the locked range"


def _owner_text(v: GpuView) -> str:
    lk = v.lock
    if lk is None or not lk.owner or lk.locked_sm is None:
        return ""
    return f"by {lk.owner}"


def _lock_segments(v: GpuView, g: Glyphs, *, why: bool) -> Line:
    lk = v.lock
    if lk is None:
        return [("lock: unknown", "dim")]
    if lk.locked_sm is None:
        if lk.known:
            return [("lock: journaled, SM not locked", "dim")]
        return [("not locked by gpuenv", "dim")]
    lo, hi = lk.locked_sm
    rng = "base clock" if lo >= 0xFFFFFF00 else (f"{lo} MHz" if lo == hi else f"{lo}-{hi} MHz")
    segs: Line = [("locked ", "bold"), (rng, "bold")]
    if lk.holds is True:
        segs.append((f" {g.yes} holds", "ok"))
    elif lk.holds is False:
        segs.append((f" {g.no} NOT holding", "bad"))
        if why:
            segs.append((f": {_not_held_why(v)}", "bad"))
    return segs


def gpu_block(
    v: GpuView, width: int, frame: Frame, *, selected: bool = False, max_procs: int = 8
) -> list[Line]:
    """The detailed lines for one GPU."""
    g = frame.glyphs
    mark = f"{g.sel} " if selected else "  "
    title: Line = [(mark, "sel" if selected else ""), (f"GPU {v.index}", "title")]
    if v.name:
        title.append((f"  {v.name}", "bold"))
    if frame.simulated:
        title.append(("  (simulated)", "warn"))
    if v.uuid:
        title.append((f"  {v.uuid}", "dim"))
    lines: list[Line] = [title]
    if v.error is not None:
        lines.append([("    error: ", "bad"), (v.error, "bad")])
        return lines
    label_w = 12
    value_w = 10
    bw = max(0, min(30, width - label_w - value_w - 40))
    if bw < 5:
        bw = 0

    def row(
        label: str,
        value: str,
        value_style: str,
        rest: Line,
        frac: float | None = None,
        frac_style: str = "",
    ) -> Line:
        out: Line = [
            (f"    {label:<{label_w - 4}}", "dim"),
            (f"{value:>{value_w - 2}}  ", value_style),
        ]
        if bw and frac is not None:
            out.append((bar(frac, bw, g), frac_style or value_style or "bar"))
            out.append(("  ", ""))
        return out + rest

    # SM clock: now, against max and the lock
    cstyle = _clock_style(v)
    frac = v.sm_mhz / v.max_sm_mhz if v.sm_mhz is not None and v.max_sm_mhz else None
    rest: Line = [(f"of {v.max_sm_mhz} max", "dim")]
    if v.lock and v.lock.locked_sm:
        lo, hi = v.lock.locked_sm
        rng = "base" if lo >= 0xFFFFFF00 else (f"{lo}" if lo == hi else f"{lo}-{hi}")
        held = "" if v.lock.holds is None else (f" {g.yes}" if v.lock.holds else f" {g.no}")
        rest.append((f"  lock {rng}{held}", "bad" if v.lock.holds is False else "ok"))
    lines.append(row("SM", f"{v.sm_mhz} MHz", cstyle, rest, frac))
    # history
    vals = [mhz for _, mhz in v.history]
    if len(vals) >= 2:
        lo_v, hi_v = min(vals), max(vals)
        span = f"  {lo_v}-{hi_v} MHz" if lo_v != hi_v else f"  {lo_v} MHz"
        ago = fmt_duration(v.history[-1][0] - v.history[0][0])
        sw = max(0, width - label_w - value_w - len(span) - 1)
        # scaled to the range shown beside it: small moves (a cap creeping down) stay visible
        spark = sparkline(vals, min(sw, len(vals)), lo_v, hi_v, g)
        lines.append(row("history", ago, "dim", [(spark, cstyle), (span, "dim")]))
    # lock and its owner (on a line of its own when both do not fit)
    lock_line: Line = [(f"    {'lock':<{label_w - 4}}", "dim"), *_lock_segments(v, g, why=True)]
    owner = _owner_text(v)
    if owner and sum(len(t) for t, _ in lock_line) + 2 + len(owner) > width:
        lines += [lock_line, [(" " * label_w, ""), (owner, "dim")]]
    else:
        lines.append([*lock_line, *([(f"  {owner}", "dim")] if owner else [])])
    # memory clock
    lines.append(row("memory", f"{v.mem_mhz} MHz", "", [(f"of {v.max_mem_mhz} max", "dim")]))
    # power
    if v.power_w is not None:
        pfrac = v.power_w / v.power_limit_w if v.power_limit_w else None
        pstyle = "warn" if pfrac is not None and pfrac >= 0.95 else ""
        lim = f"of {v.power_limit_w:.0f} W limit" if v.power_limit_w else "limit unknown"
        lines.append(row("power", f"{v.power_w:.0f} W", pstyle, [(lim, "dim")], pfrac))
    # temperature
    if v.temp_c is not None:
        tfrac = v.temp_c / v.slowdown_c if v.slowdown_c else None
        tstyle = ""
        if v.slowdown_c:
            tstyle = (
                "bad"
                if v.temp_c >= v.slowdown_c
                else ("warn" if v.temp_c >= v.slowdown_c - 10 else "")
            )
        tail = f"slowdown at {v.slowdown_c:.0f} C" if v.slowdown_c else "slowdown threshold unknown"
        lines.append(row("temp", f"{v.temp_c:.0f} C", tstyle, [(tail, "dim")], tfrac))
    # utilisation
    if v.util_gpu is not None:
        lines.append(
            row(
                "util", f"{v.util_gpu} %", "", [(f"memory {v.util_mem} %", "dim")], v.util_gpu / 100
            )
        )
    # why: the active reasons
    if not v.active:
        lines.append(
            [
                (f"    {'why':<{label_w - 4}}", "dim"),
                ("no clock-event reason: at the clock the GPU allows", "ok"),
            ]
        )
    for k, r in enumerate(v.active):
        lead = "why" if k == 0 else ""
        how_long = ""
        if r.active_s is not None and not (r.at_least and r.active_s < 1):
            how_long = f" for {'>=' if r.at_least else ''}{fmt_duration(r.active_s)}"
        share = ""
        if r.share is not None and v.counter_span_s:
            share = f", {r.share:.0%} of the last {fmt_duration(v.counter_span_s)}"
        lines.append(
            [
                (f"    {lead:<{label_w - 4}}", "dim"),
                (REASON_SHORT.get(r.bit, r.name), _reason_style(r.bit)),
                (how_long + share, ""),
                (f"  {g.sep} {r.words}", "dim"),
            ]
        )
    if v.below_max_share is not None and v.below_max_share > 0.005 and v.counter_span_s:
        span = fmt_duration(v.counter_span_s)
        text = f"below its top clock {v.below_max_share:.0%} of the last {span}"
        lines.append([(f"    {'':<{label_w - 4}}", ""), (text + " (all limiters)", "dim")])
    # processes
    if v.processes:
        lines.append(
            [
                (f"    {'procs':<{label_w - 4}}", "dim"),
                (f"{'PID':>7}  {'USER':<10} {'GPU MEM':>9}  COMMAND", "dim"),
            ]
        )
        for p in v.processes[:max_procs]:
            mem = f"{p.used_memory_mib} MiB" if p.used_memory_mib is not None else "-"
            lines.append(
                [
                    (f"    {'':<{label_w - 4}}", ""),
                    (f"{p.pid:>7}  {p.user[:10]:<10} {mem:>9}  {p.command}", ""),
                ]
            )
        if len(v.processes) > max_procs:
            lines.append(
                [
                    (f"    {'':<{label_w - 4}}", ""),
                    (f"... {len(v.processes) - max_procs} more", "dim"),
                ]
            )
    else:
        lines.append([(f"    {'procs':<{label_w - 4}}", "dim"), ("none", "dim")])
    return lines


def gpu_row(v: GpuView, frame: Frame, *, selected: bool) -> Line:
    """One compact line per GPU, for many GPUs or a small terminal."""
    g = frame.glyphs
    mark = (f"{g.sel} ", "sel") if selected else ("  ", "")
    if v.error is not None:
        return [mark, (f"GPU {v.index:<2} ", "title"), (v.error, "bad")]
    short = v.name.replace("NVIDIA ", "")[:16]
    segs: Line = [mark, (f"GPU {v.index:<2} ", "title"), (f"{short:<17}", "")]
    segs.append((f"{v.sm_mhz:>4}/{v.max_sm_mhz} MHz  ", _clock_style(v)))
    if v.power_w is not None:
        lim = f"/{v.power_limit_w:.0f}" if v.power_limit_w else ""
        segs.append((f"{v.power_w:>4.0f}{lim} W  ", ""))
    if v.temp_c is not None:
        segs.append((f"{v.temp_c:>3.0f} C  ", ""))
    if v.util_gpu is not None:
        segs.append((f"{v.util_gpu:>3}%  ", ""))
    if v.lock and v.lock.locked_sm:
        lo, hi = v.lock.locked_sm
        rng = "base" if lo >= 0xFFFFFF00 else (f"{lo}" if lo == hi else f"{lo}-{hi}")
        held = "" if v.lock.holds is None else (f" {g.yes}" if v.lock.holds else f" {g.no}")
        segs.append((f"lock {rng}{held}  ", "bad" if v.lock.holds is False else "bold"))
    for r in v.active:
        segs.append((REASON_SHORT.get(r.bit, r.name) + " ", _reason_style(r.bit)))
    return segs


def header(views: Sequence[GpuView], frame: Frame, width: int) -> Line:
    wall = views[0].wall if views else time.time()
    left: Line = [
        ("gpuenv monitor", "title"),
        (f"  {time.strftime('%H:%M:%S', time.localtime(wall))}", ""),
    ]
    left.append((f"  every {frame.interval_s:g} s", "dim"))
    if frame.source:
        left.append((f"  {frame.source}", "warn" if frame.simulated else "dim"))
    if frame.paused:
        left.append(("  PAUSED", "warn"))
    if frame.keys:
        keys = "q quit  p pause" + ("  arrows/0-9 GPU" if len(views) > 1 else "")
        used = sum(len(t) for t, _ in left)
        pad = width - used - len(keys)
        if pad >= 2:
            left.append((" " * pad + keys, "dim"))
    return left


def render(views: Sequence[GpuView], frame: Frame, width: int, height: int | None) -> list[Line]:
    """Lay the views out for a `width` x `height` terminal (height None: no limit, for --once).

    Every GPU in full when they fit; otherwise one compact row per GPU and the
    selected GPU in full below, cut to the height left.
    """
    lines: list[Line] = [header(views, frame, width)]
    sel = min(max(frame.selected, 0), max(len(views) - 1, 0))
    blocks = [
        gpu_block(v, width, frame, selected=(k == sel and len(views) > 1))
        for k, v in enumerate(views)
    ]
    full = sum(len(b) + 1 for b in blocks)
    if height is None or 1 + full <= height:
        for b in blocks:
            lines.append([])
            lines.extend(b)
    else:
        room = height - 1
        rows = [gpu_row(v, frame, selected=(k == sel)) for k, v in enumerate(views)]
        n_rows = min(len(rows), max(1, room - 4))  # keep room for the detail block
        first = min(max(0, sel - n_rows // 2), len(rows) - n_rows)
        lines.append([])
        lines.extend(rows[first : first + n_rows])
        if views:
            lines.append([])
            lines.extend(gpu_block(views[sel], width, frame, selected=False, max_procs=3))
        lines = lines[:height]
    return [clip(line, width) for line in lines]


def clip(line: Line, width: int) -> Line:
    out: Line = []
    used = 0
    for text, style in line:
        if used >= width:
            break
        text = text[: width - used]
        out.append((text, style))
        used += len(text)
    return out


def plain(lines: Iterable[Line]) -> str:
    return "\n".join("".join(t for t, _ in line).rstrip() for line in lines) + "\n"


_ANSI = {
    "": "",
    "bold": "1",
    "dim": "2",
    "title": "1;36",
    "ok": "32",
    "warn": "33",
    "bad": "1;31",
    "sel": "7",
    "bar": "34",
}


def ansi(lines: Iterable[Line]) -> str:
    out = []
    for line in lines:
        parts = []
        for text, style in line:
            code = _ANSI.get(style, "")
            parts.append(f"\x1b[{code}m{text}\x1b[0m" if code and text.strip() else text)
        out.append("".join(parts).rstrip())
    return "\n".join(out) + "\n"


# -- streaming (--json / --csv) ----------------------------------------------------------

STREAM_FIELDS = (
    "time",
    "gpu",
    "uuid",
    "sm_mhz",
    "max_sm_mhz",
    "mem_mhz",
    "power_w",
    "power_limit_w",
    "temp_c",
    "slowdown_c",
    "util_gpu_pct",
    "util_mem_pct",
    "reasons",
    "reason_names",
    "locked_sm_mhz",
    "lock_holds",
    "n_processes",
    "error",
)


def stream_record(v: GpuView) -> dict[str, Any]:
    """One flat record per GPU per tick (the --json / --csv line)."""
    lock = v.lock
    locked = list(lock.locked_sm) if lock and lock.locked_sm else None
    stamp = (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(v.wall)) + f".{int(v.wall % 1 * 1000):03d}Z"
    )
    return {
        "time": stamp,
        "gpu": v.index,
        "uuid": v.uuid or None,
        "sm_mhz": v.sm_mhz,
        "max_sm_mhz": v.max_sm_mhz,
        "mem_mhz": v.mem_mhz,
        "power_w": None if v.power_w is None else round(v.power_w, 2),
        "power_limit_w": v.power_limit_w,
        "temp_c": v.temp_c,
        "slowdown_c": v.slowdown_c,
        "util_gpu_pct": v.util_gpu,
        "util_mem_pct": v.util_mem,
        "reasons": f"{v.reasons:#x}",
        "reason_names": reason_names(v.reasons),
        "locked_sm_mhz": locked,
        "lock_holds": lock.holds if lock else None,
        "n_processes": len(v.processes),
        "error": v.error,
    }


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, list):
        return "|".join(str(x) for x in value)
    return value


def stream(
    model: MonitorModel,
    out: IO[str],
    *,
    fmt: str,
    interval_s: float,
    count: int | None = None,
    duration_s: float | None = None,
) -> int:
    """Print one line per GPU per tick until `count` ticks or `duration_s` pass; returns ticks.

    Ticks keep to a fixed schedule (no drift). Each tick is flushed, so a pipe or
    a log file sees it at once.
    """
    clock = model.clock
    start = clock.now()
    writer = None
    buf = io.StringIO()
    if fmt == "csv":
        writer = csv.DictWriter(buf, fieldnames=STREAM_FIELDS, lineterminator="\n")
        writer.writeheader()
    ticks = 0
    while True:
        for v in model.update():
            rec = stream_record(v)
            if writer is not None:
                writer.writerow({k: _csv_value(x) for k, x in rec.items()})
            else:
                buf.write(json.dumps(rec, separators=(",", ":")) + "\n")
        out.write(buf.getvalue())
        out.flush()
        buf.seek(0)
        buf.truncate()
        ticks += 1
        if count is not None and ticks >= count:
            return ticks
        due = start + ticks * interval_s
        if duration_s is not None and due - start > duration_s + 1e-9:
            return ticks
        clock.sleep(max(0.0, due - clock.now()))


# -- the curses loop ---------------------------------------------------------------------

KEYS_NEXT = ("KEY_RIGHT", "KEY_DOWN", "\t", "j", "l")
KEYS_PREV = ("KEY_LEFT", "KEY_UP", "KEY_BTAB", "k", "h")


class Ui:
    """Key handling and state of the interactive view, apart from curses (tested directly)."""

    def __init__(self, n_gpus: int):
        self.n = n_gpus
        self.selected = 0
        self.paused = False
        self.quit = False

    def key(self, key: str) -> bool:
        """Handle one key; True when the screen needs a redraw."""
        if key in ("q", "Q", "\x1b"):
            self.quit = True
        elif key in ("p", "P", " "):
            self.paused = not self.paused
        elif key in KEYS_NEXT:
            self.selected = (self.selected + 1) % max(self.n, 1)
        elif key in KEYS_PREV:
            self.selected = (self.selected - 1) % max(self.n, 1)
        elif len(key) == 1 and key.isdigit() and int(key) < self.n:
            self.selected = int(key)
        elif key != "KEY_RESIZE":
            return False
        return True


def run_tui(
    model: MonitorModel, frame: Frame, *, interval_s: float, stop_after_s: float | None = None
) -> None:
    """The interactive view until `q` (or `stop_after_s`): erase + noutrefresh + doupdate
    each frame, so no flicker."""
    import curses
    import locale

    locale.setlocale(locale.LC_ALL, "")
    # ncurses prefers LINES/COLUMNS from the environment to the terminal's real size,
    # and a stale exported pair would pin the view to it, resizes included.
    os.environ.pop("LINES", None)
    os.environ.pop("COLUMNS", None)
    frame.glyphs = Glyphs.for_encoding(locale.getpreferredencoding(False))

    def main(scr: Any) -> None:
        curses.curs_set(0)
        styles = _curses_styles(curses)
        ui = Ui(len(model.gpus))
        views = model.update()
        started = model.clock.now()
        next_due = started + interval_s
        dirty = True
        while not ui.quit:
            if stop_after_s is not None and model.clock.now() - started >= stop_after_s:
                return
            if dirty:
                frame.paused, frame.selected = ui.paused, ui.selected
                h, w = scr.getmaxyx()
                _draw(scr, render(views, frame, w, h), styles, curses)
                dirty = False
            wait_ms = max(10, int((next_due - model.clock.now()) * 1000))
            scr.timeout(min(wait_ms, 1000))
            try:
                key = scr.getkey()
            except curses.error:  # timeout: no key
                key = ""
            except KeyboardInterrupt:
                return
            if key:
                dirty = ui.key(key) or dirty
            if model.clock.now() >= next_due:
                next_due += interval_s * max(
                    1, int((model.clock.now() - next_due) // interval_s) + 1
                )
                if not ui.paused:
                    views = model.update()
                    dirty = True

    with contextlib.suppress(KeyboardInterrupt):
        curses.wrapper(main)


def _curses_styles(curses: Any) -> dict[str, int]:
    styles = {
        "": curses.A_NORMAL,
        "bold": curses.A_BOLD,
        "dim": curses.A_DIM,
        "sel": curses.A_REVERSE,
    }
    colours = {
        "title": (curses.COLOR_CYAN, curses.A_BOLD),
        "ok": (curses.COLOR_GREEN, 0),
        "warn": (curses.COLOR_YELLOW, 0),
        "bad": (curses.COLOR_RED, curses.A_BOLD),
        "bar": (curses.COLOR_BLUE, 0),
    }
    has = False
    with contextlib.suppress(curses.error):
        curses.start_color()
        curses.use_default_colors()
        has = curses.has_colors()
    for k, (name, (fg, extra)) in enumerate(colours.items(), start=1):
        if has:
            curses.init_pair(k, fg, -1)
            styles[name] = curses.color_pair(k) | extra
        else:
            styles[name] = curses.A_BOLD
    return styles


def _draw(scr: Any, lines: list[Line], styles: dict[str, int], curses: Any) -> None:
    scr.erase()
    h, w = scr.getmaxyx()
    for y, line in enumerate(lines[:h]):
        x = 0
        for text, style in line:
            if x >= w:
                break
            text = text[: w - x]
            with contextlib.suppress(curses.error):  # the bottom-right cell raises after writing
                scr.addstr(y, x, text, styles.get(style, 0))
            x += len(text)
    scr.noutrefresh()
    curses.doupdate()


# -- a moving simulated GPU, for demos -----------------------------------------------------

SCENARIOS: dict[str, str] = {
    "idle": "a CUDA context and no work: the clock boosts to its maximum",
    "load": "sustained heavy matmuls: the power cap engages and the chip heats",
    "bursts": "8 s of heavy work, 6 s idle, repeated: ramps, caps and recoveries",
    "shared": "a second process keeps the GPU 60% busy beside light work of ours",
}


class SimScenario:
    """Drives simulated GPUs in the background, in real time, so the monitor shows them move.

    Only for the simulated backend: the header says SIMULATED and names the scenario.
    """

    def __init__(self, sim: Any, gpus: Sequence[int], name: str):
        if name not in SCENARIOS:
            from gpuenv.errors import ConfigError

            raise ConfigError(
                f"unknown scenario {name!r}", hint=f"use one of {', '.join(SCENARIOS)}"
            )
        self.sim = sim
        self.gpus = list(gpus)
        self.name = name
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in self.gpus:
            th = threading.Thread(
                target=self._drive, args=(i,), name=f"gpuenv-sim-{self.name}-{i}", daemon=True
            )
            th.start()
            self._threads.append(th)

    def stop(self) -> None:
        self._stop.set()
        for th in self._threads:
            th.join(timeout=2)
        for i in self.gpus:
            with contextlib.suppress(Exception):
                if self.name == "shared":
                    self.sim.set_background_load(i, 0.0)
                self.sim.close_context(i)

    def _work(self, i: int, seconds: float, intensity: float) -> None:
        """About `seconds` of work in small chunks, so stop() is prompt."""
        end = time.monotonic() + seconds
        max_hz = self.sim.clock_limits(i).max_sm_mhz * 1e6
        while not self._stop.is_set() and time.monotonic() < end:
            self.sim.run_work(i, 0.1 * max_hz, power_intensity=intensity)

    def _drive(self, i: int) -> None:
        try:
            self.sim.open_context(i)
            if self.name == "shared":
                self.sim.set_background_load(i, 0.6)
            while not self._stop.is_set():
                if self.name == "idle":
                    self._stop.wait(1.0)
                elif self.name == "load":
                    self._work(i, 3600.0, 1.0)
                elif self.name == "bursts":
                    self._work(i, 8.0, 1.0)
                    self._stop.wait(6.0)
                elif self.name == "shared":
                    self._work(i, 3600.0, 0.3)
        except GpuenvError as err:  # a fault injected in the sim ends the scenario, visibly
            print(f"gpuenv: scenario {self.name} stopped on GPU {i}: {err}", file=sys.stderr)


__all__ = [
    "REASON_WORDS",
    "SCENARIOS",
    "Frame",
    "Glyphs",
    "GpuView",
    "LockView",
    "MonitorModel",
    "ProcView",
    "ReasonView",
    "SimScenario",
    "Ui",
    "ansi",
    "clocks_lock_view",
    "plain",
    "render",
    "run_tui",
    "stream",
    "stream_record",
]
