"""`gpuenv lock` and `gpuenv restore` (alias `unlock`): parse, call gpuenv.clocks, print.

Exit codes: 0 done (or nothing to do, a GPU with no record left as it is, or a dry
run); 2 an error (bad input, read-only mode refused a write, a journal record that
could not be put back); 3 not supported; 4 no permission; 5 a lock held by another
owner. The rest: gpuenv.errors.EXIT_CODES.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from gpuenv.cli._common import (
    OWN,
    chosen_gpus,
    effect_done,
    gpu_option,
    handle_errors,
    is_dry_run,
    lock_options,
    open_from_ctx,
)
from gpuenv.errors import GpuenvError, LockConflict, ReadOnlyError

if TYPE_CHECKING:
    from gpuenv.backend import Backend
    from gpuenv.clocks import GpuPlan
    from gpuenv.clocks.journal import Journal
    from gpuenv.clocks.restoring import RestoreItem


@click.command("lock")
@lock_options(
    sm="SM clock: MHz, a range, 'max', 'base' (the TDP clock) or 'sustained' "
    "(the clock 'gpuenv calibrate' measured). Snapped to a supported clock.",
    mem="Memory clock (not on Hopper: it cannot apply one now).",
    power_limit="Power limit in watts.",
)
@gpu_option(OWN)
@click.option("--force", is_flag=True, help="Take over a lock another owner holds.")
@click.option(
    "--dry-run", "dry_run_here", is_flag=True, help="Say what would be done; change nothing."
)
@click.pass_context
@handle_errors
def lock(
    ctx: click.Context,
    sm: str | None,
    sm_max: int | None,
    mem: str | None,
    power_limit: float | None,
    gpu: str,
    force: bool,
    dry_run_here: bool,
) -> None:
    """Lock clocks until 'gpuenv restore' (nvidia-smi -lgc/-lmc/-pl, journaled).

    The state before the lock (locked clocks, application clocks, power limit)
    is written to the journal first; 'gpuenv restore' puts exactly that back.
    When a gpuenvd serves these GPUs the lock is a standing lease from it (as any
    user it lets lock, root included); otherwise it is local and needs root.
    A lock held by another owner is refused (exit 5) unless it is the same
    lock (then it is shared) or --force is given.
    """
    from gpuenv.clocks import decide, describe_target, make_request, plan_lock
    from gpuenv.clocks.journal import Journal
    from gpuenv.clocks.request import CLI_NAMES, TDP_LOCK
    from gpuenv.locking import acquire

    # judged first, in the flags' names (the Python API's own check names its parameters)
    request = make_request(sm, sm_max=sm_max, mem=mem, power_limit_w=power_limit, names=CLI_NAMES)
    dry = dry_run_here or is_dry_run(ctx)
    backend = open_from_ctx(ctx, readonly=True if dry else None)
    try:
        gpus, why = chosen_gpus(backend, gpu)
        if backend.readonly:
            journal = Journal()
            plan = plan_lock(backend, request, gpus, journal=journal)
            decisions = decide(plan, journal, force=force, wait_dying=False) or []
            click.echo(f"gpuenv lock: {why}")  # judged first: an error stays one line
            for d in decisions:
                click.echo(f"{d.plan.name}: would {d.action_text()}")
            _echo_notes(plan.gpus)
            if dry:
                click.echo("dry run: nothing was changed")
                return
            raise ReadOnlyError(
                f"lock clocks ({request.describe()})",
                reason=getattr(backend, "reason", "read-only"),
            )
        held = acquire(
            request=request,
            gpus=gpus,
            backend=backend,
            standing=True,
            force=force,
        )
        effect_done("the lock is taken and stays until 'gpuenv restore'")
        click.echo(f"gpuenv lock: {why}")
        for gp in held.plan.gpus:
            if gp.index in held.shared:
                click.echo(
                    f"{gp.name}: already locked to {describe_target(gp.applied)}; now shared"
                )
            else:
                click.echo(f"{gp.name}: locked {describe_target(gp.applied)} (was: {_was(gp)})")
            if gp.applied.locked_sm == TDP_LOCK:
                click.echo(f"{gp.name}: {_base_reads(backend, gp.index)}")
        for note in held.notes:
            click.echo(f"note: {note}")
        if hasattr(held, "client"):
            held.client.close()  # a standing lease from gpuenvd outlives the connection
        click.echo("the lock stays until 'gpuenv restore'")
    finally:
        backend.close()


def _base_reads(backend: Backend, index: int) -> str:
    """The MHz a base-clock lock holds, as the SM clock reads it just after: NVML locks to
    the base clock by a symbolic value and reports no base clock to say what that is."""
    from gpuenv.telemetry.samples import DRIVER_REFRESH_S

    backend.clock.sleep(DRIVER_REFRESH_S)  # a reading the driver latched after the lock
    try:
        mhz = backend.read_fast(index).sm_mhz
    except GpuenvError as err:
        return f"the base clock's MHz could not be read ({err}); 'gpuenv status' shows the clock"
    return (
        f"the base clock is {mhz} MHz (the SM clock as read now: NVML locks to the base clock "
        "by name and does not report its value)"
    )


def _was(gp: GpuPlan) -> str:
    """The settings the lock changes, as they were."""
    cur, applied = gp.current, gp.applied
    parts = []
    if applied.locked_sm is not None or applied.locked_mem is not None:
        parts.append("not locked by gpuenv")
    if applied.app_clocks is not None:
        parts.append(f"application clocks SM {cur.app_sm_mhz}, memory {cur.app_mem_mhz} MHz")
    if applied.power_limit_w is not None:
        parts.append(f"power limit {cur.power_limit_w:g} W")
    return ", ".join(parts)


def _echo_notes(gpus: Sequence[GpuPlan]) -> None:
    for gp in gpus:
        for note in gp.notes:
            click.echo(f"note: {gp.name}: {note}")


@click.command("restore")
@gpu_option(OWN)
@click.option(
    "--all",
    "all_owners",
    is_flag=True,
    help="Also restore locks held by running processes (they are told nothing).",
)
@click.option(
    "--defaults",
    is_flag=True,
    help="Where no journal record can say what was there (deleted, damaged), reset to the "
    "driver's defaults: locked clocks reset, default application clocks and power limit.",
)
@click.option(
    "--dry-run", "dry_run_here", is_flag=True, help="Say what would be done; change nothing."
)
@click.pass_context
@handle_errors
def restore(
    ctx: click.Context, gpu: str, all_owners: bool, defaults: bool, dry_run_here: bool
) -> None:
    """Put back exactly the state journaled before 'gpuenv lock' (idempotent).

    When a gpuenvd serves these GPUs, ends your standing leases on them (root and
    the daemon's admins: everyone's, and with --all every lease).

    Restores standing locks and locks whose owner died. A lock held by a running
    process is left alone (exit 5, naming it) unless --all is given. The journal
    entry is cleared only after its restore succeeded. A GPU gpuenv holds no record
    of is left as it is (exit 0), and named when it is not at the driver's defaults
    (a power limit, application clocks): so a second restore always exits 0. A GPU
    whose record is damaged is reported (exit 2) after the others are restored;
    --defaults resets it (and any selected GPU with no record) to the driver's
    defaults, which is not necessarily what was there before the lock.

    Without -i it takes the GPUs 'gpuenv lock' takes there (this process's own), so
    a restore in the shell or job that locked puts back what it locked and leaves
    other tenants' GPUs alone; a gpuenv lock journaled on another GPU is named, with
    the -i that restores it.
    """
    from gpuenv.clocks.journal import Journal
    from gpuenv.clocks.restoring import damaged_records, plan_restore
    from gpuenv.locking import daemon_client

    dry = dry_run_here or is_dry_run(ctx)
    backend = open_from_ctx(ctx, readonly=True if dry else None)
    try:
        gpus, why = chosen_gpus(backend, gpu)
        daemon = daemon_client(backend)
        if daemon is not None:
            daemon.close()
            if not defaults:  # --defaults writes the GPUs itself: it needs root, not a lease
                _restore_via_daemon(backend, gpus, all_owners)
                return
        journal = Journal()
        items = plan_restore(backend, gpus, journal=journal, all_owners=all_owners)
        damaged = damaged_records(backend, gpus, journal=journal)
        journaled = {it.index for it in items}
        reset = [i for i in gpus if i not in journaled] if defaults else []
        if not items and not damaged and not reset:
            click.echo("nothing to restore: no gpuenv lock is journaled on these GPUs")
        _restore_items(backend, journal, items, reset, dry=dry, all_owners=all_owners)
        for line in [] if defaults else _not_put_back(backend, journal, gpus, journaled, damaged):
            click.echo(line)
        if gpu == OWN:
            for line in _elsewhere(backend, journal, gpus, why):
                click.echo(line)
        blocked = [it for it in items if it.blocked_by is not None]
        for it in blocked:
            click.echo(f"left alone: {it.entry.name} is held by {it.blocked_by}")
        if damaged and not defaults:
            raise damaged[0][1]
        if blocked:
            raise LockConflict(
                blocked[0].index,
                blocked[0].blocked_by or "",
                hint="it restores when it ends; 'gpuenv restore --all' restores anyway",
            )
    finally:
        backend.close()


def _restore_items(
    backend: Backend,
    journal: Journal,
    items: Sequence[RestoreItem],
    reset: Sequence[int],
    *,
    dry: bool,
    all_owners: bool,
) -> None:
    """Restore the journaled GPUs exactly and reset `reset` to defaults (or say what would be)."""
    from gpuenv.clocks import restore as do_restore
    from gpuenv.clocks.restoring import JournalNotUpdated, restore_defaults

    todo = [it for it in items if it.blocked_by is None]
    if backend.readonly:
        for it in todo:
            click.echo(f"would restore {it.describe()}")
        for index in reset:
            click.echo(f"would reset GPU {index} to the driver's defaults")
        if (todo or reset) and dry:
            click.echo("dry run: nothing was changed")
        elif todo or reset:
            raise ReadOnlyError(
                f"restore {len(todo) + len(reset)} GPU(s)",
                reason=getattr(backend, "reason", "read-only"),
            )
        return
    if todo:
        try:
            do_restore(
                [it.index for it in todo], backend=backend, journal=journal, all_owners=all_owners
            )
        except JournalNotUpdated:  # the GPUs are back: say so, then why it still exits 2
            effect_done("the restore was done ('gpuenv status' shows the clocks now)")
            for it in todo:
                click.echo(f"restored {it.describe()}")
            raise
    lines = list(restore_defaults(backend, reset, journal)) if reset else []
    if todo or reset:  # done before a word is printed (click.echo flushes each line)
        effect_done("the restore was done ('gpuenv status' shows the clocks now)")
    for it in todo:
        click.echo(f"restored {it.describe()}")
    for line in lines:
        click.echo(line)


def _elsewhere(backend: Backend, journal: Journal, gpus: Sequence[int], why: str) -> list[str]:
    """A line for each gpuenv lock journaled on a GPU that is not this process's: a restore
    without -i leaves it (another tenant's, or one taken with -i all), and says so."""
    from gpuenv.clocks.restoring import plan_restore

    return [
        f"left alone: {it.entry.name} holds a gpuenv lock but is not one of this process's "
        f"GPUs ({why}); 'gpuenv restore -i {it.index}' puts it back"
        for it in plan_restore(backend, "all", journal=journal)
        if it.index not in gpus
    ]


def _not_put_back(
    backend: Backend,
    journal: Journal,
    gpus: Sequence[int],
    journaled: set[int],
    damaged: Sequence[Any],
) -> list[str]:
    """A line for every selected GPU restore did not put back, each with what it shows and
    what --defaults would do: a damaged record (restore then exits 2: it had a record and
    could not use it), or none at all but a state that is not the driver's default (left
    as it is, exit 0: an admin's power limit is no failure of a restore, issue 31)."""
    from gpuenv.clocks.restoring import not_put_back, unrecorded_changes, unrecorded_report

    lines = [
        not_put_back(
            backend,
            index,
            f"its journal record is damaged ({err.why})",
            unrecorded_changes(backend, index),
        )
        for index, err in damaged
    ]
    bad = {index for index, _ in damaged}
    rest = [i for i in gpus if i not in journaled and i not in bad]
    return lines + unrecorded_report(backend, rest, journal)


def _restore_via_daemon(backend: object, gpu: Sequence[int], all_owners: bool) -> None:
    from gpuenv.devices import describe
    from gpuenv.locking import restore as locking_restore

    restored = locking_restore(gpu, backend=backend, all_owners=all_owners)  # type: ignore[arg-type]
    if restored:
        effect_done("the restore was done ('gpuenv status' shows the clocks now)")
    for index in restored:
        click.echo(f"restored {describe(backend, index)} (gpuenvd)")  # type: ignore[arg-type]
    if not restored:
        click.echo("nothing to restore: no lease of yours is held on these GPUs (gpuenvd)")
