"""`gpuenv run`'s options checked before anything runs, its dry run, and its exit.

    plan = plan_run(command, sm=..., period=..., policy=..., output=..., gpu="auto")
    dry_run_lines(backend, gpus, plan)   # what --dry-run prints
    exit_like(result, policy)            # exit (or die of a signal) as the command did

Every check here fails before a GPU is opened or anything is locked.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from gpuenv import validate
from gpuenv.errors import ConfigError

if TYPE_CHECKING:
    from gpuenv.backend import Backend
    from gpuenv.clocks.request import LockRequest

# The signals gpuenv dies of when they killed the command (others: exit 128+N).
RERAISE = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGKILL)


@dataclass(frozen=True)
class RunPlan:
    """What `gpuenv run` will do, its options checked."""

    argv: list[str]
    auto_regions: Any  # select_kinds()'s answer
    lock: LockRequest | None  # what to lock while the command runs (None: nothing)
    selector: str | None  # -i; None: this process's own GPUs (gpuenv.devices.own_gpus)
    output: Path | str | None
    autotune: bool = False  # the command's autotuners choose with gpuenv.rank


def plan_run(
    command: Sequence[str],
    *,
    sm: str | None,
    sm_max: int | None,
    mem: str | None,
    power_limit: float | None,
    period: float | None,
    policy: str,
    no_auto_regions: bool,
    gpu: str,
    output: str | None,
    env: Mapping[str, str],
    append: bool = False,
    autotune: bool = False,
) -> RunPlan:
    """Check the options in the order a user fixes them; a typo fails before any lock."""
    from gpuenv.run.autoregions import ENV_AUTOTUNE, ENV_SELECT, autotune_choice, select_kinds
    from gpuenv.run.ranks import rank_of, rank_output_path
    from gpuenv.run.runner import check_run_policy, resolve_command

    argv = list(command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise ConfigError("no command to run", hint="gpuenv run [options] -- python bench.py")
    if period is not None:
        validate.sample_period(period, "--interval")
    check_run_policy(policy)
    from gpuenv.run.ranks import wait_time

    wait_time(env)  # GPUENV_RANKS_WAIT_S=abc fails now, not after the command ran
    resolve_command(argv)  # a typo fails here, before anything is locked
    auto = select_kinds(env.get(ENV_SELECT), enabled=not no_auto_regions)
    tune = autotune_choice(env.get(ENV_AUTOTUNE), flag=autotune)
    from gpuenv.clocks.request import cli_request

    lock = cli_request(sm, sm_max, mem, power_limit)  # judged now: what the runner locks
    selector = None if gpu == "auto" else gpu
    if output is not None:  # '' is a bad path, not "no output" (it wrote nothing, silently)
        validate.output_path(output, "-o")
    out_path = rank_output_path(output, rank_of(env)) if output is not None else None
    if out_path is not None:
        check_output_dir(out_path)
        validate.results_path(out_path, "-o", append=append)  # before the command runs
    return RunPlan(argv, auto, lock, selector, out_path, tune)


def check_output_dir(path: os.PathLike[str] | str) -> None:
    """-o names a file in a directory that exists: a typo must not grow a tree from '/'."""
    parent = Path(path).parent
    if not parent.is_dir():
        raise ConfigError(
            f"-o {path}: the directory {parent} does not exist",
            hint=f"create it first (mkdir -p {parent}) or pick another path",
        )


def dry_run_lines(backend: Backend, gpus: list[int], plan: RunPlan, why: str = "") -> Iterator[str]:
    """What --dry-run says it would do, line by line; nothing is run or changed. `why`:
    why these GPUs (gpuenv.devices.choose_gpus)."""
    import shlex

    from gpuenv.devices import describe

    where = ", ".join(describe(backend, g) for g in gpus)
    yield f"would run: {shlex.join(plan.argv)}"
    yield f"sampling: {where}" + (f" ({why})" if why else "")
    if plan.lock is not None:
        from gpuenv.clocks import plan_lock

        for line in plan_lock(backend, plan.lock, gpus).lines():
            yield f"would lock: {line}"
    if plan.output is not None:
        yield f"results: {plan.output}"
    if plan.autotune:
        yield "autotuners: triton's and Inductor's choose with gpuenv (--autotune)"
    yield "dry run: nothing was run or changed"


def exit_like(result: Any, policy: str) -> NoReturn:
    """Exit with the command's status; die of the signal that killed it (shells see that)."""
    code = result.exit_status(policy)
    if result.returncode < 0 and -result.returncode in RERAISE:
        sys.stdout.flush()
        sys.stderr.flush()
        sig = -result.returncode
        if sig != signal.SIGKILL:  # SIGKILL's action cannot be set (nor caught)
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)  # die of it, as the command did: shells see a signal death
    sys.exit(code)
