"""`gpuenv daemon`: run gpuenvd, list its leases, check its config.

Exit codes: 0 success (serve: stopped by SIGTERM/SIGINT); 2 an error (bad
config, socket in use, no GPU, daemon not reachable).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import click

from gpuenv import validate
from gpuenv.cli._common import handle_errors, interval_option, open_from_ctx

_LEVELS = ("debug", "info", "warning", "error")
F = TypeVar("F", bound=Callable[..., Any])


class _JournaldFormatter(logging.Formatter):
    """Under systemd (JOURNAL_STREAM set) prefix <priority> so journald keeps the level,
    and leave the timestamp to the journal."""

    _PRIO: ClassVar[dict[int, int]] = {
        logging.DEBUG: 7,
        logging.INFO: 6,
        logging.WARNING: 4,
        logging.ERROR: 3,
    }

    def format(self, record: logging.LogRecord) -> str:
        prio = self._PRIO.get(record.levelno, 2 if record.levelno > logging.ERROR else 6)
        return f"<{prio}>{super().format(record)}"


class _Formatter(logging.Formatter):
    """The timestamp's seconds formatted once a second (gpuenvd logs ~2 lines a lease)."""

    _second, _stamp = -1, ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:  # (called under the handler's lock)
            stamp = time.strftime(self.default_time_format, self.converter(record.created))
            self._second, self._stamp = second, stamp
        return f"{self._stamp},{int(record.msecs):03d}"  # (the default_msec_format, "%s,%03d")


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("JOURNAL_STREAM"):
        handler.setFormatter(_JournaldFormatter("%(message)s"))
    else:
        handler.setFormatter(_Formatter("%(asctime)s gpuenvd %(levelname)s %(message)s"))
    # A line per grant and per release: none of its formats prints the caller, the thread or
    # the process, so the record does not look them up (the logging HOWTO's "Optimization";
    # the walk up the stack to the caller was about a tenth of what a log line cost gpuenvd)
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger("gpuenv")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def _socket_option(fn: F) -> F:
    return click.option(
        "--socket",
        "socket_path",
        metavar="PATH",
        default=None,
        help="The daemon's Unix socket (default: GPUENV_SOCKET, else /run/gpuenv/gpuenv.sock; "
        "the daemon itself also reads [daemon] socket from its config).",
    )(fn)


def _config_option(fn: F) -> F:
    return click.option(
        "--config",
        "config_path",
        metavar="FILE",
        type=click.Path(dir_okay=False),
        default=None,
        help="INI config: who may lock which GPUs (default /etc/gpuenv/gpuenvd.conf if present).",
    )(fn)


@click.group("daemon", invoke_without_command=True)
@_socket_option
@_config_option
@click.option(
    "--metrics",
    metavar="HOST:PORT",
    default=None,
    help="Serve Prometheus metrics here (an address alone: port 19400).",
)
@interval_option(
    "telemetry samples (default 0.1; config: [daemon] sample_period)", old=("--sample-period",)
)
@click.option("--log-level", type=click.Choice(_LEVELS), default="info", show_default=True)
@click.pass_context
@handle_errors
def daemon(
    ctx: click.Context,
    socket_path: str | None,
    config_path: str | None,
    metrics: str | None,
    interval: float | None,
    log_level: str,
) -> None:
    """gpuenvd: a root service that lends clock locks to unprivileged users.

    'sudo gpuenv daemon' runs it in the foreground (systemd: 'gpuenv ops install unit').
    Users lock through its socket (gpuenv.daemon.client); a lease ends, and the
    GPU is put back, when the process that took it exits or dies, SIGKILL
    included. Config (INI; all sections optional):

    \b
      [daemon]
      socket = /run/gpuenv/gpuenv.sock
      socket_group = gpubench       ; socket mode 0660, this group
      metrics = 127.0.0.1:19400     ; Prometheus endpoint
      [lock]
      user:alice = all
      group:gpubench = 0,1          ; NVML indices or UUIDs
      [admin]
      users = ops
      groups = wheel
    """
    if ctx.invoked_subcommand is not None:
        return
    _serve(ctx, socket_path, config_path, metrics, interval, log_level)


