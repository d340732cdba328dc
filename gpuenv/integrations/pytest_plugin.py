"""pytest-benchmark plugin: `pytest --gpuenv` puts GPU telemetry beside every benchmark.

With `--gpuenv`, each test that uses pytest-benchmark's `benchmark` fixture is one
measurement, judged by gpuenv.judge: its rounds' telemetry (SM clock, power,
temperature, reasons, time under the power cap), findings and verdict go in
`benchmark.extra_info["gpuenv"]` (and so in `--benchmark-json` output and saved
runs), and a short "gpuenv" section after pytest-benchmark's table names each
flagged benchmark with its finding (one line counts the ok ones). A benchmark
during which every sampled GPU stayed idle (GpuIdle throughout: CPU-only work) is
"no GPU work": gpuenv has nothing to judge there and says so instead of guessing.
The machine info gets gpuenv's environment metadata (GPU, driver, clocks, power
limit, gpuenv's lock): only what stays put between runs, so `--benchmark-compare`
is quiet unless the GPU, the driver or the lock changed (then the summary says which).

    pytest --gpuenv                        # annotate
    pytest --gpuenv --gpuenv-policy=reject # fail benchmarks whose verdict is "rejected"
    pytest --gpuenv --gpuenv-gpu=0         # which GPUs to sample (default: all)
    pytest --gpuenv-sync                   # also wait for the GPU at each round's edges

Never a cause of failure by itself: no NVIDIA driver, pytest-benchmark missing, a
telemetry error are said in the terminal summary, never with warnings.warn (which
`-W error` / `filterwarnings = error` would turn into an INTERNALERROR); the
benchmarks run and are timed as without --gpuenv. Nothing runs inside a timed round:
a round's edges are taken when pytest-benchmark hands its duration to its stats
(`pytest_benchmark.stats.Metadata.update`), after the round's closing timer read
(--gpuenv-sync, which must wait for the GPU inside the round, is the exception).

Registered as the `pytest11` entry point `gpuenv`: installing gpuenv is enough.
Loading this module imports nothing but pytest: gpuenv's sampler and backend are
imported only when --gpuenv is given.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the module imports only pytest: gpuenv is imported when --gpuenv is given
    from gpuenv.backend import Backend
    from gpuenv.telemetry import Sampler, Window
    from gpuenv.verdict import GpuFacts

_STATE_KEY = "_gpuenv_plugin_state"

# What pytest-benchmark calls once per timed round, right after the round's closing
# timer read, with the round's duration: not documented API (tests/test_pytest_plugin.py
# fails naming it when it moves; the plugin then judges the benchmark as one region).
ROUND_HOOK = ("pytest_benchmark.stats", "Metadata", "update")
# --gpuenv-sync wraps the fixture's timer (private too; the same test guards it)
TIMER_ATTR = "_timer"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpuenv", "GPU telemetry for pytest-benchmark (gpuenv)")
    group.addoption(
        "--gpuenv",
        action="store_true",
        default=False,
        help="sample GPU telemetry during each benchmark and add it, with "
        "findings and a verdict, to the benchmark's extra_info; flagged "
        "benchmarks are named in the terminal summary",
    )
    group.addoption(
        "--gpuenv-policy",
        default="annotate",
        choices=("annotate", "reject"),
        help="reject: fail a benchmark whose verdict is 'rejected' (default: annotate)",
    )
    group.addoption(
        "--gpuenv-gpu",
        default="all",
        metavar="SEL",
        help="GPUs to sample: indices, UUIDs, 'cuda:N', 'all' (default)",
    )
    group.addoption(
        "--gpuenv-sync",
        action="store_true",
        default=False,
        help="torch.cuda.synchronize() at each round's start and end, so a round "
        "includes the GPU work it queued (implies --gpuenv; only when the tests "
        "have imported torch and CUDA is available)",
    )


class _State:
    """The plugin's per-session state: one backend and one sampler for the whole run, the
    benchmarks judged, and what the summary must say about gpuenv itself (`notes`)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.policy: str = config.getoption("--gpuenv-policy")
        self.selector: str = config.getoption("--gpuenv-gpu")
        self.sync: bool = config.getoption("--gpuenv-sync")
        self.backend: Backend | None = None
        self.sampler: Sampler | None = None
        self.gpus: list[int] = []
        self.facts: dict[int, GpuFacts] = {}
        self.error: str | None = None
        self.metadata: dict[str, Any] | None = None
        self.notes: list[str] = []
        self.judged: list[tuple[str, str, dict[str, Any]]] = []  # name, fullname, record

    def note(self, text: str) -> None:
        """Said once in the terminal summary: never warnings.warn, which `-W error` turns
        into an exception in whatever hook or test is running."""
        if text not in self.notes:
            self.notes.append(text)

    def start(self) -> None:
        try:
            from gpuenv.backend import open_backend
            from gpuenv.devices import select_gpus
            from gpuenv.judge import read_facts
            from gpuenv.telemetry import Sampler

            self.backend = backend = open_backend(readonly=True)
            self.gpus = select_gpus(backend, self.selector)
            self.facts = read_facts(backend, self.gpus)
            self.sampler = sampler = Sampler(backend, self.gpus)
            sampler.start()
        except Exception as err:  # telemetry must never break the test run
            self.error = str(err)
            self.note(
                f"no GPU telemetry ({err}); the benchmarks ran and were timed as "
                "without --gpuenv, with no verdicts"
            )
            self.stop()

    def stop(self) -> None:
        try:
            if self.sampler is not None:
                self.sampler.stop()
            if self.backend is not None:
                self.backend.close()
        except Exception as err:
            self.note(f"stopping telemetry failed: {err}")
        finally:
            self.sampler = self.backend = None

    def env_metadata(self) -> dict[str, Any]:
        """gpuenv's machine_info: environment metadata less what changes from run to run."""
        if self.metadata is None:
            self.metadata = {"error": self.error}
            if self.backend is not None:
                try:
                    self.metadata = _steady_metadata(self.backend, self.gpus)
                except Exception as err:
                    self.metadata = {"error": str(err)}
                    self.note(f"no GPU metadata for machine_info ({err})")
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
        self.note(f"--gpuenv-sync: not synchronizing ({why})")
        return None


