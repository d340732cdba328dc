"""pytest-benchmark plugin: `pytest --gpuenv` puts GPU telemetry beside every benchmark.

With `--gpuenv`, each test that uses pytest-benchmark's `benchmark` fixture gets,
in `benchmark.extra_info["gpuenv"]` (and so in `--benchmark-json` output and the
saved runs): the telemetry over its rounds (SM clock, power, temperature,
reasons, time under the power cap), the findings (warmup ramp, power cap,
thermal, other processes...) and a verdict. The machine info gets gpuenv's
environment metadata (GPU, driver, clocks, power limit).

    pytest --gpuenv                        # annotate
    pytest --gpuenv --gpuenv-policy=reject # fail benchmarks whose verdict is "rejected"
    pytest --gpuenv --gpuenv-gpu=0         # which GPUs to sample (default: all)

Loading this module imports nothing but pytest: gpuenv's sampler and backend are
imported only when --gpuenv is given. Without pytest-benchmark, --gpuenv warns
once and does nothing.
"""

from __future__ import annotations

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


class _State:
    """The plugin's per-session state: one backend and one sampler for the whole run."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.policy: str = config.getoption("--gpuenv-policy")
        self.selector: str = config.getoption("--gpuenv-gpu")
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
        if self.metadata is None:
            if self.backend is None:
                self.metadata = {"error": self.error}
            else:
                from gpuenv.results import environment_metadata

                self.metadata = environment_metadata(self.backend, self.gpus)
        return self.metadata


def _state(config: pytest.Config) -> _State | None:
    return getattr(config, _STATE_KEY, None)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("--gpuenv", default=False):
        return
    if not config.pluginmanager.hasplugin("benchmark"):
        import warnings

        warnings.warn(
            "--gpuenv: pytest-benchmark is not installed (pip install pytest-benchmark); "
            "there are no benchmarks to annotate",
            stacklevel=1,
        )
        return
    state = _State(config)
    state.start()
    if state.error:
        import warnings

        warnings.warn(f"--gpuenv: no GPU telemetry ({state.error})", stacklevel=1)
    setattr(config, _STATE_KEY, state)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = _state(config)
    if state is not None:
        state.stop()
        setattr(config, _STATE_KEY, None)


class _RoundClock:
    """Wraps pytest-benchmark's timer so that each round's host edges are known: the
    runner reads the timer exactly at a round's start and end."""

    def __init__(self, timer: Any, now: Any):
        self.timer = timer
        self.now = now
        self.edges: list[float] = []

    def __call__(self) -> Any:
        self.edges.append(self.now())
        return self.timer()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    state = _state(item.config)
    fixture = getattr(item, "funcargs", {}).get("benchmark") if state is not None else None
    if state is None or fixture is None or state.sampler is None:
        return (yield)
    sampler = state.sampler
    rounds = None
    if callable(getattr(fixture, "_timer", None)):
        rounds = _RoundClock(fixture._timer, sampler.clock.now)
        fixture._timer = rounds
    t0 = sampler.mark()
    try:
        result = yield
    finally:
        t1 = sampler.mark()
        if rounds is not None:
            fixture._timer = rounds.timer
    info = _annotate(state, fixture, t0, t1, rounds.edges if rounds is not None else [])
    fixture.extra_info["gpuenv"] = info
    if state.policy == "reject" and info.get("verdict") == "rejected":
        reasons = "; ".join(f["message"] for f in info.get("findings", []))
        pytest.fail(f"gpuenv rejected this benchmark: {reasons}", pytrace=False)
    return result


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
    # pytest-benchmark ran the rounds: "reject" can drop them, nothing can re-run them
    m = judge(
        str(getattr(fixture, "name", "benchmark")), data if spans else [t1 - t0],
        Evidence.sampled(sampler, spans, state.gpus) if spans else whole,
        facts=state.facts, policy="reject" if state.policy == "reject" else "annotate",
        raise_if_too_few=False,
    )  # fmt: skip
    out["findings"] = [f.to_dict() for f in m.findings]
    out["verdict"] = m.verdict
    out["rounds_sampled"] = len(spans)
    if state.policy == "reject" and m.rejected_reps:
        out["affected_rounds"] = list(m.rejected_reps)
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
