"""What in this environment will make benchmark numbers lie, and what to do about each.

`diagnose()` runs every check and returns `Check` records (ok / info / warning /
error, a sentence, and the fix); `gpuenv doctor` prints them. Each check is a
small function of a `Context` (the backend, the GPUs, and the host facts it
reads: effective uid, environment, sysfs root, daemon socket), so tests give it
a simulated GPU and a fake sysfs tree instead of patching anything.

Exit codes of `gpuenv doctor`: 0 nothing worse than info, 1 warnings, 2 errors.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuenv.backend import REASON_GPU_IDLE, Backend, reason_names
from gpuenv.errors import ConfigError, GpuenvError, NotSupported, PermissionDenied

SEVERITIES = ("ok", "info", "warning", "error")
DEFAULT_SOCKET = "/run/gpuenv/gpuenv.sock"


@dataclass(frozen=True)
class Check:
    """One finding of `gpuenv doctor`."""

    name: str  # short id: "persistence", "cpu_governor", ...
    severity: str  # "ok" | "info" | "warning" | "error"
    message: str  # what is the case, in a sentence
    fix: str | None = None  # what to do about it
    gpu: int | None = None  # NVML index, where the finding is about one GPU

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "severity": self.severity,
            "message": self.message,
            "fix": self.fix,
            "gpu": self.gpu,
        }


@dataclass
class Host:
    """The host facts the checks read; defaults are this process and machine."""

    euid: int = field(default_factory=os.geteuid)
    pid: int = field(default_factory=os.getpid)
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    sysfs: str = "/sys"
    socket: str | None = None  # gpuenv daemon socket; None: GPUENV_SOCKET or DEFAULT_SOCKET
    cpu_count: int = field(default_factory=lambda: os.cpu_count() or 1)
    loadavg: tuple[float, float, float] | None = field(default_factory=lambda: _loadavg())

    @property
    def socket_path(self) -> str:
        return self.socket or self.env.get("GPUENV_SOCKET", "").strip() or DEFAULT_SOCKET


def _loadavg() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


@dataclass
class Context:
    backend: Backend | None  # None: NVML could not be opened (open_error says why)
    gpus: Sequence[int]
    host: Host
    open_error: GpuenvError | None = None


CheckFn = Callable[[Context], Iterable[Check]]


def exit_code(checks: Iterable[Check]) -> int:
    """0 when nothing is worse than info, 1 with warnings, 2 with errors."""
    worst = max((SEVERITIES.index(c.severity) for c in checks), default=0)
    return {3: 2, 2: 1}.get(worst, 0)


def diagnose(
    backend: Backend | None,
    gpus: Sequence[int] | None = None,
    *,
    open_error: GpuenvError | None = None,
    host: Host | None = None,
) -> list[Check]:
    """Run every check. `backend` None means it could not be opened (`open_error`):
    the GPU checks are then skipped and the host checks still run."""
    if gpus is None:
        gpus = list(range(backend.device_count())) if backend is not None else []
    ctx = Context(backend=backend, gpus=list(gpus), host=host or Host(), open_error=open_error)
    checks: list[Check] = []
    for fn in CHECKS:
        if ctx.backend is None and fn in GPU_CHECKS:
            continue
        try:
            checks.extend(fn(ctx))
        except GpuenvError as err:  # one failing read must not hide the other findings
            checks.append(
                Check(fn.__name__.removeprefix("check_"), "error", f"could not check: {err}")
            )
    return checks


# -- GPU and driver -----------------------------------------------------------------------


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
    if b.name == "sim":
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
    """Can clocks be locked here: root, or a gpuenv daemon to ask."""
    if ctx.backend is not None and ctx.backend.name == "sim":
        root = bool(getattr(ctx.backend, "root", True))
        who = "the simulated GPU allows writes" if root else "the simulated GPU refuses writes"
        yield Check(
            "permission",
            "ok" if root else "warning",
            who + (" (root)" if root else " (GPUENV_SIM_ROOT=0)"),
            None if root else "set GPUENV_SIM_ROOT=1 to play root",
        )
        return
    if ctx.host.euid == 0:
        yield Check("permission", "ok", "running as root: clocks can be locked")
        return
    path = ctx.host.socket_path
    if _is_socket(path):
        if _daemon_answers(path):
            yield Check("permission", "ok", f"a gpuenv daemon answers on {path}: lock through it")
        else:
            yield Check(
                "permission",
                "warning",
                f"{path} exists but no gpuenv daemon answers there",
                "restart it: sudo gpuenv daemon",
            )
        return
    yield Check(
        "permission",
        "warning",
        "not root and no gpuenv daemon: clocks cannot be locked, so numbers can only be "
        "annotated, not stabilised",
        "run as root, or start 'sudo gpuenv daemon' once and use gpuenv as yourself",
    )


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def _daemon_answers(path: str) -> bool:
    try:
        from gpuenv.daemon.client import daemon_available
    except ImportError:
        return True  # a socket is there; without the client we cannot ask more
    return bool(daemon_available(path))


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


def check_reasons(ctx: Context) -> Iterable[Check]:
    """A clock-event reason other than GpuIdle, already now, means clocks are held down."""
    for b, i in _each_gpu(ctx):
        reasons = b.read_fast(i).reasons & ~REASON_GPU_IDLE
        if reasons:
            yield Check(
                "reasons",
                "warning",
                f"GPU {i} clocks are already held down by: {', '.join(reason_names(reasons))}",
                "find the cause before measuring (other load, power limit, cooling, app clocks)",
                gpu=i,
            )
        else:
            yield Check("reasons", "ok", f"GPU {i}: no clock-event reason besides idle", gpu=i)


def check_power_limit(ctx: Context) -> Iterable[Check]:
    for b, i in _each_gpu(ctx):
        p = _optional(b.power_limits, i)
        if p is None:
            continue
        if p.limit_w < p.default_w - 0.5:
            yield Check(
                "power_limit",
                "warning",
                f"GPU {i} power limit is {p.limit_w:g} W, below its default {p.default_w:g} W: "
                "the power cap will pull clocks down sooner",
                f"sudo nvidia-smi -i {i} -pl {p.default_w:g} "
                "(or 'gpuenv restore' if gpuenv set it)",
                gpu=i,
            )
        else:
            yield Check("power_limit", "ok", f"GPU {i} power limit {p.limit_w:g} W", gpu=i)


def check_persistence(ctx: Context) -> Iterable[Check]:
    for b, i in _each_gpu(ctx):
        mode = _optional(b.persistence_mode, i)
        if mode is None:
            yield Check("persistence", "info", f"GPU {i} has no persistence mode", gpu=i)
        elif not mode:
            yield Check(
                "persistence",
                "warning",
                f"GPU {i} persistence mode is off: the driver re-initialises the GPU when its "
                "last client exits (slow first calls, settings revert)",
                f"sudo nvidia-smi -i {i} -pm 1 (or run nvidia-persistenced)",
                gpu=i,
            )
        else:
            yield Check("persistence", "ok", f"GPU {i} persistence mode is on", gpu=i)


def check_mig(ctx: Context) -> Iterable[Check]:
    for b, i in _each_gpu(ctx):
        if b.device_info(i).mig_mode:
            yield Check(
                "mig",
                "warning",
                f"GPU {i} is in MIG mode: slices share its clocks and power, so work on another "
                "slice changes your numbers, and clocks lock only for the whole GPU",
                "benchmark on a GPU without MIG, or hold every slice",
                gpu=i,
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
            yield Check(
                "app_clocks",
                "warning",
                f"GPU {i} application clocks are {app.mem_mhz}/{app.sm_mhz} MHz (mem/SM), not the "
                f"default {limits.default_app_mem_mhz}/{limits.default_app_sm_mhz}",
                f"sudo nvidia-smi -i {i} -rac (or 'gpuenv restore' if gpuenv set them)",
                gpu=i,
            )


def check_temperature(ctx: Context) -> Iterable[Check]:
    """A GPU already near its slowdown threshold will throttle under load."""
    for b, i in _each_gpu(ctx):
        temp = b.read_fast(i).temp_c
        t = _optional(b.thresholds, i)
        limit = (t.gpu_max_c or t.slowdown_c) if t is not None else None
        if limit is not None and temp >= limit - 15:
            yield Check(
                "temperature",
                "warning",
                f"GPU {i} is at {temp:.0f} C, within 15 C of its {limit:.0f} C limit: "
                "it will slow down thermally under load",
                "let it cool, check its airflow, or look for other load",
                gpu=i,
            )


def check_journal(ctx: Context) -> Iterable[Check]:
    """Clocks gpuenv locked (its journal): by whom, and whether that owner still lives."""
    try:
        from gpuenv.clocks.journal import Journal
    except ImportError:
        return
    assert ctx.backend is not None
    by_uuid = {ctx.backend.device_info(i).uuid: i for i in ctx.gpus}
    try:
        entries = Journal().entries()
    except (OSError, GpuenvError) as err:
        yield Check("journal", "warning", f"gpuenv's journal cannot be read: {err}")
        return
    for entry in entries:
        index = by_uuid.get(entry.uuid)
        if index is None or entry.backend != ctx.backend.name:
            continue
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


# -- host -------------------------------------------------------------------------------


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def check_cpu_governor(ctx: Context) -> Iterable[Check]:
    """Launch-bound code times the CPU too: a frequency governor other than `performance`
    makes host-side time depend on recent load."""
    pattern = os.path.join(ctx.host.sysfs, "devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor")
    governors: dict[str, int] = {}
    for path in glob.glob(pattern):
        value = _read(path)
        if value:
            governors[value] = governors.get(value, 0) + 1
    if not governors:
        yield Check(
            "cpu_governor",
            "info",
            "no CPU frequency governor is exposed (a VM or container?): it cannot be checked",
        )
        return
    others = {g: n for g, n in governors.items() if g != "performance"}
    if others:
        listed = ", ".join(
            f"{n} CPU{'s' if n != 1 else ''} '{g}'" for g, n in sorted(others.items())
        )
        yield Check(
            "cpu_governor",
            "warning",
            f"CPU frequency governor is not 'performance' ({listed}): host-side time varies",
            "sudo cpupower frequency-set -g performance",
        )
    else:
        yield Check("cpu_governor", "ok", "CPU frequency governor is 'performance'")


def check_cpu_boost(ctx: Context) -> Iterable[Check]:
    no_turbo = _read(os.path.join(ctx.host.sysfs, "devices/system/cpu/intel_pstate/no_turbo"))
    boost = _read(os.path.join(ctx.host.sysfs, "devices/system/cpu/cpufreq/boost"))
    if no_turbo == "0" or boost == "1":
        yield Check(
            "cpu_boost",
            "info",
            "CPU turbo/boost is on: launch-bound timings vary with CPU temperature",
            "for host-bound benchmarks: echo 1 | sudo tee /sys/devices/system/cpu/intel_pstate/"
            "no_turbo (Intel) or echo 0 | sudo tee /sys/devices/system/cpu/cpufreq/boost",
        )


def check_cpu_load(ctx: Context) -> Iterable[Check]:
    load = ctx.host.loadavg
    if load is None:
        return
    if load[0] > 0.75 * ctx.host.cpu_count:
        yield Check(
            "cpu_load",
            "warning",
            f"the host is busy (load {load[0]:.1f} on {ctx.host.cpu_count} CPUs): kernel launches "
            "and host-side time will be slower and noisier",
            "benchmark on a quiet machine",
        )


def check_environment(ctx: Context) -> Iterable[Check]:
    env = ctx.host.env
    if env.get("CUDA_LAUNCH_BLOCKING", "0").strip() not in ("", "0"):
        yield Check(
            "env",
            "warning",
            "CUDA_LAUNCH_BLOCKING is set: every kernel launch waits for the GPU, so timings "
            "include launch and sync overhead",
            "unset CUDA_LAUNCH_BLOCKING",
        )
    if env.get("PYTORCH_NO_CUDA_MEMORY_CACHING", "0").strip() not in ("", "0"):
        yield Check(
            "env",
            "warning",
            "PYTORCH_NO_CUDA_MEMORY_CACHING is set: every allocation calls cudaMalloc",
            "unset PYTORCH_NO_CUDA_MEMORY_CACHING",
        )
    try:
        readonly = _readonly_from(env)
    except ConfigError as err:
        yield Check("env", "error", str(err), "use GPUENV_READONLY=1 or 0")
        return
    if readonly:
        yield Check(
            "readonly",
            "info",
            "GPUENV_READONLY is on: gpuenv will refuse every write (lock, restore, power limit)",
            "unset GPUENV_READONLY to allow them",
        )


def _readonly_from(env: Mapping[str, str]) -> bool:
    """gpuenv.backend.env_readonly, for a given environment."""
    value = env.get("GPUENV_READONLY", "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"GPUENV_READONLY={value!r} is not understood")


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
CHECKS: tuple[CheckFn, ...] = (
    check_driver,
    check_permission,
    *GPU_CHECKS,
    check_cpu_governor,
    check_cpu_boost,
    check_cpu_load,
    check_environment,
)


def format_checks(checks: Sequence[Check]) -> str:
    """The human report: a summary line, then one line per finding (fix underneath)."""
    counts = {s: sum(1 for c in checks if c.severity == s) for s in SEVERITIES}
    summary = (
        "no problems found"
        if counts["warning"] == counts["error"] == 0
        else f"{counts['error']} error{'s' if counts['error'] != 1 else ''}, "
        f"{counts['warning']} warning{'s' if counts['warning'] != 1 else ''}"
    )
    width = max((len(c.name) for c in checks), default=0)
    lines = [f"gpuenv doctor: {summary}"]
    for c in checks:
        label = c.severity.upper() if c.severity in ("warning", "error") else c.severity
        lines.append(f"  {label:<7}  {c.name:<{width}}  {c.message}")
        if c.fix and c.severity != "ok":
            lines.append(f"  {'':<7}  {'':<{width}}  fix: {c.fix}")
    return "\n".join(lines)