def _steady_metadata(backend: Backend, gpus: list[int]) -> dict[str, Any]:
    from gpuenv.environment import environment_metadata
    from gpuenv.status import lock_info

    meta = steady(environment_metadata(backend, gpus))
    for gpu in meta.get("gpus", []):
        lock = lock_info(backend, gpu["index"])
        gpu["lock"] = {k: lock[k] for k in ("state", "sm_mhz", "mem_mhz")}
    return meta


# Values that change between two runs on the same machine: kept out of machine_info, which
# pytest-benchmark compares whole (the telemetry per benchmark says what they were).
VOLATILE = ("time_unix", "time_utc")
VOLATILE_GPU = ("sm_mhz", "mem_mhz", "temp_c", "power_w", "reasons")
# What, changed, makes two runs' numbers incomparable (pytest_benchmark_compare_machine_info)
COMPARED = ("name", "uuid", "lock", "power_limit_w", "app_sm_mhz", "app_mem_mhz")


def steady(meta: dict[str, Any]) -> dict[str, Any]:
    """environment_metadata less the volatile values (time, current clock, power, temp)."""
    out = {k: v for k, v in meta.items() if k not in VOLATILE}
    out["gpus"] = [
        {k: v for k, v in g.items() if k not in VOLATILE_GPU} for g in meta.get("gpus", [])
    ]
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
                was, is_ = _in_words(key, before.get(key)), _in_words(key, gpu.get(key))
                out.append(f"GPU {gpu.get('index')} {_LABELS[key]}: {was} -> {is_}")
    return out


_LABELS = {
    "name": "model",
    "uuid": "UUID",
    "lock": "clock lock",
    "power_limit_w": "power limit",
    "app_sm_mhz": "application SM clock",
    "app_mem_mhz": "application memory clock",
}


def _in_words(key: str, value: Any) -> str:
    """A machine_info value as the note says it: 'SM 1350 MHz', '700 W', 'none'."""
    if value is None:
        return "none"
    if key == "lock" and isinstance(value, dict):
        if value.get("state") != "locked":
            return str(value.get("state") or "none")
        parts = [
            f"{what} {_mhz_range(value[k])}"
            for what, k in (("SM", "sm_mhz"), ("memory", "mem_mhz"))
            if value.get(k)
        ]
        return " and ".join(parts) or "locked"
    if key == "power_limit_w" and isinstance(value, (int, float)):
        return f"{value:g} W"
    if key.endswith("_mhz") and isinstance(value, (int, float)):
        return f"{value:g} MHz"
    return str(value)


def _mhz_range(pair: Any) -> str:
    lo, hi = (pair, pair) if isinstance(pair, (int, float)) else pair
    return f"{lo} MHz" if lo == hi else f"{lo}-{hi} MHz"


