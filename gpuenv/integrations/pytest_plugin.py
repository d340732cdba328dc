"""pytest-benchmark plugin: `pytest --gpuenv` puts GPU telemetry beside every benchmark.

With `--gpuenv`, each test that uses pytest-benchmark's `benchmark` fixture gets,
in `benchmark.extra_info["gpuenv"]` (and so in `--benchmark-json` output and the
saved runs): the telemetry over its rounds (SM clock, power, temperature,
reasons, time under the power cap), the findings (warmup ramp, power cap,
thermal, other processes...) and a verdict. The machine info gets gpuenv's
environment metadata (GPU, driver, clocks, power limit, gpuenv's lock): only what
stays put between runs, so `--benchmark-compare` is quiet unless the GPU, the
driver or the lock changed (and then says which, per GPU).

    pytest --gpuenv                        # annotate
    pytest --gpuenv --gpuenv-policy=reject # fail benchmarks whose verdict is "rejected"
    pytest --gpuenv --gpuenv-gpu=0         # which GPUs to sample (default: all)
    pytest --gpuenv-sync                   # also wait for the GPU at each round's edges

Registered as the `pytest11` entry point `gpuenv`: installing gpuenv is enough.

Loading this module imports nothing but pytest: gpuenv's sampler and backend are
imported only when --gpuenv is given. Without pytest-benchmark, --gpuenv warns
once and does nothing.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable
from typing import Any

import pytest

_STATE_KEY = "_gpuenv_plugin_state"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuenv", "GPU telemetry for pytest-benchmark (gpuenv)")
    group.addoption("--gpuenv", action="store_true", default=False,
                    help="sample GPU telemetry during each benchmark and add it, with "
                    "findings and a verdict, to the benchmark's extra_info")
    group.addoption("--gpuenv-policy", default="annotate", choices=("annotate", "reject"),
                    help="reject: fail a benchmark whose verdict is 'rejected' "
                    "(default: annotate)")
    group.addoption("--gpuenv-gpu", default="all", metavar="SEL",
                    help="GPUs to sample: indices, UUIDs, 'cuda:N', 'all' (default)")
    group.addoption("--gpuenv-sync", action="store_true", default=False,
                    help="torch.cuda.synchronize() at each round's start and end, so a round "
                    "includes the GPU work it queued (implies --gpuenv; only when the tests "
                    "have imported torch and CUDA is available)")


class _State:
    """The plugin's per-session state: one backend and one sampler for the whole run."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.policy: str = config.getoption("--gpuenv-policy")
        self.selector: str = config.getoption("--gpuenv-gpu")
        self.sync: bool = config.getoption("--gpuenv-sync")
        self.sync_warned = False
        self.backend: Any = None
        self.sampler: Any = None
        self.gpus: list[int] = []
        self.facts: dict[int, Any] = {}
        self.error: str | None = None
        self.metadata: dict[str, Any] | None = None

    def start(self) -> None:
        try:
            from gpuenv.backend import open_backend
            from gpuenv.devices import select_gpus
            from gpuenv.judge import read_facts
            from gpuenv.telemetry import Sampler

            self.backend = open_backend(readonly=True)
            self.gpus = select_gpus(self.backend, self.selector)
            self.facts = read_facts(self.backend, self.gpus)
            self.sampler = Sampler(self.backend, self.gpus)
            self.sampler.start()
        except Exception as err:  # telemetry must never break the test run
            self.error = str(err)
            self.stop()

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        if self.backend is not None:
            try:
                self.backend.close()
            finally:
                self.backend = None

    def env_metadata(self) -> dict[str, Any]:
        """gpuenv's machine_info: environment metadata less what changes from run to run."""
        if self.metadata is None:
            if self.backend is None:
                self.metadata = {"error": self.error}
            else:
                from gpuenv.results import environment_metadata
                from gpuenv.status import lock_info

                meta = steady(environment_metadata(self.backend, self.gpus))
                for gpu in meta.get("gpus", []):
                    lock = lock_info(self.backend, gpu["index"])
                    gpu["lock"] = {k: lock[k] for k in ("state", "sm_mhz", "mem_mhz")}
                self.metadata = meta
        return self.metadata

    def synchronizer(self) -> Callable[[], None] | None:
        """What waits for the GPU at a round's edge (--gpuenv-sync), or None. Never imports
        torch: the tests must have imported it, and CUDA must be available."""
        if not self.sync:
            return None
        torch = sys.modules.get("torch")
        why = None
        if torch is None:
            why = "the tests have not imported torch"
        elif not torch.cuda.is_available():
            why = "torch.cuda.is_available() is False"
        if torch is not None and why is None:
            devices = range(torch.cuda.device_count())

            def synchronize() -> None:
                for device in devices:
                    torch.cuda.synchronize(device)

            return synchronize
        if not self.sync_warned:
            self.sync_warned = True
            warnings.warn(f"--gpuenv-sync: not synchronizing ({why})", stacklevel=1)
        return None


