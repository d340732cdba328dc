"""gpuenv's exceptions: a small tree with structured fields.

    GpuenvError                      every error gpuenv raises on purpose
     +-- ConfigError                 bad input: option, environment variable, config file
     |    |                          (also a ValueError, as Python's bad arguments are)
     |    +-- DeviceNotFound         a GPU selector that matches no GPU
     |    +-- FileError              a file or directory gpuenv could not read or write
     |    +-- UnsafePath             a place another account could have chosen or change
     |    +-- BadRecord              a file's content is not what gpuenv writes (path, line,
     |    |                          field)
     |    +-- JournalDamaged         a GPU's journal record cannot be trusted
     |    `-- CommandNotFound        gpuenv run: the command is missing or not executable
     +-- BackendError                the GPU or its driver said no
     |    +-- NvmlUnavailable        no driver, no libnvidia-ml, or NVML failed to start
     |    +-- NotSupported           this GPU or driver cannot do that
     |    +-- PermissionDenied       the operation needs root (or the daemon)
     |    +-- GpuLost                the GPU fell off the bus / needs a reset
     |    +-- DriverTimeout          the driver did not answer in time
     |    `-- InvalidValue           the driver rejected a value (clock, power limit)
     +-- ReadOnlyError               a write refused by GPUENV_READONLY=1 / --dry-run
     +-- LockConflict                another owner holds a different lock on the GPU
     +-- JournalNotUpdated           the GPUs were put back, the journal could not say so
     +-- MeasurementRejected         the reject policy left too few trustworthy reps
     +-- DaemonUnavailable           no gpuenvd answers on the socket
     +-- DaemonNotTrusted            the socket is served by another account than gpuenvd's
     `-- ProtocolError               a request gpuenvd cannot understand

Every subclass of GpuenvError is defined in this module (tests/test_errors.py checks it).

`str()` of each reads as one sentence that says what happened, on which GPU,
and what to do; the CLI prints exactly that and exits with `exit_code`.

Exit codes of every command: `EXIT_CODES` below (nvidia-smi's numbers where one fits).
"""

from __future__ import annotations

import errno as errno_mod
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

# code -> meaning: docs/reference/exit-codes.md's table is this one. 126/127 and 128+N belong
# to `gpuenv run`.
EXIT_CODES: dict[int, str] = {
    0: "success (also: nothing to do, a dry run, a lock or restore done whose report could "
    "not be written to standard output: stderr says so)",
    1: "a judgement the command was asked for failed: doctor found warnings, a region was "
    "rejected (run --policy reject), a slowdown above compare --fail-above, a GPU did not "
    "settle (calibrate)",
    2: "bad input (an option, a variable, a file that is not what it should be), a file or "
    "directory that cannot be read or written, or an error the driver reported",
    3: "not supported by this GPU or driver (as nvidia-smi)",
    4: "no permission (as nvidia-smi): run as root or through 'gpuenv daemon', or fix the "
    "file's permissions",
    5: "the clocks are locked by another owner",
    6: "no GPU matches the selector (-i/--id/--gpu), as nvidia-smi's 'not found'",
    9: "the NVIDIA driver is not loaded, or NVML cannot talk to it (as nvidia-smi)",
    12: "the NVML library (libnvidia-ml.so.1 or the nvidia-ml-py module) was not found "
    "(as nvidia-smi)",
    15: "the GPU fell off the bus or stopped answering (as nvidia-smi)",
    126: "gpuenv run: the command is not executable",
    127: "gpuenv run: the command was not found",
    130: "interrupted (Ctrl-C)",
    141: "standard output was closed early (a pipe into head)",
}


class GpuenvError(Exception):
    """Base class. `hint` says what to do (`default_hint` where none is given); the CLI
    prints `str(err)` on one line.

    Args:
        message: what happened.
        gpu: the GPU it happened on (index or UUID), named in the message.
        hint: what to do about it.
    """

    exit_code = 2
    default_hint: str | None = None

    def __init__(self, message: str, *, gpu: int | str | None = None, hint: str | None = None):
        self.message = message
        self.gpu = gpu
        self.hint = hint or self.default_hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = f" on GPU {self.gpu}" if self.gpu is not None else ""
        text = f"{self.message}{where}"
        if self.hint:
            text += f": {self.hint}"
        return text


class ConfigError(GpuenvError, ValueError):
    """Bad input from the user: a flag, an environment variable, a file.

    Also a `ValueError`: code written for the tools gpuenv stands in for (the do_bench
    drop-in raises where triton.testing.do_bench raises ValueError) catches it as one."""


