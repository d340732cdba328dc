"""gpuenv.rank on the simulated GPU: one choice whatever the GPU's state, never a slower
config, ties declared, and candidates far behind stopped early."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable

import pytest

import gpuenv
from gpuenv import stats, timing
from gpuenv.backend.sim import SimBackend
from gpuenv.errors import ConfigError
from gpuenv.integrations import triton as gtriton
from gpuenv.timing.decision import decision_lines, decision_record
from gpuenv.timing.rank import WAIT_SAID_S, Ranking
from gpuenv.units import fmt_s


@pytest.fixture
def gpu(sim: SimBackend) -> SimBackend:
    sim.open_context(0)
    sim.idle(10.0)
    return sim


def kernel(sim: SimBackend, ms: float, seed: int, noise: float = 0.002) -> Callable[[], float]:
    """A heavy kernel of `ms` at the max clock, each call `noise` (a fraction) long or short."""
    rng = random.Random(seed)
    cycles = ms * 1e-3 * sim.clock_limits(0).max_sm_mhz * 1e6

    def k() -> float:
        return float(sim.run_work(0, cycles * (1 + rng.gauss(0, noise)), power_intensity=1.0))

    return k


def four(sim: SimBackend, seed: int) -> dict[str, Callable[[], float]]:
    """Two within 0.3% (a tie), one 3% slower, one 10% slower; the tie's slower one first."""
    return {
        "near": kernel(sim, 0.2006, seed),
        "best": kernel(sim, 0.2000, seed + 1),
        "slow3": kernel(sim, 0.2060, seed + 2),
        "slow10": kernel(sim, 0.2200, seed + 3),
    }


def heat(sim: SimBackend) -> None:
    timing.sim_kernel(sim, 0, seconds=7.0)()  # 7 s of heavy load: the power cap holds


@pytest.mark.parametrize("hot", [False, True], ids=["rested", "hot"])
def test_four_candidates_one_choice_every_time_never_a_slower_one(gpu, hot):
    choices, ties = set(), set()
    for i in range(10):
        gpu.idle(10.0)
        if hot:
            heat(gpu)
        r = gpuenv.rank(four(gpu, 10 * i), backend=gpu)
        choices.add(r.winner)
        ties.add(r.tied)
        assert r.winner in ("near", "best") and r.fastest in ("near", "best")
        assert r["slow3"].outcome in ("slower", "far") and r["slow10"].outcome == "far"
        assert r["slow10"].rounds == 1  # 10% behind: stopped after one round
        assert r["slow3"].margin == pytest.approx(1.03, abs=0.005)
        assert r.state.condition == "burst" and not r.budget_ended
    assert choices == {"near"} and ties == {("near", "best")}  # the tie, broken by order
    times = r.times_s  # for a tuner that keeps the least: it keeps the winner
    assert min(times, key=times.__getitem__) == "near" and times["slow10"] == r["slow10"].median_s
    assert times["best"] > times["near"] > r["best"].median_s


def test_without_a_tie_the_fastest_wins_and_the_margins_say_by_how_much(gpu):
    cands = four(gpu, 1)
    del cands["near"]
    r = gpuenv.rank(cands, backend=gpu)
    assert r.winner == r.fastest == "best" and r.tied == ("best",) and not r.is_tie
    assert r["best"].outcome == "winner" and r["best"].margin == 1.0
    lo, hi = r["slow3"].margin_ci
    assert 1.0 < lo <= r["slow3"].margin <= hi
    assert [c.name for c in r.candidates] == ["best", "slow3", "slow10"]  # the order given
    assert all(m.name == c.name for c in r.candidates for m in c.measurements)


def test_the_cap_coming_on_during_tuning_fools_plain_timing_not_rank(gpu):
    # the best config timed last: timed one after the other as triton does, the configs
    # before it bring the power cap on, and it reads slower than it is
    cands = {
        "c1": kernel(gpu, 0.204, 1, noise=0),
        "c2": kernel(gpu, 0.206, 2, noise=0),
        "c3": kernel(gpu, 0.202, 3, noise=0),
        "best": kernel(gpu, 0.200, 4, noise=0),
    }
    plain = {n: gtriton.do_bench(k, backend=gpu, condition="none") for n, k in cands.items()}
    assert min(plain, key=plain.__getitem__) != "best"
    gpu.idle(10.0)
    r = gpuenv.rank(cands, backend=gpu)
    assert r.winner == "best" and r.tied == ("best",)


