"""What the host says of a process another tenant runs on the GPU: its user, and whether it
is this process's own child. NVML's process list gives pids and memory only; these are read
where a window is made (once per set of reads, off the measured work), through psutil."""

from __future__ import annotations

MAX_DEPTH = 64  # ancestors walked: a deeper chain is not ours


def user_of(pid: int) -> str | None:
    """The account that runs `pid`; None where the host does not show it (another PID
    namespace, a process gone, or a model's pid that stands for no process here)."""
    import psutil

    try:
        return str(psutil.Process(pid).username())
    except (psutil.Error, KeyError, OSError):  # KeyError: a uid with no name (psutil)
        return None


def descends_from(pid: int, ancestor: int) -> bool:
    """`pid` is a child (or deeper) of `ancestor`: its work on the GPU is `ancestor`'s own."""
    import psutil

    if pid == ancestor:
        return True
    try:
        proc = psutil.Process(pid)
        for _ in range(MAX_DEPTH):
            parent = proc.ppid()
            if parent == ancestor:
                return True
            if parent <= 1:
                return False
            proc = psutil.Process(parent)
    except (psutil.Error, OSError):
        return False
    return False
