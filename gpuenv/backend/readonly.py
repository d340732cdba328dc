"""The read-only guard: a backend whose writes refuse before they reach the GPU
(`GPUENV_READONLY=1`, `--dry-run`; the shared lent device runs with it on)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from gpuenv.backend.base import WRITES, Backend
from gpuenv.errors import ConfigError, ReadOnlyError


class ReadOnlyBackend:
    """Wraps a backend so that every write raises `ReadOnlyError` before reaching the GPU.

    Reads pass straight through (attribute delegation), so telemetry costs the same.
    """

    readonly = True

    def __init__(self, inner: Backend, reason: str = "GPUENV_READONLY=1"):
        self._inner = inner
        self.reason = reason
        self.name = inner.name

    @property
    def inner(self) -> Backend:
        return self._inner

    def spec(self) -> dict[str, Any] | None:
        """The inner backend's spec, reopened read-only for the same reason."""
        spec = self._inner.spec()
        return None if spec is None else {**spec, "readonly": self.reason}

    def __getattr__(self, attr: str):  # reads: delegate
        if attr in WRITES:

            def refuse(index: int, *args: object, **kwargs: object) -> None:
                raise ReadOnlyError(_describe_write(attr, args), gpu=index, reason=self.reason)

            return refuse
        return getattr(self._inner, attr)


def _describe_write(op: str, args: tuple[object, ...]) -> str:
    words = {
        "set_locked_sm_clocks": "lock SM clocks to {}-{} MHz",
        "reset_locked_sm_clocks": "reset locked SM clocks",
        "set_locked_mem_clocks": "lock memory clocks to {}-{} MHz",
        "reset_locked_mem_clocks": "reset locked memory clocks",
        "set_app_clocks": "set application clocks to mem {} / SM {} MHz",
        "reset_app_clocks": "reset application clocks",
        "set_power_limit": "set the power limit to {} W",
    }[op]
    try:
        return words.format(*args)
    except IndexError:
        return words


def env_readonly(env: Mapping[str, str] | None = None) -> bool:
    """True when GPUENV_READONLY asks for read-only mode ('1', 'true', 'yes', 'on').

    `env`: the environment to read (default: this process's)."""
    value = (os.environ if env is None else env).get("GPUENV_READONLY", "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"GPUENV_READONLY={value!r} is not understood", hint="use 1 or 0")