def test_str_and_record(gpu):
    r = gpuenv.rank(four(gpu, 3), backend=gpu)
    text = str(r)
    assert text.startswith("rank: near (") and "tied with best (within 0.5%)" in text
    assert "slow10" in text and "far, 1 round" in text and "state: GPU 0, condition burst" in text
    record = json.loads(json.dumps(r.to_dict()))
    assert record["winner"] == "near" and record["tied"] == ["near", "best"]
    assert [c["name"] for c in record["candidates"]] == ["near", "best", "slow3", "slow10"]
    assert record["state"]["condition"] == "burst"


def test_one_candidate_is_timed_once_and_wins(gpu):
    r = gpuenv.rank({"only": kernel(gpu, 0.1, 0)}, backend=gpu)
    assert r.winner == "only" and r.rounds == 1 and r["only"].rounds == 1


def test_the_budget_ends_an_undecided_race(gpu):
    # two identical but for noise: never inside 1 +- 0.1%, so only the budget stops it
    cands = {"x": kernel(gpu, 0.2, 1, noise=0.01), "y": kernel(gpu, 0.2, 2, noise=0.01)}
    r = gpuenv.rank(cands, backend=gpu, tolerance=0.0005, max_rounds=8)
    assert r.budget_ended and r.rounds == 8 and r.winner == "x" and r.tied == ("x", "y")
    assert "the budget ended" in str(r)


