"""The timing harness on the simulated H100, on virtual time (no torch, no GPU)."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from gpuenv import timing
from gpuenv.backend.sim import SimBackend
from gpuenv.errors import ConfigError
from gpuenv.results import load_run
from gpuenv.timebase import VirtualClock
from gpuenv.verdict import MeasurementRejected, VerdictConfig

MATMUL_S = 1.4e-3  # an 8192^3 bf16 matmul at 1980 MHz (docs/explanation/what-gpus-do.md)


@pytest.fixture
def sim() -> SimBackend:
    backend = SimBackend(clock=VirtualClock())
    backend.open_context(0)
    backend.idle(10.0)  # a cool GPU with a context: 1980 MHz, no reasons
    return backend


def heat(backend: SimBackend, seconds: float = 20.0) -> None:
    """Sustained heavy load right before the measurement (the 'hot' GPU)."""
    timing.sim_kernel(backend, 0, seconds=seconds)()


def noisy_kernel(backend: SimBackend, seconds: float, sigma: float, seed: int = 0):
    rng = random.Random(seed)
    cycles = seconds * backend.clock_limits(0).max_sm_mhz * 1e6
    return lambda: backend.run_work(0, cycles * rng.lognormvariate(0, sigma))


def gap(a: float, b: float) -> float:
    return abs(a - b) / ((a + b) / 2)


def test_bench_returns_a_measurement_with_telemetry_per_rep(sim):
    m = timing.bench(timing.sim_kernel(sim, 0, seconds=MATMUL_S), name="gemm", backend=sim)
    assert m.name == "gemm"
    assert m.timer == "sim"
    assert m.stats.median_s == pytest.approx(MATMUL_S, rel=1e-3)
    assert len(m.windows) == len(m.times_s) == m.stats.n
    assert all(w.gpu == 0 for w in m.windows)
    assert m.telemetry is not None and m.telemetry.sm_mhz_mean == pytest.approx(1980)
    assert m.verdict == "ok" and not m.findings
    x = m.extra
    assert x["stop_reason"] == "converged"
    lo, hi = x["ci_s"]
    assert lo <= m.stats.median_s <= hi
    assert m.stats.ci_s == (lo, hi)  # the headline CI, typed
    assert x["clock_mhz_before"] == pytest.approx(1980, rel=1e-3)  # the effective-clock probe
    assert x["summary"]["n"] == m.stats.n
    assert x["trace"]["sm_mhz"], "the telemetry trace for plotting is kept"


def test_the_harness_publishes_extra_and_never_reads_it_back():
    """bench keeps what a later step needs in its own record (harness._Learned): a key of
    Measurement.extra renamed for its readers cannot change what bench does."""
    import ast
    import inspect

    from gpuenv.timing import harness, stateprobe

    def on_extra(node: ast.AST | None) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr == "extra") or (
            isinstance(node, ast.Name) and node.id == "extra"
        )

    reads = []
    for module in (harness, stateprobe):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
                hit = on_extra(node.value)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                hit = on_extra(node.func.value) and node.func.attr != "update"
            elif isinstance(node, ast.Compare):
                hit = any(on_extra(c) for c in node.comparators)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)):
                hit = on_extra(node.value)  # an alias (x = self.extra) to read it through
            else:
                hit = False
            if hit:
                reads.append(f"{module.__name__}:{node.lineno}")
    assert reads == [], f"extra read back at {reads}"


def test_warmup_runs_until_setup_and_clock_ramp_are_over():
    sim = SimBackend(clock=VirtualClock())  # no context yet: the GPU idles at 345 MHz
    kernel = timing.sim_kernel(sim, 0, seconds=MATMUL_S)
    calls = []

    def first_call_slow():
        if not calls:
            sim.idle(0.15)  # library set-up on the first call (cuBLAS handles, lazy loading)
        calls.append(1)
        kernel()

    m = timing.bench(first_call_slow, backend=sim, budget_s=2)
    assert m.extra["warmup_steady"]
    assert m.extra["warmup_reps"] >= timing.WARMUP_WINDOW
    assert m.stats.max_s == pytest.approx(MATMUL_S, rel=1e-3)  # no set-up, no idle clock
    assert not [f for f in m.findings if f.kind == "warmup_ramp"]


def test_without_warmup_the_ramp_is_in_the_numbers_and_found():
    sim = SimBackend(clock=VirtualClock())
    m = timing.bench(
        timing.sim_kernel(sim, 0, seconds=MATMUL_S),
        backend=sim,
        warmup=0,
        budget_s=2,
        condition="none",
    )  # raw: the default (burst) waits for the ramp
    assert m.stats.max_s > 2 * MATMUL_S  # the first reps ran at the idle clock
    assert "warmup_ramp" in {f.kind for f in m.findings}
    assert m.verdict == "annotated"


def test_stopping_rule_takes_more_reps_when_noisy_and_stops_on_budget(sim):
    quiet = timing.bench(noisy_kernel(sim, MATMUL_S, 0.002), backend=sim, budget_s=30)
    noisy = timing.bench(noisy_kernel(sim, MATMUL_S, 0.05), backend=sim, budget_s=30)
    assert quiet.extra["stop_reason"] == noisy.extra["stop_reason"] == "converged"
    assert noisy.stats.n > 3 * quiet.stats.n
    assert noisy.extra["rel_ci"] <= 0.01
    short = timing.bench(noisy_kernel(sim, MATMUL_S, 0.2), backend=sim, budget_s=0.02)
    assert short.extra["stop_reason"] == "budget"
    weak = [f for f in short.findings if f.kind == "weak_ci"]
    assert [f.severity for f in weak] == ["info"] and "not within" in weak[0].message
    assert "can move that much" in weak[0].message  # how far, not that something moved it
    assert short.extra["summary"]["high_spread"]
    assert "spread" in {f.kind for f in short.findings}
    assert "warnings" not in short.extra  # one channel: the judge's findings


def test_fixed_rep_count(sim):
    m = timing.bench(timing.sim_kernel(sim, 0, seconds=MATMUL_S), backend=sim, reps=25)
    assert len(m.times_s) == 25
    assert m.extra["stop_reason"] == "max_reps"


def fresh_sim(hot: bool) -> SimBackend:
    """The two states of the reproducibility benchmark: 10 s idle, or right after 20 s load."""
    backend = SimBackend(clock=VirtualClock())
    backend.open_context(0)
    backend.idle(10.0)
    if hot:
        heat(backend)
    return backend


def cold_and_hot(**kwargs):
    out = []
    for hot in (False, True):
        backend = fresh_sim(hot)
        out.append(
            timing.bench(timing.sim_kernel(backend, 0, seconds=MATMUL_S), backend=backend, **kwargs)
        )
    return out


def test_hot_gpu_without_conditioning_is_slower():
    cold, hot = cold_and_hot(budget_s=1, condition="none")
    assert gap(cold.stats.median_s, hot.stats.median_s) > 0.10  # the 12-16% measured on an H100
    assert "power_cap" in {f.kind for f in hot.findings}


def test_burst_mode_gives_the_same_number_cold_and_hot():
    cold, hot = cold_and_hot(condition="burst", budget_s=2, min_reps=60)
    assert gap(cold.stats.median_s, hot.stats.median_s) < 0.01
    assert hot.extra["burst_first_ready"]
    assert hot.extra["burst_rests"] >= 2  # 60 reps of 1.4 ms do not fit one 25 ms burst
    assert cold.stats.median_s == pytest.approx(MATMUL_S, rel=0.01)


def test_sustained_mode_gives_the_same_number_cold_and_hot():
    cold, hot = cold_and_hot(condition="sustained", budget_s=1)
    assert cold.extra["precondition_steady"] and hot.extra["precondition_steady"]
    assert hot.extra["precondition_s"] < cold.extra["precondition_s"]  # already near equilibrium
    assert gap(cold.stats.median_s, hot.stats.median_s) < 0.01
    assert cold.stats.median_s > 1.2 * MATMUL_S  # the sustained, power-capped time
    assert "power_cap" in {f.kind for f in cold.findings}
    # no clock-normalised figure: a probe after a chunk does not see the chunk's clock
    assert "time_at_ref_clock_s" not in cold.extra
    # measured as preconditioned: each rep is SUSTAINED_REP_S of calls back to back, so the
    # GPU stays at the equilibrium it was brought to (single flushed calls would let it cool)
    assert cold.extra["sustained_rep_s"] == timing.SUSTAINED_REP_S
    assert all(w.duration_s >= 0.9 * timing.SUSTAINED_REP_S for w in cold.windows)


def test_a_budget_that_ends_before_min_reps_says_so_not_that_the_ci_missed(sim):
    # the simulator has no noise: the CI is 0, and what was short is the number of reps
    m = timing.bench(
        timing.sim_kernel(sim, 0, seconds=MATMUL_S),
        backend=sim,
        condition="sustained",
        budget_s=0.5,
        precondition_max_s=30,
    )
    assert m.extra["stop_reason"] == "budget" and len(m.times_s) < 10
    (weak,) = [f for f in m.findings if f.kind == "weak_ci"]
    assert weak.message.startswith(f"only {len(m.times_s)} reps")
    assert "not within" not in weak.message
    assert weak.severity == "info"  # a CI of 0: the number cannot move


def test_reject_policy_raises_when_every_rep_is_capped(sim):
    heat(sim)
    with pytest.raises(MeasurementRejected, match="power_cap"):
        timing.bench(
            timing.sim_kernel(sim, 0, seconds=MATMUL_S),
            backend=sim,
            policy="reject",
            verdict_config=VerdictConfig(stable_clocks=True),
            budget_s=1,
            condition="none",
        )  # measured hot as it is: every rep under the cap


def intruder_kernel(sim: SimBackend, start: int, stop: int):
    """A 20 ms kernel; another process uses the GPU from call `start` to call `stop`, its
    kernels time-sliced with ours: ours take 30% longer while it is there."""
    kernel = timing.sim_kernel(sim, 0, seconds=0.02, power_intensity=0.3)
    shared = timing.sim_kernel(sim, 0, seconds=0.026, power_intensity=0.3)
    count = [0]

    def run():
        count[0] += 1
        if count[0] == start:
            sim.set_background_load(0, 0.3, pid=4242)
        if count[0] == stop:
            sim.set_background_load(0, 0.0, pid=4242)
        (shared if start <= count[0] < stop else kernel)()

    return run


def test_reject_policy_drops_reps_touched_by_another_process(sim):
    m = timing.bench(intruder_kernel(sim, 20, 30), backend=sim, policy="reject", reps=40, warmup=10)
    assert "other_process" in {f.kind for f in m.findings}
    assert 5 <= len(m.rejected_reps) < 20
    assert m.stats.n == 40 - len(m.rejected_reps)


def test_retry_policy_reruns_affected_reps(sim):
    m = timing.bench(intruder_kernel(sim, 20, 30), backend=sim, policy="retry", reps=40, warmup=10)
    assert m.retried_reps
    assert not m.rejected_reps  # the re-runs, after the intruder left, were clean
    # 10 of 40 reps shared: the median held, so the tenant is info; the two levels its
    # slowed reps made (bimodal) are the warning that re-ran them, and once re-run no
    # warning is left, only the tenant's reps at the edges, which read as the others did
    assert [f.kind for f in m.findings if f.severity != "info"] == []
    tenant = [f for f in m.findings if f.kind == "other_process"]
    assert all("the number measured shows no effect" in f.message for f in tenant)
    assert len(m.retried_reps) >= 5


def test_cpu_function_without_telemetry():
    clock = VirtualClock()
    m = timing.bench(
        lambda: clock.sleep(0.002), device=timing.ClockDevice(clock), backend=None, budget_s=1
    )
    assert m.timer == "host"
    assert m.stats.median_s == pytest.approx(0.002)
    assert m.windows == () and m.verdict == "ok"


def test_output_appends_a_loadable_run(sim, tmp_path):
    from gpuenv.results import load_run

    path = tmp_path / "run.jsonl"
    timing.bench(timing.sim_kernel(sim, 0, seconds=MATMUL_S), name="a", backend=sim, output=path)
    run = load_run(path)
    assert [m.name for m in run.measurements] == ["a"]
    assert run.measurements[0].windows


@pytest.mark.parametrize(
    "kwargs, text",
    [
        ({"mode": "fast"}, "timing mode"),
        ({"condition": "warm"}, "condition"),
        ({"reps": 0}, "reps"),
        ({"policy": "ignore"}, "policy"),
    ],
)
def test_bad_arguments_are_refused(sim, kwargs, text):
    with pytest.raises(ConfigError, match=text):
        timing.bench(timing.sim_kernel(sim, 0), backend=sim, **kwargs)


def test_profiler_trace_is_split_into_reps_by_marker_spins():
    def ev(name, ts, dur, cat="kernel"):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    spin = "void at::cuda::(anonymous namespace)::spin_kernel(long)"
    events = [
        ev(spin, 0, 1),
        ev("fill_kernel", 2, 30),
        ev(spin, 33, 50),
        ev("gemm", 84, 100),
        ev("Memcpy DtoD", 190, 10, "gpu_memcpy"),
        ev(spin, 300, 1),
        ev("fill_kernel", 302, 30),
        ev(spin, 333, 50),
        ev("gemm", 384, 110),
    ]
    times, spins = timing._profiled_rep_times(events, 2)
    assert times == pytest.approx([110e-6, 110e-6])
    assert spins == pytest.approx([50e-6, 50e-6])
    with pytest.raises(Exception, match="marker"):
        timing._profiled_rep_times(events, 3)


def test_importing_timing_does_not_import_torch():
    code = "import sys, gpuenv.timing, gpuenv.stats; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


class TestSession:
    def test_env_bench_uses_the_session_and_stores_the_measurement(self, tmp_path):
        import gpuenv.session as session_mod

        sim = fresh_sim(hot=True)
        out = tmp_path / "run.jsonl"
        with session_mod.stable(backend=sim, mode="burst", output=str(out)) as env:
            m = env.bench(timing.sim_kernel(sim, 0, seconds=MATMUL_S), name="gemm", budget_s=2)
        assert m.extra["condition"] == "burst"
        assert m.stats.median_s == pytest.approx(MATMUL_S, rel=0.01)  # waited for the GPU
        assert m.extra["burst_first_wait_s"] > 0
        assert list(env.results) == [m]
        from gpuenv.results import load_run

        assert load_run(out).measurements[0].name == "gemm"

    def test_session_policy_applies(self):
        import gpuenv.session as session_mod

        sim = fresh_sim(hot=True)
        with session_mod.stable(backend=sim, mode="burst", policy="reject") as env:
            m = env.bench(intruder_kernel(sim, 20, 30), name="k", reps=40, warmup=10)
        assert m.policy == "reject" and m.rejected_reps


class _OneCallEvents(timing.SimDevice):
    """The simulated GPU timed as CUDA events time one call a rep (mode "events"); mode
    "auto" moves to its device time (CUPTI), as CudaEvents does where CUPTI can be had."""

    kind = "cuda_events"
    flush_l2 = True

    def for_auto(self, fn):
        device = _DeviceTime(self.backend, self.gpu)
        device.prepare(fn)
        return device, "device time (a stand-in for CUPTI)"


class _DeviceTime(timing.SimDevice):
    kind = "cuda_profiler"
    flush_l2 = True


class _CuptiHeld(_OneCallEvents):
    """Another profiler holds CUPTI: mode "auto" stays on the events, as CudaEvents does."""

    def for_auto(self, fn):
        return self, "CUDA events around each call: CUPTI is held by another profiler"


def test_a_tiny_call_timed_alone_between_events_says_what_its_number_holds(sim) -> None:
    k = timing.sim_kernel(sim, 0, seconds=6e-6, power_intensity=0.3)
    m = timing.bench(
        k, device=_OneCallEvents(sim, 0), backend=sim, mode="events", reps=40, probe_clock=False
    )
    f = [x for x in m.findings if x.kind == "tiny_kernel"]
    assert len(f) == 1 and f[0].severity == "info" and "launch and event overhead" in f[0].message
    assert m.verdict == "annotated"
    assert "use gpuenv.bench's default" in f[0].message
    # the default times its device time: nothing to say; nor for a call over 20 us
    m = timing.bench(k, device=_OneCallEvents(sim, 0), backend=sim, reps=40, probe_clock=False)
    assert "tiny_kernel" not in {x.kind for x in m.findings}
    assert m.extra["method"] == "device time (a stand-in for CUPTI)"
    assert m.extra["l2"] == "flushed before each call"
    # where another profiler holds CUPTI the default says so, and never advises itself
    m = timing.bench(k, device=_CuptiHeld(sim, 0), backend=sim, reps=40, probe_clock=False)
    (f,) = [x for x in m.findings if x.kind == "tiny_kernel"]
    assert "another profiler of this process holds" in f.message
    assert "use gpuenv.bench's default" not in f.message
    big = timing.sim_kernel(sim, 0, seconds=30e-6, power_intensity=0.3)
    m = timing.bench(
        big, device=_OneCallEvents(sim, 0), backend=sim, mode="events", reps=40, probe_clock=False
    )
    assert m.verdict == "ok", m.findings


def test_a_burst_measurement_whose_reps_split_in_two_says_so(sim) -> None:
    """condition="burst" and the default must agree, or say why: reps in two modes (a
    kernel that alternates between two code paths) get a bimodal warning naming both."""
    rng = random.Random(5)

    def two_modes() -> float:
        seconds = 35.5e-6 if rng.random() < 0.3 else 32e-6
        return float(sim.run_work(0, seconds * 1980e6, power_intensity=0.3))

    m = timing.bench(
        two_modes, backend=sim, condition="burst", mode="events", reps=60, probe_clock=False
    )
    f = [x for x in m.findings if x.kind == "bimodal"]
    assert len(f) == 1 and "32.00 us" in f[0].message and "35.50 us" in f[0].message
    assert m.verdict == "annotated"


def test_a_bench_under_cuda_visible_devices_samples_the_gpu_cuda_calls_device_0(
    monkeypatch, tmp_path
):
    # as on CUDA, where bench samples torch's current device's GPU found by UUID: one
    # process per GPU of a node (CUDA_VISIBLE_DEVICES=<its GPU>) measures its own GPU
    node = SimBackend(n_gpus=4, clock=VirtualClock())
    uuid = node.device_info(3).uuid
    for visible in ("3,1", uuid, uuid[:12]):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        out = tmp_path / f"{len(visible)}.jsonl"
        kernel = timing.sim_kernel(node, 3, seconds=MATMUL_S)
        m = timing.bench(kernel, name="gemm", backend=node, max_reps=20, output=out)
        assert m.gpus == (3,) and {w.gpu for w in m.windows} == {3}, visible
        assert [g["uuid"] for g in load_run(out).metadata["gpus"]] == [uuid]


def test_a_session_bench_under_cuda_visible_devices_samples_that_gpu_where_it_samples_it(
    monkeypatch,
):
    import gpuenv

    node = SimBackend(n_gpus=4, clock=VirtualClock())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    kernel = timing.sim_kernel(node, 3, seconds=MATMUL_S)
    with gpuenv.stable(backend=node) as env:  # every GPU sampled: CUDA's device 0's is 3
        assert env.bench(kernel, name="gemm", max_reps=20).gpus == (3,)
    with gpuenv.stable(backend=node, gpus=[1]) as env:  # GPU 3 not sampled: the session's
        assert env.bench(timing.sim_kernel(node, 1), name="gemm", max_reps=20).gpus == (1,)


@pytest.mark.parametrize("torch", ["missing", "no CUDA"])
def test_no_gpu_tells_a_python_caller_how_to_time_the_simulated_one(
    monkeypatch: pytest.MonkeyPatch, torch: str
) -> None:
    """gpuenv.bench(fn) from Python with no GPU (no torch, or a torch that sees no CUDA
    GPU): the hint names what a script can set (GPUENV_BACKEND=sim, or backend=), not only
    the command line's --sim; and what it names opens the simulated GPU."""
    import types

    import gpuenv

    cuda = types.SimpleNamespace(is_available=lambda: False)
    fake = None if torch == "missing" else types.SimpleNamespace(cuda=cuda)
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.delenv("GPUENV_BACKEND", raising=False)
    with pytest.raises(ConfigError) as err:
        gpuenv.bench(lambda: None)
    said = str(err.value)
    assert ("needs PyTorch" if torch == "missing" else "torch sees no CUDA GPU") in said
    assert "GPUENV_BACKEND=sim" in said and "backend=gpuenv.open_backend('sim')" in said
    sim = gpuenv.open_backend("sim")
    try:
        assert sim.capabilities.simulated and sim.workload is not None
    finally:
        sim.close()