def _state(config: pytest.Config) -> _State | None:
    return getattr(config, _STATE_KEY, None)


def _refuse_options_alone(config: pytest.Config) -> None:
    """--gpuenv-policy=reject or --gpuenv-gpu without --gpuenv would do nothing, silently: a
    gate asked to reject would pass everything. A usage error, as pytest's own options."""
    given = []
    policy = config.getoption("--gpuenv-policy", default="annotate")
    if policy != "annotate":
        given.append(f"--gpuenv-policy={policy}")
    selector = config.getoption("--gpuenv-gpu", default="all")
    if selector != "all":
        given.append(f"--gpuenv-gpu={selector}")
    if given:
        raise pytest.UsageError(
            f"{' and '.join(given)} without --gpuenv does nothing: no benchmark is sampled "
            "or judged. Add --gpuenv (GPU telemetry and a verdict for each pytest-benchmark "
            "benchmark), or drop the option"
        )


# before pytest-benchmark's (trylast) configure, which compares machine_info with a saved run
@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if not (
        config.getoption("--gpuenv", default=False)
        or config.getoption("--gpuenv-sync", default=False)
    ):
        _refuse_options_alone(config)
        return
    state = _State(config)
    setattr(config, _STATE_KEY, state)
    if not config.pluginmanager.hasplugin("benchmark"):
        state.note(
            "pytest-benchmark is not installed (pip install pytest-benchmark): "
            "there are no benchmarks to annotate"
        )
        return
    state.start()


def pytest_unconfigure(config: pytest.Config) -> None:
    state = _state(config)
    if state is not None:
        state.stop()
        setattr(config, _STATE_KEY, None)


class _Rounds:
    """Each timed round's end (on the sampler's clock) and duration, recorded when
    pytest-benchmark hands the duration to its stats: after the round's closing timer
    read, so nothing is added inside the round. Armed for one test at a time."""

    def __init__(self, now: Callable[[], float]):
        self.now = now
        self.ends: list[float] = []
        self.durations: list[float] = []
        self._owner: Any = None
        self._original: Any = None

    def arm(self) -> str | None:
        """Start recording; the reason it cannot, if pytest-benchmark moved ROUND_HOOK."""
        module, cls_name, attr = ROUND_HOOK
        owner = getattr(sys.modules.get(module), cls_name, None)
        original = getattr(owner, attr, None)
        if not callable(original):
            return (
                f"pytest-benchmark {_version()} has no {'.'.join(ROUND_HOOK)}: rounds "
                "judged as one region (the warm-up and calibration included)"
            )
        ends, durations, now = self.ends.append, self.durations.append, self.now

        def update(meta: Any, duration: float) -> Any:
            ends(now())
            durations(duration)
            return original(meta, duration)

        self._owner, self._original = owner, original
        setattr(owner, attr, update)
        return None

    def disarm(self) -> None:
        if self._owner is not None:
            setattr(self._owner, ROUND_HOOK[2], self._original)
            self._owner = None

    def spans(self) -> list[tuple[float, float]]:
        return [(end - d, end) for end, d in zip(self.ends, self.durations, strict=True)]


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pytest-benchmark")
    except PackageNotFoundError:
        return "?"


def _sync_timer(state: _State, fixture: Any) -> Callable[[], None]:
    """--gpuenv-sync: wait for the GPU before each timer read (inside the round, by design).
    Returns what puts the fixture's timer back."""
    sync = state.synchronizer()
    timer = getattr(fixture, TIMER_ATTR, None)
    if sync is None:
        return lambda: None
    if not callable(timer):
        state.note(
            f"--gpuenv-sync: pytest-benchmark {_version()} has no BenchmarkFixture."
            f"{TIMER_ATTR}: not synchronizing"
        )
        return lambda: None

    def synced() -> Any:
        sync()
        return timer()

    setattr(fixture, TIMER_ATTR, synced)
    return lambda: setattr(fixture, TIMER_ATTR, timer)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    state = _state(item.config)
    fixture = getattr(item, "funcargs", {}).get("benchmark") if state is not None else None
    if state is None or fixture is None or not hasattr(fixture, "extra_info"):
        return (yield)
    sampler = state.sampler
    unsync = _sync_timer(state, fixture)
    rounds = t0 = None
    try:
        if sampler is not None:
            rounds = _Rounds(sampler.clock.now)
            moved = rounds.arm()
            if moved:
                state.note(moved)
            t0 = sampler.mark()
    except Exception as err:
        state.note(f"telemetry failed at the start of {item.nodeid}: {err}")
        rounds = None
    try:
        result = yield
    finally:
        unsync()
        if rounds is not None:
            rounds.disarm()
    if sampler is None or rounds is None or t0 is None or getattr(fixture, "stats", None) is None:
        return result  # no telemetry, or the fixture timed nothing (--benchmark-disable)
    info = _judged(state, sampler, item, fixture, t0, rounds)
    if state.policy == "reject" and info.get("verdict") == "rejected":
        reasons = "; ".join(f["message"] for f in info.get("findings", []))
        pytest.fail(f"gpuenv rejected this benchmark: {reasons}", pytrace=False)
    return result


