"""gpuenv's exceptions: a small tree with structured fields.

    GpuenvError                      every error gpuenv raises on purpose
     +-- ConfigError                 bad input: option, environment variable, config file
     |    |                          (also a ValueError, as Python's bad arguments are)
     |    `-- DeviceNotFound         a GPU selector that matches no GPU
     +-- BackendError                the GPU or its driver said no
     |    +-- NvmlUnavailable        no driver, no libnvidia-ml, or NVML failed to start
     |    +-- NotSupported           this GPU or driver cannot do that
     |    +-- PermissionDenied       the operation needs root (or the daemon)
     |    +-- GpuLost                the GPU fell off the bus / needs a reset
     |    +-- DriverTimeout          the driver did not answer in time
     |    `-- InvalidValue           the driver rejected a value (clock, power limit)
     +-- ReadOnlyError               a write refused by GPUENV_READONLY=1 / --dry-run
     `-- LockConflict                another owner holds a different lock on the GPU

`str()` of each reads as one sentence that says what happened, on which GPU,
and what to do; the CLI prints exactly that and exits with `exit_code`.
"""

from __future__ import annotations


class GpuenvError(Exception):
    """Base class. `hint` says what to do; the CLI prints `str(err)` on one line."""

    exit_code = 2

    def __init__(self, message: str, *, gpu: int | str | None = None, hint: str | None = None):
        self.message = message
        self.gpu = gpu
        self.hint = hint
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

    def __init__(
        self,
        message: str = "NVML is not available",
        *,
        hint: str | None = None,
        code: int | None = None,
    ):
        super().__init__(
            message,
            code=code,
            hint=hint
            or "install the NVIDIA driver (nvidia-smi must work), or try gpuenv on the "
            "simulated GPU with --sim or GPUENV_BACKEND=sim",
        )


class NotSupported(BackendError):
    """The GPU or driver does not support the operation."""


class PermissionDenied(BackendError):
    """The operation needs privileges this process does not have."""

    def __init__(
        self,
        message: str,
        *,
        op: str | None = None,
        gpu: int | str | None = None,
        hint: str | None = None,
        code: int | None = None,
    ):
        super().__init__(
            message,
            op=op,
            gpu=gpu,
            code=code,
            hint=hint or "run as root, or start 'gpuenv daemon' as root and retry",
        )


class GpuLost(BackendError):
    """The GPU stopped answering (fell off the bus, Xid 79, needs a reset)."""


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

    exit_code = 3

    def __init__(self, gpu: int | str, owner: str, *, hint: str | None = None):
        self.owner = owner
        super().__init__(
            f"clocks are locked by {owner}",
            gpu=gpu,
            hint=hint
            or "wait for it to finish, ask for the same state to share it, or use --force",
        )