class DeviceNotFound(ConfigError):
    """A selector (index, UUID, PCI bus id) that matches no GPU."""

    exit_code = 6  # nvidia-smi's "the requested GPU was not found"

    def __init__(self, selector: str, count: int, *, hint: str | None = None):
        self.selector = selector
        self.count = count
        if hint is None:
            if count == 0:
                hint = "no GPU is visible"
            else:
                hint = (
                    f"this machine has {count} GPU{'s' if count != 1 else ''} "
                    f"(indices 0-{count - 1}); see 'gpuenv status' for UUIDs and PCI bus ids"
                )
        super().__init__(f"no GPU matches {selector!r}", hint=hint)


class BackendError(GpuenvError):
    """The GPU or the driver refused or failed an operation.

    `op` names the NVML call or gpuenv operation; `code` is NVML's return code
    when there is one.
    """

    def __init__(
        self,
        message: str,
        *,
        op: str | None = None,
        gpu: int | str | None = None,
        code: int | None = None,
        hint: str | None = None,
    ):
        self.op = op
        self.code = code
        super().__init__(message, gpu=gpu, hint=hint)


class NvmlUnavailable(BackendError):
    """NVML could not be loaded or initialised (no driver, no GPU, container without it)."""

    exit_code = 9
    default_hint = (
        "install the NVIDIA driver (nvidia-smi must work), or try gpuenv on the simulated "
        "GPU with --sim or GPUENV_BACKEND=sim"
    )

    def __init__(
        self,
        message: str = "NVML is not available",
        *,
        hint: str | None = None,
        code: int | None = None,
    ):
        super().__init__(message, code=code, hint=hint)
        if code == 12:  # NVML_ERROR_LIBRARY_NOT_FOUND: nvidia-smi's 12, not 9 (no driver)
            self.exit_code = 12


class NotSupported(BackendError):
    """The GPU or driver does not support the operation."""

    exit_code = 3


class PermissionDenied(BackendError):
    """The operation needs privileges this process does not have."""

    exit_code = 4
    default_hint = "run as root, or start 'gpuenv daemon' as root and retry"


class GpuLost(BackendError):
    """The GPU stopped answering (fell off the bus, Xid 79, needs a reset)."""

    exit_code = 15


class DriverTimeout(BackendError):
    """The driver did not answer in time."""


class InvalidValue(BackendError):
    """The driver rejected an argument (a clock it does not support, a power limit out of range)."""


class ReadOnlyError(GpuenvError):
    """A write refused before it reached the GPU, because read-only mode is on."""

    def __init__(self, op: str, *, gpu: int | str | None = None, reason: str = "GPUENV_READONLY=1"):
        self.op = op
        self.reason = reason
        super().__init__(
            f"refused to {op} ({reason})",
            gpu=gpu,
            hint="nothing was changed; unset GPUENV_READONLY / drop --dry-run to allow writes",
        )


class LockConflict(GpuenvError):
    """Another owner holds a different lock. `owner` describes it (pid, user, command, since)."""

    exit_code = 5

    default_hint = "wait for it to finish, ask for the same state to share it, or use --force"

    def __init__(self, gpu: int | str, owner: str, *, hint: str | None = None):
        self.owner = owner
        super().__init__(f"clocks are locked by {owner}", gpu=gpu, hint=hint)


# errno -> (what happened to the path, what to do)
_OS_ERRORS: dict[int, tuple[str, str]] = {
    errno_mod.ENOSPC: ("the disk holding {path} is full", "free some space, or use another place"),
    errno_mod.EDQUOT: (
        "the disk quota for {path} is used up",
        "free some space, or use another place",
    ),
    errno_mod.EROFS: ("{path} is on a read-only file system", "use a writable place"),
    errno_mod.EACCES: (
        "permission denied on {path}",
        "check its owner and mode (ls -ld), or use another place",
    ),
    errno_mod.EPERM: (
        "operation not permitted on {path}",
        "check its owner and mode (ls -ld), or use another place",
    ),
    errno_mod.EFBIG: (
        "{path} would grow past the file size limit",
        "raise the limit ('ulimit -f unlimited') or free space",
    ),
    errno_mod.ENOENT: (
        "{path} does not exist",
        "check the path; gpuenv creates no missing directories",
    ),
    errno_mod.ENOTDIR: ("a part of {path} is not a directory", "check the path"),
    errno_mod.EISDIR: ("{path} is a directory", "pass a file"),
    errno_mod.EIO: ("an I/O error on {path}", "check the disk (dmesg)"),
    errno_mod.ENAMETOOLONG: ("the name {path} is too long", "use a shorter path"),
    errno_mod.ELOOP: ("{path} has a loop of symbolic links", "check the path"),
}


