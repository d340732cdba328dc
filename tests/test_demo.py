"""`gpuenv demo`: the simulated tour tells the true story; the real tour only reads."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from driver_harness import without_driver

from gpuenv.backend import REASON_SW_POWER_CAP, ReadOnlyBackend
from gpuenv.backend.sim import SimBackend
from gpuenv.cli import cli
from gpuenv.demo import KERNEL_MEM_CYCLES, KERNEL_SM_CYCLES, real_tour, sim_tour
from gpuenv.demo.measure import SimRig, format_table
from gpuenv.demo.tour import WIDTH
from gpuenv.timebase import VirtualClock

WAYS = ("naive (do_bench-like)", "gpuenv burst", "gpuenv sustained")


def kinds(taken) -> set[str]:
    return {f.kind for f in taken.findings}


def settings(sim: SimBackend) -> tuple:
    t = sim.truth(0)
    return (t.locked_sm, t.locked_mem, t.app_sm_mhz, t.app_mem_mhz, t.power_limit_w, t.persistence)


@pytest.fixture(scope="module")
def tour(module_env: None) -> tuple[dict, str]:
    """The default sim tour, once (virtual time: deterministic)."""
    lines: list[str] = []
    result = sim_tour(lines.append, pace=0)
    return result, "\n".join(lines)


def test_sim_tour_shows_the_same_kernel_slower_after_sustained_load(tour) -> None:
    result, text = tour
    assert result["idle_mhz"] == 345 and result["boost_mhz"] == 1980
    # an H100: 1.37 ms at 1980 MHz, ~1.6 ms after sustained load
    assert result["cold_ms"] == pytest.approx(1.37, rel=0.05)
    assert result["hot_ms"] > result["cold_ms"] * 1.10
    rows = result["load_rows"]
    assert all(reasons & REASON_SW_POWER_CAP for *_, reasons in rows)
    assert rows[-1][1] < rows[0][1] < 1980  # the capped clock creeps down
    assert rows[-1][3] > rows[0][3] + 10  # as the chip heats
    assert "GpuIdle" in text and "SwPowerCap" in text
    assert f"{result['hot_ms']:.2f} ms" in text


def test_sim_table_naive_gap_is_the_power_cap_and_gpuenv_gaps_are_small(tour) -> None:
    result, _ = tour
    rows = {r.way: r for r in result["ways"]}
    locked = rows.pop(f"locked at {result['lock_sm']} MHz")
    assert tuple(rows) == WAYS
    naive, burst, sustained = (rows[w] for w in WAYS)
    assert naive.gap > 0.10  # the 12-16% measured on an H100, for identical code
    assert "power_cap" in kinds(naive.hot) and "power_cap" not in kinds(naive.cold)
    assert naive.hot.sm_mhz < 0.8 * naive.cold.sm_mhz
    assert abs(burst.gap) < 0.01
    assert burst.cold.sm_mhz == burst.hot.sm_mhz == 1980  # each burst starts uncapped
    assert abs(sustained.gap) < 0.02
    assert sustained.cold.time_s > 1.15 * burst.cold.time_s  # the hot, steady number
    assert abs(locked.gap) < 0.01
    assert locked.cold.sm_mhz == locked.hot.sm_mhz == result["lock_sm"] < 1980
    assert "lock held" in locked.cold.notes and "lock held" in locked.hot.notes
    assert not kinds(locked.hot)  # a clock the cap can hold: nothing to report


def test_sim_table_says_why_the_naive_numbers_differ(tour) -> None:
    result, text = tour
    table = format_table(result["ways"])
    assert table[0].split()[:3] == ["way", "cold", "hot"] and "what gpuenv saw" in table[0]
    naive_line = next(line for line in table if line.startswith("naive"))
    naive = result["ways"][0]
    assert "hot: capped 100%" in naive_line
    assert f"{naive.hot.time_s * 1e3:.3f} ms" in naive_line and f"{naive.gap:+.1%}" in naive_line
    for line in table:
        assert line in text
    words = " ".join(text.split())  # the explanations, however they wrap
    assert "power cap (SwPowerCap) pulled the SM clock from 1980 to" in words
    assert "back as they were" in words
    explained = [ln for ln in text.splitlines() if not any(ln.endswith(t) for t in table)]
    assert max(len(line) for line in explained) <= WIDTH  # a terminal, and the docs, show it


def test_sim_tour_locks_and_restores_exactly(tmp_path: Path) -> None:
    sim = SimBackend("h100", clock=VirtualClock())
    sim.set_power_limit(0, 650.0)  # a non-default state: restore means "as it was"
    before = settings(sim)
    try:
        result = sim_tour(lambda _: None, pace=0, seconds=10, backend=sim)
        assert settings(sim) == before and result["restored"]
    finally:
        sim.close()
    locked = result["ways"][-1]
    assert locked.hot.sm_mhz == result["lock_sm"]  # the lock was really in force
    # its own journal: nothing in the user's state directory (conftest points it at tmp)
    state = Path(os.environ["GPUENV_STATE_DIR"])
    assert not state.exists() or not any(state.iterdir())


def test_a_lock_the_cap_cannot_hold_is_reported_not_hidden() -> None:
    lines: list[str] = []
    result = sim_tour(lines.append, pace=0, lock_sm=1500, seconds=10)
    locked = result["ways"][-1]
    assert locked.way == "locked at 1500 MHz"
    assert {"power_cap", "lock_not_held"} <= kinds(locked.hot)
    assert locked.gap > 0.02
    text = "\n".join(lines)
    assert "lock NOT held" in text and "the lock did not hold" in text


def test_sim_tour_on_another_profile() -> None:
    lines: list[str] = []
    result = sim_tour(lines.append, pace=0, profile="rtx4090", seconds=5)
    assert "RTX 4090" in lines[0]
    assert result["hot_ms"] > result["cold_ms"]
    assert result["restored"]


def matmul_rig(sim: SimBackend):
    """The simulated GPU standing in for a CUDA one: telemetry through the read-only view."""

    def make(backend, gpu: int) -> SimRig:
        return SimRig(
            sim,
            gpu,
            sm_cycles=KERNEL_SM_CYCLES,
            mem_cycles=KERNEL_MEM_CYCLES,
            backend=backend,
            what="an 8192x8192 bf16 matmul",
        )

    return make


def test_real_tour_measures_cold_and_hot_and_never_writes() -> None:
    # a read-only simulated GPU: any write (a lock) would raise ReadOnlyError
    sim = SimBackend("h100", clock=VirtualClock())
    backend = ReadOnlyBackend(sim, reason="demo")
    lines: list[str] = []
    try:
        result = real_tour(backend, [0], lines.append, pace=0, make_rig=matmul_rig(sim))  # type: ignore[arg-type]
        assert sim.truth(0).locked_sm is None
    finally:
        sim.close()
    naive, burst = result["ways"]
    assert (naive.way, burst.way) == WAYS[:2]
    assert naive.gap > 0.10 and "power_cap" in kinds(naive.hot)
    assert abs(burst.gap) < 0.01
    assert naive.load is not None and naive.load.reasons & REASON_SW_POWER_CAP
    text = "\n".join(lines)
    assert "read-only" in text and "not locked" in text and "locked at" not in text
    for line in format_table(result["ways"]):
        assert line in text
    assert "during the load: SM clock 1980 ->" in text


def test_real_tour_without_torch_reads_telemetry_and_says_how(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    sim = SimBackend("h100", clock=VirtualClock())
    backend = ReadOnlyBackend(sim, reason="demo")
    lines: list[str] = []
    try:
        result = real_tour(backend, [0], lines.append, pace=0, seconds=0.2)  # type: ignore[arg-type]
    finally:
        sim.close()
    assert result["ways"] == [] and result["readings"] >= 1
    assert "PyTorch" in result["why_not"]
    text = "\n".join(lines)
    assert "pip install torch" in text
    assert "GpuIdle" in text and "gpuenv demo --sim" in text and "what gpuenv saw" not in text


def test_the_demo_pauses_between_lines_only_on_a_terminal(monkeypatch) -> None:
    # piped or captured (the README's command in a script, CI) it never sleeps; a person at
    # a terminal gets its pauses
    from gpuenv.cli import demo as demo_cli
    from gpuenv.demo import tour

    pauses: list[float] = []
    monkeypatch.setattr(tour.time, "sleep", pauses.append)
    result = CliRunner().invoke(cli, ["--sim", "demo"])  # CliRunner's output: no terminal
    assert result.exit_code == 0, result.output
    assert pauses == []

    class Terminal:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(demo_cli.sys, "stdout", Terminal())
    assert demo_cli._pace(fast=False) == 0.3 and demo_cli._pace(fast=True) == 0.0


def test_cli_sim_demo_prints_the_table() -> None:
    result = CliRunner().invoke(cli, ["--sim", "demo", "--fast"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "SwPowerCap" in out and "what gpuenv saw" in out
    for way in (*WAYS, "locked at"):
        assert f"\n   {way}" in out
    assert "hot: capped 100%" in out


def test_cli_load_seconds() -> None:
    short = CliRunner().invoke(cli, ["--sim", "demo", "--fast", "--load-seconds", "5"])
    assert short.exit_code == 0, short.output
    assert "back to back for 5 s" in short.output
    bad = CliRunner().invoke(cli, ["--sim", "demo", "--fast", "--load-seconds", "0"])
    assert bad.exit_code == 2


def test_cli_unknown_profile_is_one_line() -> None:
    result = CliRunner().invoke(cli, ["--sim", "demo", "--fast", "--profile", "gtx9999"])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1


@without_driver
def test_cli_demo_without_a_gpu_tours_the_sim() -> None:
    result = CliRunner().invoke(cli, ["demo", "--fast"])
    assert result.exit_code == 0, result.output
    assert "touring a simulated GPU" in result.output


@pytest.mark.gpu
def test_real_tour_on_the_gpu() -> None:
    """The measured tour on the real GPU, read-only, with a short load."""
    pytest.importorskip("torch")
    from gpuenv.backend import open_backend
    from gpuenv.devices import select_gpus

    backend = open_backend(readonly=True)
    lines: list[str] = []
    try:
        gpus = select_gpus(backend, "cuda:0")  # the GPU torch runs on first
        result = real_tour(backend, gpus, lines.append, pace=0, load_s=3.0, rest_s=2.0)
    finally:
        backend.close()
    assert result["why_not"] is None, result["why_not"]
    naive, burst = result["ways"]
    assert (naive.way, burst.way) == WAYS[:2]
    for row in (naive, burst):
        for taken in (row.cold, row.hot):
            assert 0.5e-3 < taken.time_s < 20e-3  # an 8192^3 bf16 matmul on a data-centre GPU
            assert taken.sm_mhz is not None and taken.telemetry is not None
    assert naive.load is not None and naive.load.sm_mhz_max is not None
    text = "\n".join(lines)
    assert "what gpuenv saw" in text and "not locked" in text
