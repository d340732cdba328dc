"""What every command shares: opening the backend, picking GPUs, printing errors."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from gpuenv.errors import GpuenvError

F = TypeVar("F", bound=Callable[..., Any])


def open_from_ctx(ctx: click.Context, *, readonly: bool | None = None):
    """Open the backend the global flags ask for (--sim, --dry-run, GPUENV_*)."""
    from gpuenv.backend import open_backend

    obj = ctx.find_root().obj or {}
    dry_run = bool(obj.get("dry_run"))
    return open_backend(obj.get("backend_kind"), readonly=readonly, dry_run=dry_run)


def is_dry_run(ctx: click.Context) -> bool:
    return bool((ctx.find_root().obj or {}).get("dry_run"))


def gpu_option(default: str = "all") -> Callable[[F], F]:
    """`-i/--gpu 0,1|all|UUID|PCI bus id`, as nvidia-smi's -i but with lists."""
    return click.option(
        "-i",
        "--gpu",
        "gpu",
        default=default,
        show_default=True,
        metavar="SEL",
        help="GPUs: NVML indices, UUIDs or PCI bus ids, comma-separated; 'all'; "
        "'cuda:N' for a CUDA index (honours CUDA_VISIBLE_DEVICES); 'local' for LOCAL_RANK.",
    )


def handle_errors(fn: F) -> F:
    """Turn GpuenvError into one line on stderr and its exit code, instead of a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except GpuenvError as err:
            click.echo(f"gpuenv: error: {err}", err=True)
            sys.exit(err.exit_code)

    return wrapper  # type: ignore[return-value]
