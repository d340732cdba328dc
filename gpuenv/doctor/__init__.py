"""What in this environment will make benchmark numbers lie, and what to do about each.

`diagnose()` runs every check and returns `Check` records (ok / info / warning /
error, a sentence, and the fix); `gpuenv doctor` prints them. The checks live by
concept: `doctor/gpu.py` (driver, permission, each GPU's state) and
`doctor/host.py` (CPU governor, boost, load, environment). Each check is a
small function of a `Context` (the backend, the GPUs, and the host facts it
reads: effective uid, environment, sysfs root, daemon socket), so tests give it
a simulated GPU and a fake sysfs tree instead of patching anything.

Exit codes of `gpuenv doctor`: 0 nothing worse than info, 1 warnings, 2 errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuenv.backend import Backend
from gpuenv.doctor.gpu import ACCESS_CHECKS, GPU_CHECKS
from gpuenv.doctor.host import HOST_CHECKS
from gpuenv.doctor.records import DEFAULT_SOCKET, SEVERITIES, Check, CheckFn, Context, Host
from gpuenv.errors import GpuenvError
from gpuenv.table import render

CHECKS: tuple[CheckFn, ...] = (*ACCESS_CHECKS, *GPU_CHECKS, *HOST_CHECKS)


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


def format_checks(checks: Sequence[Check]) -> str:
    """The human report: a summary line, then one line per finding (fix underneath)."""
    counts = {s: sum(1 for c in checks if c.severity == s) for s in SEVERITIES}
    summary = (
        "no problems found"
        if counts["warning"] == counts["error"] == 0
        else f"{counts['error']} error{'s' if counts['error'] != 1 else ''}, "
        f"{counts['warning']} warning{'s' if counts['warning'] != 1 else ''}"
    )
    rows: list[tuple[str, str, str]] = []
    for c in checks:
        label = c.severity.upper() if c.severity in ("warning", "error") else c.severity
        # the severity column as wide as WARNING always, so reports line up with each other
        rows.append((label.ljust(7), c.name, c.message))
        if c.fix and c.severity != "ok":
            rows.append(("", "", f"fix: {c.fix}"))
    return "\n".join([f"gpuenv doctor: {summary}", *render(rows, indent="  ")])


__all__ = [
    "CHECKS",
    "DEFAULT_SOCKET",
    "SEVERITIES",
    "Check",
    "Context",
    "Host",
    "diagnose",
    "exit_code",
    "format_checks",
]