# Values that change between two runs on the same machine: kept out of machine_info, which
# pytest-benchmark compares whole (the telemetry per benchmark says what they were).
VOLATILE = ("time_unix", "time_utc")
VOLATILE_GPU = ("sm_mhz", "mem_mhz", "temp_c", "power_w", "reasons")
# What, changed, makes two runs' numbers incomparable (pytest_benchmark_compare_machine_info)
COMPARED = ("name", "uuid", "lock", "power_limit_w", "app_sm_mhz", "app_mem_mhz")


def steady(meta: dict[str, Any]) -> dict[str, Any]:
    """environment_metadata less the volatile values (time, current clock, power, temp)."""
    out = {k: v for k, v in meta.items() if k not in VOLATILE}
    out["gpus"] = [{k: v for k, v in g.items() if k not in VOLATILE_GPU}
                   for g in meta.get("gpus", [])]
    return out


def changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two runs' gpuenv machine_info that matters to their numbers."""
    out = []
    if saved.get("driver_version") != now.get("driver_version"):
        out.append(f"driver {saved.get('driver_version')} -> {now.get('driver_version')}")
    old = {g.get("index"): g for g in saved.get("gpus", [])}
    for gpu in now.get("gpus", []):
        before = old.get(gpu.get("index"))
        if before is None:
            out.append(f"GPU {gpu.get('index')} was not in the saved run")
            continue
        for key in COMPARED:
            if before.get(key) != gpu.get(key):
                out.append(f"GPU {gpu.get('index')} {key}: {before.get(key)} -> {gpu.get(key)}")
    return out


def _state(config: pytest.Config) -> _State | None:
    return getattr(config, _STATE_KEY, None)


# before pytest-benchmark's (trylast) configure, which compares machine_info with a saved run
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not (config.getoption("--gpuenv", default=False)
            or config.getoption("--gpuenv-sync", default=False)):
        return
    if not config.pluginmanager.hasplugin("benchmark"):
        warnings.warn(
            "--gpuenv: pytest-benchmark is not installed (pip install pytest-benchmark); "
            "there are no benchmarks to annotate",
            stacklevel=1,
        )
        return
    state = _State(config)
    state.start()
    if state.error:
        warnings.warn(f"--gpuenv: no GPU telemetry ({state.error})", stacklevel=1)
    setattr(config, _STATE_KEY, state)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = _state(config)
    if state is not None:
        state.stop()
        setattr(config, _STATE_KEY, None)


class _RoundClock:
    """Wraps pytest-benchmark's timer so that each round's host edges are known: the
    runner reads the timer exactly at a round's start and end. With `sync`, the GPU's
    queued work is waited for first, so the round's end includes it."""

    def __init__(self, timer: Any, now: Any, sync: Callable[[], None] | None = None):
        self.timer = timer
        self.now = now
        self.sync = sync
        self.edges: list[float] = []

    def __call__(self) -> Any:
        if self.sync is not None:
            self.sync()
        self.edges.append(self.now())
        return self.timer()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    state = _state(item.config)
    fixture = getattr(item, "funcargs", {}).get("benchmark") if state is not None else None
    if state is None or fixture is None or not callable(getattr(fixture, "_timer", None)):
        return (yield)
    sampler = state.sampler
    sync = state.synchronizer()
    if sampler is None and sync is None:
        return (yield)
    import time

    rounds = _RoundClock(fixture._timer, sampler.clock.now if sampler else time.monotonic, sync)
    fixture._timer = rounds
    t0 = sampler.mark() if sampler else 0.0
    try:
        result = yield
    finally:
        t1 = sampler.mark() if sampler else 0.0
        fixture._timer = rounds.timer
    if sampler is None:
        return result
    info = _annotate(state, fixture, t0, t1, rounds.edges)
    fixture.extra_info["gpuenv"] = info
    if state.policy == "reject" and info.get("verdict") == "rejected":
        reasons = "; ".join(f["message"] for f in info.get("findings", []))
        pytest.fail(f"gpuenv rejected this benchmark: {reasons}", pytrace=False)
    return result


