"""The do_bench drop-ins on the simulated GPU (virtual time): the budget, triton's return
semantics, grad_to_none, errors, do_bench_cudagraph. Times asserted are simulated."""

from __future__ import annotations

import itertools
import math
import statistics
from types import SimpleNamespace

import pytest

from gpuenv import timing
from gpuenv.errors import ConfigError
from gpuenv.integrations import triton as gtriton
from gpuenv.integrations.triton.bench import DROPIN_BURST_S
from gpuenv.telemetry import DRIVER_REFRESH_S
from gpuenv.timing.devices import REP_PROBE_CYCLES

MAX_SM_HZ = 1980e6
MEM_HZ = 2619e6
H100_L2_BYTES = 50 << 20  # the simulated H100's L2 (the drop-in flushes twice it)
H100_BYTES_PER_MEM_CYCLE = 5120 / 8 * 2  # its 5120-bit bus, double data rate


def rep_cost_s(fn_s: float, flush_bytes: int = 2 * H100_L2_BYTES) -> float:
    """What one simulated H100 rep costs: flush + host overhead + clock probe + fn."""
    flush_s = flush_bytes / H100_BYTES_PER_MEM_CYCLE / MEM_HZ
    return flush_s + gtriton.SIM_REP_OVERHEAD_S + REP_PROBE_CYCLES / MAX_SM_HZ + fn_s


def light(sim, seconds: float):
    """A kernel too light to meet the power cap: the clock stays at its maximum."""
    return timing.sim_kernel(sim, 0, seconds=seconds, power_intensity=0.2)


def varying(sim, seconds: list[float]):
    """A kernel whose calls take `seconds` in turn (at the max clock)."""
    cycle = itertools.cycle(seconds)

    def kernel() -> float:
        return float(sim.run_work(0, next(cycle) * MAX_SM_HZ, power_intensity=0.2))

    return kernel


def triton_quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics, as triton's _quantile."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


