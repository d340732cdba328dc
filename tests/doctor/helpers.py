"""Helpers for the tests of gpuenv/doctor/: a fake sysfs tree, findings by name."""

from __future__ import annotations

from pathlib import Path

from gpuenv.doctor import Check


def make_sysfs(root: Path, governors: list[str], *, no_turbo: str | None = "1") -> str:
    for n, gov in enumerate(governors):
        d = root / f"devices/system/cpu/cpu{n}/cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text(gov + "\n")
    if no_turbo is not None:
        d = root / "devices/system/cpu/intel_pstate"
        d.mkdir(parents=True, exist_ok=True)
        (d / "no_turbo").write_text(no_turbo + "\n")
    return str(root)


def by_name(checks: list[Check], name: str, gpu: int | None = None) -> list[Check]:
    return [c for c in checks if c.name == name and (gpu is None or c.gpu == gpu)]


def severities(checks: list[Check], name: str) -> set[str]:
    return {c.severity for c in by_name(checks, name)}