# Rounds judged one by one, each with its own telemetry window; a benchmark with more is
# judged in blocks of consecutive rounds (extra_info says how many rounds a block holds).
MAX_JUDGED_ROUNDS = 1000


def _annotate(
    state: _State, fixture: Any, t0: float, t1: float, edges: list[float]
) -> dict[str, Any]:
    """Telemetry, findings and verdict of one benchmark, as plain JSON values."""
    from gpuenv.judge import Evidence, judge

    sampler = state.sampler
    data = _round_times(fixture)
    spans: list[tuple[float, float]] = []
    if data and len(edges) >= 2 * len(data):
        tail = edges[-2 * len(data):]
        spans = [(tail[2 * i], tail[2 * i + 1]) for i in range(len(data))]
    whole = Evidence.sampled(sampler, [(t0, t1)], state.gpus)
    out: dict[str, Any] = {"gpus": state.gpus, "policy": state.policy,
                           "telemetry": [w.to_dict() for w in whole.windows]}
    per = -(-len(spans) // MAX_JUDGED_ROUNDS)  # rounds per judged block (ceil)
    if per > 1:  # a window per round of a 10^5-round benchmark costs seconds: judge blocks
        data = [sum(data[i:i + per]) for i in range(0, len(spans), per)]
        spans = [(spans[i][0], spans[min(i + per, len(spans)) - 1][1])
                 for i in range(0, len(spans), per)]
        out["rounds_per_block"] = per
    # pytest-benchmark ran the rounds: "reject" can drop them, nothing can re-run them
    m = judge(
        str(getattr(fixture, "name", "benchmark")), data if spans else [t1 - t0],
        Evidence.sampled(sampler, spans, state.gpus) if spans else whole,
        facts=state.facts, policy="reject" if state.policy == "reject" else "annotate",
        raise_if_too_few=False,
    )  # fmt: skip
    out["findings"] = [f.to_dict() for f in m.findings]
    out["verdict"] = m.verdict
    out["rounds_sampled"] = len(_round_times(fixture)) if spans else 0
    if state.policy == "reject" and m.rejected_reps:
        out["affected_blocks" if per > 1 else "affected_rounds"] = list(m.rejected_reps)
    out["summary"] = " | ".join(w.summary() for w in whole.windows)
    return out


def _round_times(fixture: Any) -> list[float]:
    stats = getattr(fixture, "stats", None)
    inner = getattr(stats, "stats", None)
    data = getattr(inner, "data", None)
    return [float(x) for x in data] if data else []


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(
    config: pytest.Config, machine_info: dict[str, Any]
) -> None:
    state = _state(config)
    if state is not None:
        machine_info["gpuenv"] = state.env_metadata()


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_compare_machine_info(
    config: pytest.Config, benchmarksession: Any, machine_info: dict[str, Any],
    compared_benchmark: dict[str, Any],
) -> None:
    """Say which GPU, driver or lock change makes the saved run incomparable (pytest-benchmark
    itself warns that machine_info differs, with both dumps)."""
    now = machine_info.get("gpuenv")
    saved = (compared_benchmark.get("machine_info") or {}).get("gpuenv")
    if _state(config) is None or not isinstance(now, dict) or not isinstance(saved, dict):
        return
    found = changes(saved, now)
    if found:
        benchmarksession.logger.warning(
            "gpuenv: the GPUs are not in the state of the saved run: " + "; ".join(found)
        )
