"""`gpuenv doctor`'s GPU checks: the driver, who may lock clocks, and each GPU's state now.

Every check is a function of a `Context` yielding `Check`s; it asks the backend
what it is (`capabilities`), never its name.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from typing import Any, Literal

from gpuenv.backend import REASON_GPU_IDLE, Backend, reason_names
from gpuenv.doctor.records import Check, CheckFn, CheckSeverity, Context
from gpuenv.errors import GpuenvError, NotSupported, PermissionDenied


def check_driver(ctx: Context) -> Iterable[Check]:
    if ctx.backend is None:
        err = ctx.open_error
        message = err.message if err is not None else "the GPU backend could not be opened"
        fix = err.hint if err is not None else None
        yield Check("driver", "error", message, fix)
        return
    b = ctx.backend
    n = b.device_count()
    plural = "s" if n != 1 else ""
    if b.capabilities.simulated:
        yield Check(
            "driver",
            "info",
            f"the simulated GPU ({n} GPU{plural}): findings describe it, not this machine",
            "drop --sim / GPUENV_BACKEND=sim to check the real GPUs",
        )
        return
    if n == 0:
        yield Check("driver", "error", "NVML works but sees no GPU", "check 'nvidia-smi -L'")
        return
    yield Check("driver", "ok", f"NVML works: driver {b.driver_version()}, {n} GPU{plural}")


def check_permission(ctx: Context) -> Iterable[Check]:
    """Can clocks be locked here: root, or a gpuenv daemon to ask. Without a driver nothing
    can be locked and nothing was checked: no row (the driver's error says why)."""
    if ctx.backend is None:
        return
    if ctx.backend.capabilities.simulated:
        root = ctx.backend.capabilities.privileged
        who = "the simulated GPU allows writes" if root else "the simulated GPU refuses writes"
        yield Check(
            "permission",
            "ok" if root else "warning",
            who + (" (root)" if root else " (not root: as a real GPU, only root changes it)"),
            None
            if root
            else "lock through gpuenvd (root starts 'gpuenv --sim daemon'), or use a "
            "simulated machine of your own: GPUENV_SIM_STATE=PATH GPUENV_SIM_ROOT=1",
        )
        return
    if ctx.host.euid == 0:
        yield Check("permission", "ok", "running as root: clocks can be locked")
        return
    path = ctx.host.socket_path
    if _daemon(ctx)[0] == "ok":
        yield Check("permission", "ok", f"a gpuenv daemon answers on {path}: lock through it")
        return
    yield Check(
        "permission",
        "warning",
        "not root and no gpuenv daemon: clocks cannot be locked, so numbers can only be "
        "annotated, not stabilised",
        "run as root, or start 'sudo gpuenv daemon' once and use gpuenv as yourself",
    )


def check_daemon(ctx: Context) -> Iterable[Check]:
    """Who serves the daemon's socket, when there is one: gpuenvd, nobody, or a fake (an
    account that is not gpuenvd's listening there: a finding, and the other checks go on)."""
    severity, message, fix = _daemon(ctx)
    if severity != "none":
        yield Check("daemon", severity, message, fix)


def _daemon(ctx: Context) -> tuple[CheckSeverity | Literal["none"], str, str | None]:
    """("none" | "ok" | "warning" | "error", the sentence, the fix) for the daemon's socket:
    asked once per run (the permission and daemon checks both want it)."""
    if "daemon" not in ctx.seen:
        ctx.seen["daemon"] = _ask_daemon(ctx.host.socket_path)
    return ctx.seen["daemon"]


def _ask_daemon(path: str) -> tuple[CheckSeverity | Literal["none"], str, str | None]:
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return "none", "", None
    except OSError:
        return "none", "", None
    from gpuenv.daemon.client import DaemonNotTrusted, daemon_available

    try:
        if daemon_available(path):
            return "ok", f"gpuenvd answers on {path}", None
    except DaemonNotTrusted as err:
        return "error", err.message, err.hint
    return (
        "warning",
        f"{path} exists but no gpuenv daemon answers there",
        ("restart it: sudo gpuenv daemon (or systemctl restart gpuenvd)"),
    )


def _each_gpu(ctx: Context) -> Iterable[tuple[Backend, int]]:
    assert ctx.backend is not None
    for index in ctx.gpus:
        yield ctx.backend, index


def _optional(read: Callable[..., Any], *args: Any) -> Any:
    """read(*args), or None where the GPU does not offer the value (or not to this user)."""
    try:
        return read(*args)
    except (NotSupported, PermissionDenied):
        return None


def check_processes(ctx: Context) -> Iterable[Check]:
    """Other processes on the GPU share its time, memory bandwidth and power budget."""
    for b, i in _each_gpu(ctx):
        procs = _optional(b.processes, i)
        if procs is None:
            continue
        others = [p for p in procs if p.pid != ctx.host.pid]
        util = _optional(b.utilization, i)
        if others:
            names = ", ".join(_describe_pid(p.pid) for p in others[:5])
            more = f" and {len(others) - 5} more" if len(others) > 5 else ""
            yield Check(
                "processes",
                "warning",
                f"GPU {i} has {len(others)} other process{'es' if len(others) != 1 else ''}: "
                f"{names}{more}",
                "benchmark on an idle GPU: wait for them, or pick another GPU with -i",
                gpu=i,
            )
        elif util is not None and util[0] >= 5:
            yield Check(
                "processes",
                "warning",
                f"GPU {i} is {util[0]}% busy but shows no process (another container or VM?)",
                "find who uses it (nvidia-smi on the host) or pick another GPU",
                gpu=i,
            )
        else:
            yield Check("processes", "ok", f"GPU {i} has no other process", gpu=i)


def _describe_pid(pid: int) -> str:
    try:
        import psutil

        proc = psutil.Process(pid)
        return f"pid {pid} ({proc.username()}: {proc.name()})"
    except Exception:  # gone, other namespace, or no permission: the pid is what we know
        return f"pid {pid}"


def _warning(name: str, gpu: int, problem: str, fix: str) -> Check:
    return Check(name, "warning", problem, fix, gpu=gpu)


def _warning_or_ok(name: str, gpu: int, problem: str | None, fix: str, ok: str) -> Check:
    """One GPU's check: a warning saying `problem` and its `fix`, or, with no problem, `ok`."""
    return Check(name, "ok", ok, gpu=gpu) if problem is None else _warning(name, gpu, problem, fix)


def check_reasons(ctx: Context) -> Iterable[Check]:
    """A clock-event reason other than GpuIdle, already now, means clocks are held down."""
    for b, i in _each_gpu(ctx):
        reasons = b.read_fast(i).reasons & ~REASON_GPU_IDLE
        yield _warning_or_ok(
            "reasons",
            i,
            f"GPU {i} clocks are already held down by: {', '.join(reason_names(reasons))}"
            if reasons
            else None,
            "find the cause before measuring (other load, power limit, cooling, app clocks)",
            ok=f"GPU {i}: no clock-event reason besides idle",
        )


def check_power_limit(ctx: Context) -> Iterable[Check]:
    for b, i in _each_gpu(ctx):
        p = _optional(b.power_limits, i)
        if p is None:
            continue
        yield _warning_or_ok(
            "power_limit",
            i,
            f"GPU {i} power limit is {p.limit_w:g} W, below its default {p.default_w:g} W: "
            "the power cap will pull clocks down sooner"
            if p.limit_w < p.default_w - 0.5
            else None,
            f"sudo nvidia-smi -i {i} -pl {p.default_w:g} (or 'gpuenv restore' if gpuenv set it)",
            ok=f"GPU {i} power limit {p.limit_w:g} W",
        )


def check_persistence(ctx: Context) -> Iterable[Check]:
    for b, i in _each_gpu(ctx):
        mode = _optional(b.persistence_mode, i)
        if mode is None:
            yield Check("persistence", "info", f"GPU {i} has no persistence mode", gpu=i)
            continue
        yield _warning_or_ok(
            "persistence",
            i,
            None
            if mode
            else f"GPU {i} persistence mode is off: the driver re-initialises the "
            "GPU when its last client exits (slow first calls, settings revert)",
            f"sudo nvidia-smi -i {i} -pm 1 (or run nvidia-persistenced)",
            ok=f"GPU {i} persistence mode is on",
        )


def check_mig(ctx: Context) -> Iterable[Check]:
    for b, i in _each_gpu(ctx):
        if b.device_info(i).mig_mode:
            yield _warning(
                "mig",
                i,
                f"GPU {i} is in MIG mode: slices share its clocks and power, so work on another "
                "slice changes your numbers, and clocks lock only for the whole GPU",
                "benchmark on a GPU without MIG, or hold every slice",
            )


def check_app_clocks(ctx: Context) -> Iterable[Check]:
    for b, i in _each_gpu(ctx):
        app = _optional(b.app_clocks, i)
        limits = b.clock_limits(i)
        if app is None or limits.default_app_sm_mhz is None:
            continue
        changed = (app.sm_mhz, app.mem_mhz) != (
            limits.default_app_sm_mhz,
            limits.default_app_mem_mhz,
        )
        if changed and None not in (app.sm_mhz, app.mem_mhz):
            yield _warning(
                "app_clocks",
                i,
                f"GPU {i} application clocks are {app.mem_mhz}/{app.sm_mhz} MHz (mem/SM), not the "
                f"default {limits.default_app_mem_mhz}/{limits.default_app_sm_mhz}",
                f"sudo nvidia-smi -i {i} -rac (or 'gpuenv restore' if gpuenv set them)",
            )


def check_temperature(ctx: Context) -> Iterable[Check]:
    """A GPU already near its slowdown threshold will throttle under load."""
    for b, i in _each_gpu(ctx):
        temp = b.read_fast(i).temp_c
        t = _optional(b.thresholds, i)
        limit = (t.gpu_max_c or t.slowdown_c) if t is not None else None
        if limit is not None and temp >= limit - 15:
            yield _warning(
                "temperature",
                i,
                f"GPU {i} is at {temp:.0f} C, within 15 C of its {limit:.0f} C limit: "
                "it will slow down thermally under load",
                "let it cool, check its airflow, or look for other load",
            )


def check_journal(ctx: Context) -> Iterable[Check]:
    """Clocks gpuenv locked (its journal): by whom, and whether that owner still lives."""
    try:
        from gpuenv.clocks.journal import Journal
    except ImportError:
        return
    assert ctx.backend is not None
    by_uuid = {ctx.backend.device_info(i).uuid: i for i in ctx.gpus}
    journal = Journal()
    try:
        entries, damaged = journal.scan()
    except (OSError, GpuenvError) as err:
        yield Check("journal", "warning", f"gpuenv's journal cannot be read: {err}")
        return
    for bad in damaged:
        if bad.uuid in by_uuid:
            yield Check("journal", "warning", bad.message, bad.hint, gpu=by_uuid[bad.uuid])
    for entry in entries:
        index = by_uuid.get(entry.uuid)
        if index is None or entry.backend != ctx.backend.name:
            continue
        kept = journal.lookup(entry.uuid).kept
        if kept is not None:  # known still, from the copy kept apart: say so before it is lost
            yield Check(
                "journal",
                "warning",
                f"GPU {index}'s journal record: {kept}; the state before the lock is known "
                "only from the copy kept at lock time",
                "'gpuenv restore' (once the lock has ended) puts that state back",
                gpu=index,
            )
        live = entry.live_owners()
        if not live:
            gone = ", ".join(o.describe() for o in entry.owners) or "an owner gpuenv lost track of"
            yield Check(
                "journal",
                "warning",
                f"GPU {index} is still locked by gpuenv for {gone}, which has ended",
                "gpuenv restore",
                gpu=index,
            )
        else:
            yield Check(
                "journal",
                "info",
                f"GPU {index} clocks are locked by gpuenv for "
                + "; ".join(o.describe() for o in live),
                "'gpuenv restore' puts back what was there before",
                gpu=index,
            )


ACCESS_CHECKS: tuple[CheckFn, ...] = (check_driver, check_permission, check_daemon)
GPU_CHECKS: tuple[CheckFn, ...] = (
    check_processes,
    check_reasons,
    check_power_limit,
    check_persistence,
    check_mig,
    check_app_clocks,
    check_temperature,
    check_journal,
)


__all__ = ["ACCESS_CHECKS", "GPU_CHECKS"]