class TestBudget:
    @pytest.mark.parametrize("fn_s", [5e-6, 20e-6, 100e-6, 1e-3, 5e-3])
    def test_reps_times_flush_plus_fn_fill_the_budget(self, gpu, fn_s):
        t0 = gpu.clock.now()
        times = gtriton.do_bench(light(gpu, fn_s), backend=gpu, return_mode="all")
        elapsed = gpu.clock.now() - t0
        m = gtriton.last_measurement()
        plan, cost = m.extra["dropin"], rep_cost_s(fn_s)
        assert plan["rep_cost_s"] == pytest.approx(cost, rel=1e-3)  # flush and overhead in it
        assert len(times) == len(m.times_s) == plan["reps"]
        assert len(times) * cost <= 0.100 < (len(times) + 1) * cost  # fits, and fills
        # the reps fill the budget inside bursts; a kernel whose power no reading has shown
        # yet may rest as a heavy one until one has (conditioning.burst.UNSEEN_POWER_FRAC)
        assert m.extra["in_bursts_s"] <= 0.100 + cost
        assert m.extra["measure_s"] <= 0.100 + cost + m.extra["burst_rest_s"]
        assert m.extra["burst_power_seen"] or m.extra["burst_rests"] == 0
        # warmup until steady (8 reps of a steady kernel), at most 25 ms worth
        assert plan["warmup_max_reps"] == max(1, int(0.025 / cost))
        assert m.extra["warmup_reps"] == min(timing.WARMUP_WINDOW, plan["warmup_max_reps"])
        assert m.extra["warmup_s"] <= 0.025 + cost
        # first call and estimate (<= 5 reps), warmup, reps; a cool GPU is not waited for
        assert m.extra["burst_first_wait_s"] == 0.0
        assert m.extra["burst_rest_s"] <= DRIVER_REFRESH_S + 2 * DROPIN_BURST_S
        assert elapsed <= 0.125 + 6 * cost + 1e-3 + m.extra["burst_rest_s"]
        assert statistics.mean(times) == pytest.approx(fn_s * 1e3, rel=1e-3)

    def test_the_budgets_are_what_the_caller_gives(self, gpu):
        k = light(gpu, 50e-6)
        gtriton.do_bench(k, warmup=5, rep=10, backend=gpu)
        small = gtriton.last_measurement()
        gtriton.do_bench(k, warmup=50, rep=300, backend=gpu)
        big = gtriton.last_measurement()
        cost = rep_cost_s(50e-6)
        assert small.extra["dropin"]["reps"] == int(0.010 / cost)
        assert big.extra["dropin"]["reps"] == int(0.300 / cost)
        assert big.extra["dropin"]["warmup_max_reps"] == int(0.050 / cost)

    def test_triton_flush_size_costs_reps(self, gpu):
        k = light(gpu, 5e-6)
        gtriton.do_bench(k, backend=gpu)
        ours = gtriton.last_measurement()
        gtriton.do_bench(k, backend=gpu, flush_bytes=gtriton.TRITON_FLUSH_BYTES)
        theirs = gtriton.last_measurement()
        assert ours.extra["flush_bytes"] == 100 * 2**20
        assert theirs.extra["flush_bytes"] == 256 * 2**20
        cost = rep_cost_s(5e-6, gtriton.TRITON_FLUSH_BYTES)
        assert theirs.extra["dropin"]["reps"] == int(0.100 / cost) < ours.extra["dropin"]["reps"]
        gtriton.do_bench(k, backend=gpu, flush_bytes=0)
        assert gtriton.last_measurement().extra["flush_l2"] is False

    def test_the_rep_budget_is_a_hard_limit(self, gpu):
        calls = itertools.count()

        def slows_down() -> float:  # 10 us while the counts are chosen, then 40 us
            seconds = 10e-6 if next(calls) < 300 else 40e-6
            return float(gpu.run_work(0, seconds * MAX_SM_HZ, power_intensity=0.2))

        gtriton.do_bench(slows_down, backend=gpu)
        m = gtriton.last_measurement()
        assert m.extra["stop_reason"] == "budget"
        assert len(m.times_s) < m.extra["dropin"]["reps"]
        assert m.extra["measure_s"] <= 0.100 + rep_cost_s(40e-6)

    def test_a_warmup_that_never_settles_stops_at_its_budget(self, gpu):
        calls = itertools.count()

        def drifts() -> float:  # each call 0.5% longer than the one before
            seconds = 20e-6 * 1.005 ** next(calls)
            return float(gpu.run_work(0, seconds * MAX_SM_HZ, power_intensity=0.2))

        gtriton.do_bench(drifts, warmup=10, backend=gpu)
        m = gtriton.last_measurement()
        assert m.extra["warmup_steady"] is False
        assert m.extra["warmup_reps"] <= m.extra["dropin"]["warmup_max_reps"]
        assert m.extra["warmup_s"] <= 0.010 + rep_cost_s(40e-6)

    def test_rep_zero_is_refused_with_a_sentence(self, gpu):
        # triton measures one rep for rep=0 (its max(1, ...)); a budget of nothing is no
        # request a person means, and one rep is no measurement: refused (issue 31)
        with pytest.raises(ConfigError, match=r"^rep must be a finite number of milliseconds > 0"):
            gtriton.do_bench(light(gpu, 1e-3), rep=0, backend=gpu, return_mode="all")
        assert (
            len(gtriton.do_bench(light(gpu, 1e-3), rep=1e-3, backend=gpu, return_mode="all")) == 1
        )

    def test_a_hot_gpu_is_waited_for_then_measured_in_one_burst(self, gpu):
        timing.sim_kernel(gpu, 0, seconds=5.0)()  # heavy load: the power cap engages
        t0 = gpu.clock.now()
        gtriton.do_bench(light(gpu, 20e-6), backend=gpu)
        m = gtriton.last_measurement()
        assert m.extra["condition"] == "burst" and m.extra["burst_first_ready"]
        assert 0.0 < m.extra["burst_first_wait_s"] <= gtriton.WAIT_MAX_S
        assert m.extra["burst_rests"] == 0 and m.verdict == "ok"
        assert gpu.clock.now() - t0 < m.extra["burst_first_wait_s"] + 0.2

    def test_condition_none_measures_the_capped_gpu_as_it_is(self, gpu):
        timing.sim_kernel(gpu, 0, seconds=5.0)()
        gtriton.do_bench(light(gpu, 20e-6), backend=gpu, condition="none", name="mm")
        m = gtriton.last_measurement()
        assert m.name == "mm" and m.extra["condition"] == "none"
        assert "burst_first_wait_s" not in m.extra
        assert "power_cap" in {f.kind for f in m.findings}
        assert len(m.windows) == len(m.times_s) and m.telemetry is not None
        assert gtriton.measurements()[-1] is m


