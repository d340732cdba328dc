"""`gpuenv doctor`'s host checks: what on the CPU side makes timings vary.

The CPU frequency governor and boost (read from a sysfs root the tests point
elsewhere), the load, and environment variables that change what is timed.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable

from gpuenv.backend import env_readonly
from gpuenv.doctor.records import Check, CheckFn, Context
from gpuenv.errors import ConfigError


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
        readonly = env_readonly(env)
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


HOST_CHECKS: tuple[CheckFn, ...] = (
    check_cpu_governor,
    check_cpu_boost,
    check_cpu_load,
    check_environment,
)

__all__ = ["HOST_CHECKS"]