@pytest.mark.parametrize(
    ("cands", "kwargs", "match"),
    [
        ([lambda: 1], {}, r"candidates must be a dict of names to functions"),
        ({}, {}, r"candidates is empty"),
        ({"": lambda: 1}, {}, r"named by non-empty strings"),
        ({"a": 3}, {}, r"candidates\['a'\] must be a function"),
        ({"a": lambda x: x}, {}, r"needs arguments \(x\)"),
        ({"a": lambda: 1}, {"tolerance": -0.1}, r"^tolerance must be"),
        ({"a": lambda: 1}, {"max_rounds": 3}, r"^max_rounds must be"),
        ({"a": lambda: 1}, {"colour": "red"}, r"unknown settings: colour"),
    ],
)
def test_bad_input_is_refused_at_the_door(gpu, cands, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        gpuenv.rank(cands, backend=gpu, **kwargs)


def test_ranking_is_exported_lazily():
    assert gpuenv.Ranking is Ranking and "rank" in gpuenv.__all__


def test_an_autotune_decision_is_on_gpuenv_runs_table_and_in_its_results(gpu, tmp_path):
    from gpuenv.results import ResultStore, load_run
    from gpuenv.run.region import MAX_META, meta_line
    from gpuenv.run.report import RUN_NAME, build_measurements, summary_table
    from gpuenv.run.tracker import Region
    from gpuenv.timing.decision import decision_record

    long = "BLOCK_SIZE_M=128 BLOCK_SIZE_N=256 BLOCK_SIZE_K=64 GROUP_SIZE_M=8 num_warps=8 "
    cands = {f"{long}num_stages={i}": kernel(gpu, 0.2 + 0.01 * i, i) for i in range(8)}
    r = gpuenv.rank(cands, backend=gpu)
    record = decision_record("matmul_kernel", ["M=4096", "N=4096", "K=4096"], r)
    facts = {"kind": "autotune", "site": "autotune matmul_kernel mm.py:40", "autotune": record}
    line = meta_line(1, 7, facts)  # what the child sends: every fact fits in one write
    assert line and len(line) <= MAX_META + 20 and json.loads(line.split(" ", 3)[3]) == facts

    run = Region(RUN_NAME, 1, 0.0, 10.0)
    call = Region("matmul_kernel autotune M=4096 N=4096 K=4096", 1, 1.0, 2.0, meta=facts)
    ms = build_measurements(
        [call], run, gpus=[0], facts={}, policy="annotate", stable_clocks=False, wall_at=float
    )
    text = summary_table(ms, header="gpuenv run: python mm.py")
    assert (
        f"autotune matmul_kernel M=4096 N=4096 K=4096: {long}num_stages=0 chosen by gpuenv.rank"
        in text
    )
    assert "x1.0000  winner" in text and "far, 1 round" in text and "state: GPU 0" in text
    out = tmp_path / "run.jsonl"
    with ResultStore(out, {}) as store:
        for m in ms:
            store.append(m)
    kept = load_run(out).measurements[1].extra["autotune"]
    assert kept["configs"][kept["winner"]][0] == f"{long}num_stages=0"
    assert [c[3] for c in kept["configs"]][:2] == ["winner", "far"]


def test_an_autotune_record_reads_back_and_a_damaged_one_reads_as_none(gpu):
    from gpuenv.timing.decision import Decision, decision_lines, decision_record

    r = gpuenv.rank({"a": kernel(gpu, 0.2, 0), "b": kernel(gpu, 0.26, 1)}, backend=gpu)
    record = decision_record("k", ["M=8"], r)
    decision = Decision.read(json.loads(json.dumps(record)))  # as a results file holds it
    assert decision is not None and decision.to_extra() == record
    assert (
        decision.lines() == decision_lines(record)
        and "a chosen by gpuenv.rank" in decision.lines()[0]
    )
    for bad in (None, [], {**record, "winner": 7}, {**record, "configs": [["a", "x", 1, "w", 1]]}):
        assert Decision.read(bad) is None and decision_lines(bad) == []
    # how the calls timed is on the record; a record from before it was kept still reads
    assert record["method"] == r.method and f"  timed: {r.method}" in decision.lines()
    for rounds, said in ((1, "(1 round, "), (3, "(3 rounds, ")):
        again = Decision.read({**record, "rounds": rounds})
        assert again is not None and said in again.lines()[0]
    older = {k: v for k, v in record.items() if k != "method"}
    again = Decision.read(older)
    assert (
        again is not None and again.method == "" and not any("timed:" in x for x in again.lines())
    )


def test_configs_under_1pct_apart_are_set_apart_without_running_out_the_budget(gpu):
    # an H200's grouped orderings of one matmul config: 0.8% apart; waiting for the ratio's
    # interval to clear the whole 0.5% band took 5x plain triton's tuning there (here, with
    # each call 1% long or short, 20-28 rounds in 2 of 5 rankings; now at most 9)
    for i in range(5):
        gpu.idle(10.0)
        r = gpuenv.rank(
            {
                "g4": kernel(gpu, 0.2016, 7 * i, noise=0.01),
                "g8": kernel(gpu, 0.2016, 7 * i + 1, noise=0.01),
                "g16": kernel(gpu, 0.2000, 7 * i + 2, noise=0.01),
            },
            backend=gpu,
        )
        assert r.winner == "g16" and r.tied == ("g16",) and not r.budget_ended
        assert r["g4"].outcome == r["g8"].outcome == "slower"
        assert r.rounds <= 10, r.rounds


def test_a_long_ranking_rests_between_calls_and_never_brings_the_cap_on(gpu):
    # 30 rounds of two heavy candidates back to back would be 0.6 s of unbroken work: the
    # cap comes on within ~0.2 s, and each call after would wait for it to clear. Rested
    # between calls by the duty rule, every call begins at once on an uncapped GPU
    cands = {"x": kernel(gpu, 0.2, 1, noise=0.01), "y": kernel(gpu, 0.2, 2, noise=0.01)}
    r = gpuenv.rank(cands, backend=gpu, tolerance=0.0005, max_rounds=30)
    calls = [m for c in r.candidates for m in c.measurements]
    assert r.rounds == 30 and len(calls) == 60
    assert all(m.first_burst.wait_s == 0 and m.first_burst.ready for m in calls)
    assert "power_cap" not in r.state.findings
    assert r.state.sm_mhz == (gpu.clock_limits(0).max_sm_mhz,) * 2


def test_a_candidates_later_calls_warm_up_with_one_call_unless_a_warmup_is_asked_for(gpu):
    cands = {"a": kernel(gpu, 0.2, 1), "b": kernel(gpu, 0.201, 2)}
    r = gpuenv.rank(cands, backend=gpu)
    for c in r.candidates:
        first, *later = c.measurements
        assert first.warmup.reps > 1 and later and all(m.warmup.reps == 1 for m in later)
    r = gpuenv.rank(cands, backend=gpu, warmup=3)
    assert {m.warmup.reps for c in r.candidates for m in c.measurements} == {3}


def test_the_race_ends_once_the_winner_cannot_change(gpu):
    """The first candidate in the order given leads, and one 0.3% behind it is undecided
    for a long time (inside the 0.5% band needs its interval within +-0.5%; slower, above
    +0.25%): neither matters to the choice once no candidate can be faster than the first
    by more than the band. The race ends there, with the same winner."""
    for i in range(3):
        gpu.idle(10.0)
        cands = {
            "first": kernel(gpu, 0.2000, 11 * i, noise=0.004),
            "edge": kernel(gpu, 0.2006, 11 * i + 1, noise=0.004),
        }
        r = gpuenv.rank(cands, backend=gpu)
        assert r.winner == "first" and not r.budget_ended
        assert r.rounds <= 10, r.rounds
        lo, _ = r["edge"].margin_ci
        assert lo >= 1 / 1.005  # not faster than the winner by more than the band


# -- a tuner opens ahead: the sampler process starts while the candidates compile -------


def test_opening_ahead_leaves_the_first_call_a_running_sampler_process(tmp_path, monkeypatch):
    from gpuenv.telemetry import process
    from gpuenv.timebase import RealClock
    from gpuenv.timing.rank import prepare

    monkeypatch.setenv("GPUENV_SAMPLER", "process")  # as a real GPU is read
    process.close_idle()  # an earlier test's, lingering in this worker, is not this one's
    sim = SimBackend("h100", state_file=tmp_path / "sim.json", clock=RealClock())
    sim.open_context(0)
    try:
        opened = prepare(backend=sim, tolerance=0.01, budget_s=1.0)  # rank's own: ignored
        opened()
        procs = list(process._pool.values())
        assert len(procs) == 1 and procs[0].users == 0 and procs[0].attaches == 1
        r = gpuenv.rank({"a": kernel(sim, 0.05, 1), "b": kernel(sim, 0.06, 2)}, backend=sim)
        assert list(process._pool.values()) == procs  # the calls attached to it
        assert procs[0].attaches == sum(c.rounds for c in r.candidates) + 1
    finally:
        sim.close()
        process.close_idle()


def test_opening_ahead_with_no_cuda_context_opens_the_processs_own_gpu(tmp_path, monkeypatch):
    """A switch may open ahead before its process has a CUDA context (Inductor's, as its
    module loads): none is made, and the GPU is the process's own, LOCAL_RANK's (a torchrun
    rank's) where set, not the node's first."""
    from gpuenv.telemetry import process
    from gpuenv.timebase import RealClock
    from gpuenv.timing.rank import prepare

    monkeypatch.setenv("GPUENV_SAMPLER", "process")
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    sim = SimBackend("h100", n_gpus=4, state_file=tmp_path / "sim.json", clock=RealClock())
    try:
        prepare(backend=sim)()
        assert [p.gpus for p in process._pool.values()] == [[2]]
        assert "torch" not in sys.modules or not sys.modules["torch"].cuda.is_initialized()
    finally:
        sim.close()
        process.close_idle()


def test_opening_ahead_has_nothing_to_do_on_virtual_time_and_refuses_bad_settings(gpu):
    import threading

    from gpuenv.timing.rank import prepare

    before = threading.active_count()
    opened = prepare(backend=gpu)
    assert threading.active_count() == before  # no thread: nothing to wait for
    opened()
    with pytest.raises(ConfigError, match="unknown settings: colour"):
        prepare(backend=gpu, colour="red")


def test_a_rankings_calls_judge_without_waiting_for_a_counter_read(tmp_path, monkeypatch):
    # a sampler process reads the counters at most every 20 ms: a short call's end read
    # waits for its start's; a ranking's calls judge with the reads already in
    from gpuenv.telemetry import process
    from gpuenv.telemetry.sampler import Sampler
    from gpuenv.timebase import RealClock

    waited: list[float] = []
    own = Sampler._wait_for_process_read

    def wait(self, gpu, t1):
        waited.append(t1)
        own(self, gpu, t1)

    monkeypatch.setattr(Sampler, "_wait_for_process_read", wait)
    monkeypatch.setenv("GPUENV_SAMPLER", "process")
    sim = SimBackend("h100", state_file=tmp_path / "sim.json", clock=RealClock())
    sim.open_context(0)
    try:
        r = gpuenv.rank({"a": kernel(sim, 0.05, 1), "b": kernel(sim, 0.06, 2)}, backend=sim)
        assert waited == [] and sum(c.rounds for c in r.candidates) >= 2
        m = gpuenv.bench(kernel(sim, 0.05, 3), backend=sim, budget_s=0.01, min_reps=5)
        assert waited and max(waited) >= m.windows[-1].t1  # a bench waits for its end read
        waited.clear()
        unwaited = {"wait_counters": False, "wait_power": False}  # as a ranking's calls
        gpuenv.bench(kernel(sim, 0.05, 3), backend=sim, budget_s=0.01, **unwaited)
        assert waited == []
    finally:
        sim.close()
        process.close_idle()


def test_a_rankings_later_calls_count_the_samples_of_the_rest_before_them(gpu, ready_checks):
    # a call's check for a ready GPU wants two samples: those since the last call's last
    # rep count (the rest between them), not only those taken after the call began
    from gpuenv.telemetry import DRIVER_REFRESH_S

    seen = ready_checks
    began = gpu.clock.now()
    r = gpuenv.rank(four(gpu, 1), backend=gpu)
    calls = sorted((m for c in r.candidates for m in c.measurements), key=lambda m: m.windows[0].t0)
    assert len(seen) == len(calls) > 4
    assert seen[0] is not None and seen[0] >= began - DRIVER_REFRESH_S  # the first: its own
    for before, since in zip(calls, seen[1:], strict=False):
        assert since == pytest.approx(max(w.t1 for w in before.windows) - DRIVER_REFRESH_S)
    with pytest.raises(ConfigError, match="rested_since"):
        gpuenv.bench(lambda: None, backend=gpu, rested_since="now")


def test_a_ranking_of_tiny_candidates_times_every_call_by_cupti(gpu, monkeypatch):
    """One call per CUDA event pair holds microseconds of the events' overhead, at one of
    two levels (an H200's 1024^3 mm: 8.62-9.60 us by events, 6.05-6.16 by CUPTI): where
    the first call reads under TINY_REP_S, every call (that one again) is mode "auto", the
    device time from CUPTI. The simulated GPU's calls are made tiny by the threshold."""
    from gpuenv.timing import rank as ranking

    cands = {"a": kernel(gpu, 0.2, 1), "b": kernel(gpu, 0.21, 2)}
    r = gpuenv.rank(cands, backend=gpu)  # 0.2 ms: events, as before
    assert {m.extra["mode"] for c in r.candidates for m in c.measurements} == {"events"}
    assert "mode='events'" in r.method and f"timed: {r.method}" in str(r)
    assert r.method == "mode='events': the simulated GPU's clock"  # the kind, in words

    monkeypatch.setattr(ranking, "TINY_REP_S", 1e-3)
    from gpuenv.timing import harness

    asked: list[str] = []
    medians: list[float] = []
    real = harness.bench

    def spy(fn, cfg, **kw):
        asked.append(cfg.mode)
        m = real(fn, cfg, **kw)
        medians.append(m.median_s)
        return m

    monkeypatch.setattr(harness, "bench", spy)
    r = gpuenv.rank(cands, backend=gpu)
    # the first call by events, then again by CUPTI, and every call after it
    assert asked[:2] == ["events", "auto"] and set(asked[1:]) == {"auto"}
    assert len(asked) == 1 + sum(c.rounds for c in r.candidates)  # the events call not kept
    assert {m.extra["mode"] for c in r.candidates for m in c.measurements} == {"auto"}
    assert r.winner == "a" and r.to_dict()["method"] == r.method and r.method
    assert r["a"].measurements[0].warmup.reps == 1  # again: its set-up was done
    assert r["b"].measurements[0].warmup.reps > 1  # its first call, warmed as first calls are
    # a tuner's times stay on the events' scale (Inductor weighs them against an epilogue's
    # and a fused kernel's, timed so): the device times plus what the events call held more
    offset = max(0.0, medians[0] - r["a"].median_s)
    assert r.events_offset_s == pytest.approx(offset) and r.to_dict()["events_offset_s"] == offset
    assert r.times_s["a"] == pytest.approx(r["a"].median_s + offset)
    assert r.times_s["b"] >= r["b"].median_s + offset

    # where events read 3 us over the device times: each time 3 us more, the same choice
    shifted = Ranking(**{**vars(r), "events_offset_s": 3e-6})
    assert shifted.times_s["a"] == pytest.approx(r["a"].median_s + 3e-6)
    assert min(shifted.times_s, key=shifted.times_s.__getitem__) == r.winner

    # a mode asked for is kept, whatever the size: by keyword or in a config
    r = gpuenv.rank(cands, backend=gpu, mode="events")
    assert {m.extra["mode"] for c in r.candidates for m in c.measurements} == {"events"}
    r = gpuenv.rank(cands, ranking.RANK_CALL, backend=gpu)
    assert {m.extra["mode"] for c in r.candidates for m in c.measurements} == {"events"}


# -- the screen: candidates far behind stop before any call of their own ----------------


def spied_calls(monkeypatch) -> list[tuple[str, str]]:
    """Each bench call a ranking makes: (the candidate's name, the call's mode)."""
    from gpuenv.timing import harness

    calls: list[tuple[str, str]] = []
    real = harness.bench

    def spy(fn, cfg, **kw):
        calls.append((kw["name"], cfg.mode))
        return real(fn, cfg, **kw)

    monkeypatch.setattr(harness, "bench", spy)
    return calls


def six(sim: SimBackend, seed: int) -> dict[str, Callable[[], float]]:
    """Four close (the `four` above) and two far behind: 20% and 60%, the first given first."""
    return {"far20": kernel(sim, 0.24, seed + 9), **four(sim, seed), "far60": kernel(sim, 0.32, 5)}


@pytest.mark.parametrize("hot", [False, True], ids=["rested", "hot"])
def test_the_screen_stops_candidates_far_behind_before_a_call_of_their_own(gpu, monkeypatch, hot):
    from gpuenv.timing import rank as ranking

    calls = spied_calls(monkeypatch)
    if hot:
        heat(gpu)
    began = gpu.clock.now()
    r = gpuenv.rank(six(gpu, 3), backend=gpu)
    assert r.winner == "near" and r.tied == ("near", "best")  # as without the far ones
    assert {name for name, _ in calls} == {"near", "best", "slow3", "slow10"}
    for name, ratio in (("far20", 1.2), ("far60", 1.6)):
        c = r[name]
        assert c.outcome == "far" and c.rounds == 0 and not c.measurements
        assert len(c.screen_s) == ranking.SCREEN_CALLS and c.median_s == stats.median(c.screen_s)
        assert c.median_s / stats.median(r["best"].screen_s) == pytest.approx(ratio, rel=0.01)
        assert c.margin == pytest.approx(ratio, rel=0.01) and c.margin_ci[0] <= c.margin
        assert r.calls_s(name) == list(c.screen_s) and r.times_s[name] == c.median_s
    assert r["slow10"].outcome == "far" and r["slow10"].rounds == 1  # 10%: round 1's rule
    assert all(len(c.screen_s) == ranking.SCREEN_CALLS for c in r.candidates)
    assert 0 < r.screen_wall_s < r.wall_s and "(a screen of" in str(r) and "stopped 2)" in str(r)
    assert "far, in the screen" in str(r) and r.to_dict()["screen_wall_s"] == r.screen_wall_s
    assert r.screened == ("far20", "far60")
    # hot, its first call waited for the cap to clear: the state says how long, and so does
    # the record gpuenv run keeps and prints; rested, none waited and nothing is said
    waits = [m.first_burst.wait_s for c in r.candidates for m in c.measurements]
    assert r.state.waited_s == pytest.approx(sum(waits)) and (r.state.waited_s > 0.1) == hot
    said = f"waited {r.state.waited_s:.2f} s for a ready GPU"
    assert (said in str(r)) == hot and ("for a ready GPU" in str(r)) == hot
    record = decision_record("k", [], r)
    assert (said in "\n".join(decision_lines(record))) == hot
    assert r.to_dict()["state"]["waited_s"] == r.state.waited_s
    # the first call's work waits the duty rule's rest after the screen's (at a duty of
    # 0.5, as long as its calls' work), and then, rested, begins at once
    first = min((m for c in r.candidates for m in c.measurements), key=lambda m: m.windows[0].t0)
    busy = sum(t for c in r.candidates for t in c.screen_s)
    assert first.windows[0].t0 >= began + r.screen_wall_s + busy
    assert first.first_burst.ready and (hot or first.first_burst.wait_s == 0)

    calls.clear()  # without the screen, round 1 times them (and stops them there)
    r = gpuenv.rank(six(gpu, 3), backend=gpu, screen=False)
    assert {name for name, _ in calls} >= {"far20", "far60"} and r.screen_wall_s == 0
    assert r["far20"].rounds == 1 and r["far20"].screen_s == () and r.winner == "near"


def test_a_screen_needs_three_candidates_and_a_device_that_times_each_call(gpu, monkeypatch):
    from gpuenv.timing.devices import BackToBack, SimDevice

    calls = spied_calls(monkeypatch)
    r = gpuenv.rank({"a": kernel(gpu, 0.2, 1), "far": kernel(gpu, 0.4, 2)}, backend=gpu)
    assert r.screen_wall_s == 0 and r["far"].rounds == 1 and ("far", "events") in calls
    # a device given is screened with where it times each call as called
    cands = six(gpu, 1)
    r = gpuenv.rank(cands, backend=gpu, device=SimDevice(gpu, 0))
    assert r.screen_wall_s > 0 and r["far60"].rounds == 0
    r = gpuenv.rank(cands, backend=gpu, device=BackToBack(SimDevice(gpu, 0), 0.01))
    assert r.screen_wall_s == 0 and r["far60"].rounds == 1


def test_a_screen_of_tiny_candidates_chooses_cupti_for_every_call(gpu, monkeypatch):
    """Where the screen reads the first candidate left under TINY_REP_S, every call is
    by CUPTI from the first (no events call to decide it), and the events offset is that
    candidate's screen median less its CUPTI median. The simulated GPU's calls are made
    tiny by the threshold."""
    from gpuenv.timing import rank as ranking

    monkeypatch.setattr(ranking, "TINY_REP_S", 1e-3)
    calls = spied_calls(monkeypatch)
    r = gpuenv.rank(six(gpu, 5), backend=gpu)
    assert {mode for _, mode in calls} == {"auto"} and r["far60"].rounds == 0
    assert r["near"].measurements[0].warmup.reps > 1  # a first call: warmed as first calls are
    screen = stats.median(r["near"].screen_s)
    assert r.events_offset_s == pytest.approx(max(0.0, screen - r["near"].median_s))
    assert r.winner == "near"
    # as a real GPU's events read, 3 us over CUPTI's device time: one the screen stopped
    # has its screen median (events) less the offset, on the CUPTI column of the others
    # (an H200's table once read 6.88 us for one stopped x1.25 behind a winner of 3.10 us),
    # and a tuner's times are all on the events' scale: nothing added twice, or not at all
    monkeypatch.setattr(ranking._Ranker, "_events_offset", lambda self: 3e-6)
    r = gpuenv.rank(six(gpu, 5), backend=gpu)
    far = stats.median(r["far60"].screen_s)
    assert r.events_offset_s == 3e-6 and r["far60"].rounds == 0
    assert r["far60"].median_s == pytest.approx(far - 3e-6)
    assert r.times_s["far60"] == pytest.approx(far) and r.calls_s("far60") == [*r["far60"].screen_s]
    assert r.times_s["near"] == pytest.approx(r["near"].median_s + 3e-6)
    assert fmt_s(r["far60"].median_s) in str(r)


def test_only_the_first_ranking_after_heavy_load_waits_for_the_cap_to_clear(gpu):
    """A compile with many selections after heavy load pays the wait once: the first
    ranking waits for the power cap to clear (and says so), the ones right after find the
    GPU ready (their first call waits at most a sample's refresh)."""
    heat(gpu)
    first, second, third = (gpuenv.rank(six(gpu, seed), backend=gpu) for seed in (1, 2, 3))
    assert first.state.waited_s > 0.1 and "for a ready GPU" in str(first.state)
    for r in (second, third):
        assert r.state.waited_s < WAIT_SAID_S and "for a ready GPU" not in str(r.state)
        assert r.wall_s < first.wall_s - first.state.waited_s + 0.1


def test_a_ranking_in_a_session_screens_on_the_sessions_gpu(gpu):
    with gpuenv.stable(backend=gpu, gpus=[0]) as env:
        r = gpuenv.rank(six(gpu, 7), session=env)
    assert r.screen_wall_s > 0 and r["far60"].outcome == "far" and r["far60"].rounds == 0
    assert r.winner == "near" and r.state.gpu == 0