def _judged(
    state: _State,
    sampler: Sampler,
    item: pytest.Item,
    fixture: Any,
    t0: float,
    rounds: _Rounds,
) -> dict[str, Any]:
    """`_annotate`, kept in extra_info and for the summary; an error becomes the record."""
    try:
        info = _annotate(state, fixture, t0, sampler.mark(), rounds.spans(), rounds.durations)
    except Exception as err:  # a telemetry error is said, never raised into the test
        info = {"error": f"{type(err).__name__}: {err}"}
        state.note(f"{item.nodeid}: not judged ({info['error']})")
    fixture.extra_info["gpuenv"] = info
    state.judged.append((str(getattr(fixture, "name", item.name)), item.nodeid, info))
    return info


# Rounds judged one by one, each with its own telemetry window; a benchmark with more is
# judged in blocks of consecutive rounds (extra_info says how many rounds a block holds).
MAX_JUDGED_ROUNDS = 1000
# the share of a benchmark's time with GpuIdle set on every sampled GPU that makes it
# "no GPU work" (a sample period's rounding at either edge aside)
IDLE_SHARE = 0.99


def _annotate(
    state: _State,
    fixture: Any,
    t0: float,
    t1: float,
    spans: list[tuple[float, float]],
    durations: list[float],
) -> dict[str, Any]:
    """Telemetry, findings and verdict of one benchmark, as plain JSON values. `spans` and
    `durations` are its timed rounds (none: the benchmark is judged as one region)."""
    from gpuenv.judge import Evidence, judge

    sampler = state.sampler
    if sampler is None:
        raise RuntimeError("no sampler: telemetry did not start (the summary says why)")
    data = list(durations)
    whole = Evidence.sampled(sampler, [(t0, t1)], state.gpus)
    out: dict[str, Any] = {
        "gpus": state.gpus,
        "policy": state.policy,
        "telemetry": [w.to_dict() for w in whole.windows],
    }
    per = -(-len(spans) // MAX_JUDGED_ROUNDS)  # rounds per judged block (ceil)
    if per > 1:  # a window per round of a 10^5-round benchmark costs seconds: judge blocks
        data = [sum(data[i : i + per]) for i in range(0, len(spans), per)]
        spans = [
            (spans[i][0], spans[min(i + per, len(spans)) - 1][1]) for i in range(0, len(spans), per)
        ]
        out["rounds_per_block"] = per
    gpu_work = not whole.windows or not all(_idle_throughout(w) for w in whole.windows)
    # pytest-benchmark ran the rounds: "reject" can drop them, nothing can re-run them
    m = judge(
        str(getattr(fixture, "name", "benchmark")),
        data if spans else [t1 - t0],
        Evidence.sampled(sampler, spans, state.gpus) if spans else whole,
        facts=state.facts,
        policy="reject" if state.policy == "reject" else "annotate",
        raise_if_too_few=False,
        amend=lambda found: _in_pytest_words(found, gpu_work, per),
    )
    out["findings"] = [f.to_dict() for f in m.findings]
    out["verdict"] = m.verdict
    out["gpu_work"] = gpu_work
    out["rounds_sampled"] = len(durations) if spans else 0
    if state.policy == "reject" and m.rejected_reps:
        out["affected_blocks" if per > 1 else "affected_rounds"] = list(m.rejected_reps)
    out["summary"] = " | ".join(w.summary() for w in whole.windows)
    return out


def _idle_throughout(w: Window) -> bool:
    """GpuIdle in force over the whole window: the benchmark gave this GPU no work."""
    from gpuenv.reasons import Reason

    idle_s = sum(v for k, v in w.reason_sampled_s.items() if k == "GpuIdle")
    return (
        bool(w.reasons_start & w.reasons_end & Reason.GPU_IDLE)
        and w.duration_s > 0
        and idle_s >= IDLE_SHARE * w.duration_s
    )


WARMUP_ADVICE = (
    "warm up longer: --benchmark-warmup=on --benchmark-warmup-iterations=N (or "
    "@pytest.mark.benchmark(warmup=True, warmup_iterations=N)), or "
    "benchmark.pedantic(..., warmup_rounds=N)"
)


def _in_pytest_words(found: list[Any], gpu_work: bool, per: int) -> list[Any]:
    """The judge's findings as a pytest-benchmark user reads them: rounds, not reps; a
    benchmark that gave the GPU no work has no GPU warm-up (its slow first rounds are the
    CPU's: not gpuenv's to judge); a warm-up finding says whose warm-up it was (slow first
    rounds with no round starting cold: the code's, not the GPU's clock) and points to
    pytest-benchmark's options."""
    one, many = (
        ("round", "rounds") if per == 1 else (f"block of {per} rounds", f"blocks of {per} rounds")
    )
    out = []
    for f in found:
        if f.kind in ("warmup_ramp", "drift", "bimodal") and not gpu_work:
            continue  # the rounds' shape with the GPU idle is the CPU's: pytest-benchmark's
        text = f.message
        if f.kind == "warmup_ramp":  # gpuenv.bench's advice out; what the number shows kept
            text, _, advice = text.partition("; warm up longer")
            shown = advice[advice.find("; the number ") :] if "; the number " in advice else ""
            if not f.details.get("cold_start_reps", 1):
                text = text.split(": ", 1)[-1] + (
                    f" (no round started with GPU {f.gpu} idle or at a low clock: the code, "
                    "its caches or the CPU warming up, not the GPU's clock)"
                )
            text = f"{text}; {WARMUP_ADVICE}{shown}"
        text = re.sub(r"\breps\b", many, re.sub(r"\brep\b", one, text))
        out.append(dataclasses.replace(f, message=text))
    return out


@pytest.hookimpl(trylast=True)  # after pytest-benchmark's table
def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = _state(config)
    if state is not None:
        for line in summary_lines(state.judged, state.notes):
            terminalreporter.write_line(line)


def summary_lines(judged: list[tuple[str, str, dict[str, Any]]], notes: list[str]) -> list[str]:
    """The terminal section: gpuenv's notes, one line per flagged benchmark (name, verdict,
    findings in words), one line counting the rest. A single line when all are ok."""
    names = [name for name, _, _ in judged]
    flagged, counts = [], {"ok": 0, "no GPU work": 0}
    for name, fullname, info in judged:
        shown = fullname if names.count(name) > 1 else name
        verdict = info.get("verdict")
        if "error" in info:
            flagged.append(f"{shown}  not judged  {info['error']}")
        elif verdict == "ok" and not info.get("findings"):
            counts["ok" if info.get("gpu_work", True) else "no GPU work"] += 1
        else:
            said = "; ".join(f"{f['kind']}: {f['message']}" for f in info.get("findings", []))
            flagged.append(f"{shown}  {verdict}  {said}")
    parts = []
    if counts["ok"]:
        parts.append(f"{counts['ok']} benchmark{'s' * (counts['ok'] > 1)} ok")
    if counts["no GPU work"]:
        parts.append(
            f"{counts['no GPU work']} with no GPU work (every sampled GPU idle "
            "throughout: nothing for gpuenv to judge)"
        )
    if flagged:
        parts.append(f"{len(flagged)} flagged")
    tail = "gpuenv: " + (", ".join(parts) or "no benchmark judged")
    if not flagged and not notes:
        return [tail] if judged else []
    head = ["-" * 20 + " gpuenv: GPU verdicts of the benchmarks " + "-" * 20]
    return head + [f"gpuenv: {n}" for n in notes] + flagged + [tail]


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(
    config: pytest.Config, machine_info: dict[str, Any]
) -> None:
    state = _state(config)
    if state is not None:
        machine_info["gpuenv"] = state.env_metadata()


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_compare_machine_info(
    config: pytest.Config,
    benchmarksession: Any,
    machine_info: dict[str, Any],
    compared_benchmark: dict[str, Any],
) -> None:
    """Say which GPU, driver or lock change makes the saved run incomparable (pytest-benchmark
    itself warns that machine_info differs, with both dumps)."""
    state = _state(config)
    now = machine_info.get("gpuenv")
    saved = (compared_benchmark.get("machine_info") or {}).get("gpuenv")
    if state is None or not isinstance(now, dict) or not isinstance(saved, dict):
        return
    found = changes(saved, now)
    if found:
        state.note("the GPUs are not in the state of the saved run: " + "; ".join(found))