class TestReturnSemantics:
    DURATIONS = (10e-6, 30e-6, 20e-6, 50e-6, 40e-6)

    def test_every_mode_summarizes_every_measured_rep(self, gpu):
        k = varying(gpu, list(self.DURATIONS))
        times = gtriton.do_bench(k, backend=gpu, return_mode="all")
        m = gtriton.last_measurement()
        assert isinstance(times, list) and times == [t * 1e3 for t in m.times_s]
        assert len({round(t, 4) for t in times}) == len(self.DURATIONS)  # each one among them
        for mode, expect in [
            ("min", min),
            ("max", max),
            ("mean", statistics.mean),
            ("median", statistics.median),
        ]:
            value = gtriton.do_bench(k, backend=gpu, return_mode=mode)
            assert isinstance(value, float)
            got = [t * 1e3 for t in gtriton.last_measurement().times_s]
            assert value == pytest.approx(expect(got), rel=1e-12)

    def test_quantiles_over_all_measured_reps(self, gpu):
        k = varying(gpu, list(self.DURATIONS))
        qs = gtriton.do_bench(k, quantiles=[0.5, 0.2, 0.8], backend=gpu, return_mode="min")
        got = [t * 1e3 for t in gtriton.last_measurement().times_s]
        assert isinstance(qs, list) and len(qs) == 3  # return_mode is ignored, as in triton
        assert qs == pytest.approx([triton_quantile(got, q) for q in (0.5, 0.2, 0.8)])
        one = gtriton.do_bench(k, quantiles=(0.9,), backend=gpu)
        assert isinstance(one, float)
        assert gtriton.do_bench(k, quantiles=[], backend=gpu) == []

    def test_grad_to_none_is_cleared_only_before_measured_reps(self, gpu):
        x = SimpleNamespace(grad=1.0)
        k = light(gpu, 20e-6)
        seen = []

        def fn():
            seen.append(x.grad)
            x.grad = 5.0  # a backward pass accumulating into .grad
            k()

        gtriton.do_bench(fn, grad_to_none=[x], backend=gpu, rep=10)
        n = len(gtriton.last_measurement().times_s)
        assert seen[-n:] == [None] * n  # cleared before every measured rep
        warm = seen[:-n]  # the first call, the estimate and the warmup kept theirs
        assert warm[0] == 1.0 and set(warm[1:]) == {5.0}
        assert len(warm) > gtriton.last_measurement().extra["warmup_reps"]


def test_mode_auto_takes_bench_device_time_method_and_keeps_the_drop_in(gpu):
    x, k, seen = SimpleNamespace(grad=1.0), light(gpu, 5e-6), []

    def fn():
        seen.append(x.grad)
        x.grad = 5.0
        k()

    ms = gtriton.do_bench(fn, backend=gpu, mode="auto", grad_to_none=[x])
    m = gtriton.last_measurement()
    assert m.extra["method"] == "the simulated GPU's time of each call"
    assert m.extra["calls_per_rep"] == 1 and "dropin" in m.extra
    assert ms == pytest.approx(5e-3, rel=1e-3)  # per call
    assert seen[-len(m.times_s) :] == [None] * len(m.times_s)  # grad_to_none before each


