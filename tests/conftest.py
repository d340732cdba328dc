"""Shared fixtures. `gpu`-marked tests run only where NVML sees a GPU (the device machine)."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@functools.lru_cache(maxsize=1)
def _have_gpu() -> bool:
    try:
        from gpuenv.backend.nvml import NvmlBackend

        backend = NvmlBackend()
        try:
            return backend.device_count() > 0
        finally:
            backend.close()
    except Exception:
        return False


# tryfirst: before pytest-xdist's worker reads the xdist_group marks (at this same hook)
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # the `gpu` tests share one resource, the machine's GPU: under pytest-xdist (addopts:
    # -n auto) they run on one worker, one at a time, as a timing or telemetry test needs
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.xdist_group("gpu"))
    if any("gpu" in item.keywords for item in items) and not _have_gpu():
        skip = pytest.mark.skip(reason="needs an NVIDIA GPU with NVML (run scripts/device-test)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


class _XdistGroups:
    """`xdist_group` for pytest 9.2: pytest-xdist's worker appends "@GROUP" to a grouped
    test's id by setting `item._nodeid`, which pytest 9.2 no longer reads (it keeps the id
    in `item._id`), so the marks did nothing: the Slurm modules were spread over both
    workers, each started a cluster, and the job past its time limit was started again and
    waited out. Where pytest-xdist's own works, this finds the suffix there and does nothing."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]):
        if not getattr(config.option, "loadgroup", False):  # a worker under --dist loadgroup
            return
        try:
            from _pytest.nodeid import NodeId
        except ImportError:  # a pytest before 9.2: pytest-xdist's own suffix holds
            return
        for item in items:
            names = {
                str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                for m in item.iter_markers("xdist_group")
            }
            suffix = "@" + "_".join(sorted(names))
            if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
                item._id = NodeId.parse(item.nodeid + suffix)


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_XdistGroups(), "gpuenv-xdist-groups")