class FileError(ConfigError):
    """A file or directory gpuenv could not read or write. `path`, `errno` as the OSError's.

    `where` names what the path is for ("the journal", "results"), and `setting` the
    variable or option that moves it, so the hint can say what to change.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        err_no: int | None,
        *,
        detail: str = "",
        where: str | None = None,
        setting: str | None = None,
    ):
        self.path = None if path is None else os.fspath(path)
        self.errno = err_no
        shown = self.path if self.path is not None else "a file"
        what, todo = _OS_ERRORS.get(
            err_no or 0,
            (f"cannot use {{path}} ({detail or os.strerror(err_no or 0)})", "check the path"),
        )
        message = what.format(path=shown)
        if where:
            message = f"{where}: {message}"
        if setting:
            todo += f" ({setting} says where)"
        super().__init__(message, hint=todo)
        if err_no in (errno_mod.EACCES, errno_mod.EPERM):
            self.exit_code = 4

    @classmethod
    def from_os_error(
        cls, err: OSError, *, path: str | os.PathLike[str] | None = None, **kwargs: str | None
    ) -> FileError:
        """The sentence for `err`; `path` stands in where the OSError names none (os.write)."""
        where = err.filename if err.filename is not None else path
        if isinstance(where, bytes):
            where = where.decode(errors="replace")
        return cls(where, err.errno, detail=err.strerror or str(err), **kwargs)


# -- the rest of the tree: errors of one part of gpuenv, defined here with the others and
# importable from the module that raises them too (gpuenv.reader.BadRecord, ...)


class UnsafePath(ConfigError):
    """A place another account could have chosen or could change: refused, never used."""


class BadRecord(ConfigError):
    """A file's content is not what gpuenv writes: `path`, `line` (1-based, None for a
    whole-file document) and `field` (a dotted path, e.g. windows[3].sm_mhz_mean)."""

    def __init__(
        self,
        what: str,
        path: str | os.PathLike[str],
        problem: str,
        *,
        line: int | None = None,
        field: str | None = None,
        hint: str | None = None,
    ):
        self.path = os.fspath(path)
        self.line = line
        self.field = field
        where = f"{what} {self.path}"
        if line is not None:
            where += f", line {line}"
        if field:
            where += f", field {field}"
        super().__init__(
            f"{where}: {problem}",
            hint=hint or "pass a file gpuenv wrote, or remove the damaged record",
        )


class JournalDamaged(ConfigError):
    """A GPU's record (both copies) cannot be trusted: cut short, edited, or not JSON."""

    def __init__(self, uuid: str, path: Path, why: str):
        self.uuid = uuid
        self.path = path
        self.why = why
        super().__init__(
            f"the journal record {path} is damaged ({why})",
            hint="the state before the lock is lost for this GPU: 'gpuenv restore --defaults "
            f"-i {uuid}' resets it to the driver's defaults (check 'gpuenv status' first)",
        )


class CommandNotFound(ConfigError):
    """The command to run does not exist or cannot be executed (exit 127 / 126, as shells)."""

    def __init__(self, command: str, *, exit_code: int = 127, why: str = "command not found"):
        self.exit_code = exit_code
        super().__init__(f"{why}: {command}", hint="check the command and your PATH")


class JournalNotUpdated(GpuenvError):
    """The GPUs were put back, but the journal could not record it (read-only, full)."""

    def __init__(self, done: list[str], errors: list[GpuenvError]):
        self.done = done
        self.errors = errors
        first = errors[0]
        super().__init__(
            f"the GPUs were restored, but the journal could not be updated ({first.message})",
            hint="its record still says locked, so 'gpuenv status' shows a lock that no "
            "longer holds; once the state directory (GPUENV_STATE_DIR) is writable, "
            "'gpuenv restore --all' clears it (restoring again puts back the same values)",
        )


class MeasurementRejected(GpuenvError):
    """The reject (or retry) policy left too few trustworthy repetitions."""

    exit_code = 1  # the CLI's "rejected verdict" code


class DaemonUnavailable(GpuenvError):
    """No gpuenvd answers on the socket."""


class DaemonNotTrusted(GpuenvError):
    """The process serving the socket is not gpuenvd's account: a fake, never believed."""

    exit_code = 4


class ProtocolError(GpuenvError):
    """A request the daemon cannot understand: not JSON, wrong fields, too long."""