class TestErrors:
    @pytest.mark.parametrize(
        "kwargs",
        [
            {"return_mode": "p99"},
            {"quantiles": [0.5, 1.5]},
            {"quantiles": [-0.1]},
            {"warmup": -1},
            {"rep": math.nan},
            {"rep": math.inf},
            {"mode": "nvtx"},
            {"flush_bytes": -1},
        ],
    )
    def test_bad_arguments_raise_value_error_before_any_work(self, gpu, kwargs):
        calls = []
        with pytest.raises(ValueError) as err:
            gtriton.do_bench(lambda: calls.append(1), backend=gpu, **kwargs)
        assert isinstance(err.value, ConfigError) and calls == []

    def test_cudagraph_refuses_the_same(self, gpu):
        with pytest.raises(ValueError, match="return_mode"):
            gtriton.do_bench_cudagraph(light(gpu, 1e-5), backend=gpu, return_mode="p99")
        with pytest.raises(ValueError, match="quantiles"):
            gtriton.do_bench_cudagraph(light(gpu, 1e-5), backend=gpu, quantiles=[2])


class TestCudaGraph:
    @pytest.mark.parametrize("fn_s", [5e-6, 100e-6, 2e-3])
    def test_rep_ms_of_calls_per_replay_ten_replays(self, gpu, fn_s):
        t0 = gpu.clock.now()
        mean = gtriton.do_bench_cudagraph(light(gpu, fn_s), backend=gpu)
        elapsed = gpu.clock.now() - t0
        m = gtriton.last_measurement()
        plan = m.extra["dropin"]
        assert plan["calls_per_replay"] == m.extra["calls_per_rep"]
        assert abs(plan["calls_per_replay"] - 0.020 / fn_s) <= 1
        assert len(m.times_s) == gtriton.CUDAGRAPH_REPLAYS and m.timer == "sim"
        assert m.extra["flush_l2"] is False  # no flush, as triton's
        assert mean == pytest.approx(fn_s * 1e3, rel=1e-3)  # time per call
        # ten replays of ~20 ms, plus the warmup call and the estimate
        assert 10 * 0.020 * 0.9 < elapsed < 10 * 0.020 + 6 * fn_s + 10 * 1e-4 + 1e-3

    def test_return_semantics_over_the_replays(self, gpu):
        k = varying(gpu, [10e-6, 20e-6])
        values = gtriton.do_bench_cudagraph(k, backend=gpu, return_mode="all")
        assert isinstance(values, list) and len(values) == 10
        qs = gtriton.do_bench_cudagraph(k, backend=gpu, quantiles=[0.5, 0.1])
        got = [t * 1e3 for t in gtriton.last_measurement().times_s]
        assert qs == pytest.approx([triton_quantile(got, q) for q in (0.5, 0.1)])

    def test_grad_to_none_leaves_are_reset_before_the_capture(self, gpu):
        log: list[str] = []

        class Leaf:
            grad: object = 1.0

            def detach_(self):
                log.append("detach_")

            def requires_grad_(self, flag):
                log.append(f"requires_grad_({flag})")

        x, k = Leaf(), light(gpu, 1e-3)
        seen = []

        def fn():
            seen.append(x.grad)
            x.grad = 5.0
            k()

        gtriton.do_bench_cudagraph(fn, grad_to_none=[x], backend=gpu, rep=5)
        assert log == ["detach_", "requires_grad_(True)"]
        replayed = 10 * gtriton.last_measurement().extra["calls_per_rep"]
        assert seen[-replayed:] == [None] * replayed and seen[0] == 1.0