MAX_AUTO_WORKERS = 4  # `-n auto` (addopts) on a machine of many cores


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker a core, at most MAX_AUTO_WORKERS. The suite was made and run
    green with 2 to 4 workers; 64 on a large machine would run its real daemons, Slurm
    and accounts 64 at a time for no measured gain."""
    return max(1, min(os.cpu_count() or 1, MAX_AUTO_WORKERS))


def _without_group(nodeid: str) -> str:
    """A test's id without the "@GROUP" a pytest-xdist worker gives a grouped one (xdist's
    rule: an '@' after the last ']')."""
    return nodeid.rsplit("@", 1)[0] if nodeid.rfind("@") > nodeid.rfind("]") else nodeid


# read once at start: each test's own environment has no GPUENV_* variable (_isolate_env).
# Under pytest-xdist the controller writes it, from every worker's reports; a worker writes
# nothing (it would write each line a second time)
_SKIPPED_OUT = None if "PYTEST_XDIST_WORKER" in os.environ else os.environ.get("GPUENV_SKIPPED_OUT")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """GPUENV_SKIPPED_OUT=FILE: each skipped test's id, a line each, for .ci/run's second
    stage (the README's command skips what needs an extra; CI runs those again with it).
    A `gpu` test is left out: no extra makes it run on a machine without a GPU."""
    if (
        _SKIPPED_OUT
        and report.skipped
        and report.when in ("setup", "call")
        and "gpu" not in report.keywords
    ):
        with open(_SKIPPED_OUT, "a") as f:
            f.write(_without_group(report.nodeid) + "\n")  # an id stage 2 can name


def _isolate(mp: pytest.MonkeyPatch, state: Path) -> None:
    """The environment of a test (or of a module's fixture): no GPUENV_* setting of the
    developer's, the journal, simulated machine and gpuenvd socket in `state`, and no
    sign of a pytest-xdist worker."""
    for key in list(os.environ):
        # PYTEST_XDIST_*: the worker's own (pytest-xdist sets them); a pytest the test starts
        # must not take itself for a worker (pytest-benchmark then disables its benchmarks)
        if key.startswith(("GPUENV_", "PYTEST_XDIST_")):
            mp.delenv(key)
    mp.setenv("GPUENV_STATE_DIR", str(state / "journal"))
    mp.setenv("GPUENV_SIM_STATE", str(state / "sim.json"))
    # no gpuenvd unless a test starts one: a daemon on this machine must not take the locks;
    # and root's lock notices go beside this socket, not to the host's /run/gpuenv/locks
    mp.setenv("GPUENV_SOCKET", str(state / "no-daemon.sock"))
    if os.geteuid() != 0:
        # the suite run by an ordinary account (the README's test command, a contributor):
        # each test's simulated machine is its own (GPUENV_SIM_STATE above, in a directory
        # this account owns), where the account may act as root, as CI's root does. A test
        # of the ordinary account's refusal sets GPUENV_SIM_ROOT=0 itself.
        mp.setenv("GPUENV_SIM_ROOT", "1")


@pytest.fixture(autouse=True)
def _isolate_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """No test reads the developer's GPUENV_* settings or writes their state dirs."""
    _isolate(monkeypatch, tmp_path_factory.mktemp("gpuenv-state"))
    yield
    # what the code under test set (`--sim` is GPUENV_BACKEND=sim, `--quiet` GPUENV_QUIET=1)
    # goes too; monkeypatch then puts back what the developer had
    for key in list(os.environ):
        if key.startswith("GPUENV_"):
            del os.environ[key]


@pytest.fixture(scope="module")
def module_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """_isolate_env for a module-scoped fixture, which is set up before any test's own: one
    that runs gpuenv asks for this (the sim tour's lock posted its notice to the host's
    /run/gpuenv/locks, which every worker and every other run on the host shares)."""
    with pytest.MonkeyPatch.context() as mp:
        _isolate(mp, tmp_path_factory.mktemp("gpuenv-state"))
        yield
        for key in list(os.environ):
            if key.startswith("GPUENV_"):
                del os.environ[key]


@pytest.fixture
def vclock():
    """Virtual time starting at 1000.0 s: sleep/advance move it at once."""
    from gpuenv.timebase import VirtualClock

    return VirtualClock()


@pytest.fixture
def sim(vclock, request):
    """A simulated H100 (in memory, root, virtual time): `sim.clock is vclock`. More GPUs:
    `pytestmark = pytest.mark.sim_gpus(2)` on a module (or the mark on one test)."""
    from gpuenv.backend.sim import SimBackend

    marker = request.node.get_closest_marker("sim_gpus")
    backend = SimBackend(n_gpus=marker.args[0] if marker else 1, clock=vclock)
    yield backend
    backend.close()


@pytest.fixture
def warm_sim(sim):
    """The simulated H100 with a CUDA context, idle for 10 s: at its boost clock, cool."""
    sim.open_context(0)
    sim.idle(10.0)
    return sim


class _Checks(list):
    def __init__(self) -> None:
        super().__init__()
        self.lookback: list[float] = []


@pytest.fixture
def ready_checks(monkeypatch):
    """The `since` of each gpuenv.bench call's check for a ready GPU (harness._Run._wait),
    in order: from which samples on the check counted; `.lookback`, each check's
    `lookback_s` (how much earlier the older of its two samples may be)."""
    from gpuenv.timing import harness

    seen = _Checks()
    own = harness._Run._wait

    def wait(self, since=None, lookback_s=0.0):
        seen.append(since)
        seen.lookback.append(lookback_s)
        return own(self, since, lookback_s)

    monkeypatch.setattr(harness._Run, "_wait", wait)
    return seen


# One one-node Slurm for the session (tests/test_slurm.py): its job past its 1-minute time
# limit is started with the first Slurm test and ends while tests/test_slurm_nodes.py runs;
# tests/test_slurm_timelimit.py, the last Slurm module by name, judges it and stops the
# cluster. Judged in its own module, the limit cost ~45 s of waiting a run.
@pytest.fixture(scope="session")
def slurm_one() -> Iterator[object]:
    from slurm_harness import started

    yield from started("a one-node Slurm")


@pytest.fixture(scope="session")
def timed_out(slurm_one: object) -> dict[str, object]:
    from slurm_harness import job_past_its_limit

    return job_past_its_limit(slurm_one)  # type: ignore[arg-type]