def _serve(
    ctx: click.Context,
    socket_path: str | None,
    config_path: str | None,
    metrics: str | None,
    sample_period: float | None,
    log_level: str,
) -> None:
    from dataclasses import replace

    from gpuenv.daemon.auth import load_config, parse_listen
    from gpuenv.daemon.server import Server

    if socket_path is not None:  # '' is a bad path, not "the default" (it started there)
        validate.text(socket_path, "--socket")
    _setup_logging(log_level)
    log = logging.getLogger("gpuenv.daemon")
    config = load_config(config_path)
    socket_path = socket_path or os.environ.get("GPUENV_SOCKET", "").strip() or None
    config = config.with_socket(socket_path)
    if metrics:
        parse_listen(metrics)
        config = replace(config, metrics=metrics)
    if sample_period is not None:
        config = replace(config, sample_period=sample_period)
    backend = open_from_ctx(ctx)
    if not backend.capabilities.privileged:
        log.warning("gpuenvd is not running as root: every lock will be refused by the driver")
    server = Server(config, backend)

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        server.request_stop()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.serve_forever()
    finally:
        backend.close()


@daemon.command("leases")
@_socket_option
@click.option("--json", "as_json", is_flag=True, help="Print the daemon's status reply as JSON.")
@handle_errors
def leases(socket_path: str | None, as_json: bool) -> None:
    """The leases gpuenvd holds now, and the lock on each GPU."""
    from gpuenv.daemon.client import Client

    with Client(socket_path) as client:
        reply = client.status()
    if as_json:
        click.echo(json.dumps(reply, indent=2))
        return
    for gpu in reply["gpus"]:
        click.echo(f"GPU {gpu['index']} ({gpu['name']}): {gpu['lock']}")
    if not reply["leases"]:
        click.echo("no leases")
    for lease in reply["leases"]:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(lease["granted_at"]))
        kind = "standing" if lease["standing"] else "lease"
        gpus = ",".join(map(str, lease["gpus"]))
        label = f" [{lease['label']}]" if lease.get("label") else ""
        click.echo(
            f"{lease['id']}  {kind:8}  {lease['user']} pid {lease['pid']}  GPU {gpus}  "
            f"{lease['request']}  since {since}{label}"
        )


@daemon.command("check-config")
@_config_option
@click.pass_context
@handle_errors
def check_config(ctx: click.Context, config_path: str | None) -> None:
    """Parse the config and say who may lock which GPUs on this machine (without a GPU
    driver, e.g. on the machine that writes the file: the rules as written)."""
    from gpuenv.daemon.auth import JOB, Authorizer, load_config
    from gpuenv.daemon.cgroup import DeviceCgroups
    from gpuenv.errors import NvmlUnavailable

    config = load_config(config_path)
    _check_socket_group(config.socket_group)
    try:
        backend = open_from_ctx(ctx, readonly=True)
    except NvmlUnavailable:  # parsing needs no driver; resolving GPU selectors does
        uuids = None
    else:
        try:
            uuids = [backend.device_info(i).uuid for i in range(backend.device_count())]
        finally:
            backend.close()
    rules: dict[str, str] = (
        {key: ", ".join(sel) for key, sel in config.lock_rules.items()}
        if uuids is None
        else Authorizer(config, uuids).describe_rules()
    )
    click.echo(f"config: {config.source or 'defaults (no config file)'}")
    click.echo(
        f"socket: {config.socket} (mode {config.socket_permissions():04o}"
        f"{', group ' + config.socket_group if config.socket_group else ''})"
    )
    click.echo(f"metrics: {config.metrics or 'off'}")
    for key, gpus in sorted(rules.items()):
        click.echo(f"lock: {key} -> {gpus}")
    if uuids is None:
        click.echo(
            "GPUs: no NVIDIA driver here: the [lock] rules are shown as written, not "
            "matched to GPUs (run check-config on the GPU machine for that)"
        )
    if uuids is not None and any(JOB in sel for sel in config.lock_rules.values()):
        click.echo(f"job outside Slurm: {DeviceCgroups().describe()}")
    admins = sorted(config.admin_users) + [f"group:{g}" for g in sorted(config.admin_groups)]
    click.echo(f"admins: root{', ' + ', '.join(admins) if admins else ''}")


def _check_socket_group(group: str | None) -> None:
    """What `gpuenv daemon` refuses at start, check-config refuses too (it approved a
    socket_group that does not exist; the daemon then would not start)."""
    import grp

    from gpuenv.errors import ConfigError

    if group:
        try:
            grp.getgrnam(group)
        except KeyError:
            raise ConfigError(
                f"socket_group {group!r} does not exist", hint="create it or fix the config"
            ) from None
