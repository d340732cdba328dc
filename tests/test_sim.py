"""The simulated GPU as a `Backend`: what it says it is, its spec, faults, truth, profiles."""

from __future__ import annotations

import json

import pynvml
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuenv.backend import (
    REASON_COUNTERS,
    REASON_GPU_IDLE,
    Backend,
    Capabilities,
    ReadOnlyBackend,
    Workload,
    backend_from_spec,
    open_backend,
)
from gpuenv.backend.nvml_codes import error_for_code
from gpuenv.backend.sim import SimBackend
from gpuenv.backend.sim_faults import FAULT_CODES, FAULT_KINDS
from gpuenv.backend.sim_profiles import H100, PROFILES
from gpuenv.errors import (
    BackendError,
    ConfigError,
    DeviceNotFound,
    DriverTimeout,
    GpuLost,
    NotSupported,
    PermissionDenied,
    ReadOnlyError,
)
from gpuenv.timebase import VirtualClock


def test_is_a_backend(sim):
    assert isinstance(sim, Backend)
    assert sim.name == "sim" and sim.readonly is False


def test_says_what_it_is_through_capabilities_clock_and_workload(sim, vclock):
    assert sim.capabilities == Capabilities(simulated=True, privileged=True)
    assert SimBackend(clock=vclock, root=False).capabilities.privileged is False
    assert sim.clock is vclock
    assert isinstance(sim.workload, Workload) and sim.workload is sim
    ro = ReadOnlyBackend(sim)  # the read-only guard passes all of it through
    assert (ro.capabilities, ro.clock, ro.workload) == (sim.capabilities, vclock, sim)
    assert sim.mig_parent_index("MIG-00000000-0000-0000-0000-000000000000") is None


def test_spec_is_none_for_a_machine_kept_in_memory(sim):
    assert sim.spec() is None
    assert ReadOnlyBackend(sim).spec() is None


def test_spec_reopens_the_same_gpus_elsewhere(tmp_path, vclock):
    state = tmp_path / "sim.json"
    first = SimBackend(n_gpus=2, clock=vclock, root=False, seed=3, state_file=state)
    spec = first.spec()
    assert spec is not None and json.loads(json.dumps(spec)) == spec
    assert "clock" not in spec  # another process runs on real time
    second = backend_from_spec(spec)
    try:
        assert isinstance(second, SimBackend) and not second.clock.virtual
        assert [second.device_info(i).uuid for i in range(2)] == [
            first.device_info(i).uuid for i in range(2)
        ]
        assert second.capabilities.privileged is False  # the permission model travels
        assert second.spec() == spec
    finally:
        second.close()
        first.close()


def test_spec_of_a_read_only_sim_reopens_read_only(tmp_path, vclock, monkeypatch):
    sim = SimBackend(clock=vclock, state_file=tmp_path / "sim.json")
    ro = ReadOnlyBackend(sim, reason="--dry-run")
    spec = ro.spec()
    assert spec is not None and spec["readonly"] == "--dry-run"
    again = open_backend(spec=spec)
    with pytest.raises(ReadOnlyError, match="--dry-run"):
        again.set_power_limit(0, 500.0)
    again.close()
    monkeypatch.setenv("GPUENV_READONLY", "1")  # the environment can only make it stricter
    strict = open_backend(spec=sim.spec())
    assert strict.readonly and isinstance(strict, ReadOnlyBackend)
    strict.close()
    assert sim.truth(0).power_limit_w == 700.0
    sim.close()


@pytest.mark.parametrize(
    "spec",
    [
        {"kind": "tpu"},
        {"kind": "sim", "profile": "h100"},  # the rest is missing
        {
            "kind": "sim",
            "profile": "h100",
            "n_gpus": "two",
            "root": True,
            "seed": 0,
            "state_file": "/tmp/x.json",
        },
        ["kind", "sim"],
    ],
)
def test_a_bad_spec_is_a_config_error(spec):
    with pytest.raises(ConfigError) as err:
        backend_from_spec(spec)
    assert err.value.hint


def test_readonly_wrapper_refuses_before_the_sim(sim):
    ro = ReadOnlyBackend(sim)
    with pytest.raises(ReadOnlyError):
        ro.set_locked_sm_clocks(0, 1350, 1350)
    assert sim.truth(0).locked_sm is None
    assert ro.read_fast(0).sm_mhz == 345


def _idled_long(**settings: float) -> float:
    """The temperature of a GPU 1 left idle for an hour with these settings and air."""
    sim = SimBackend(n_gpus=2, clock=VirtualClock(), seed=4)
    sim.set_locked_sm_clocks(1, 1200, 1200)
    sim.set_power_limit(1, 500)
    sim.set_ambient(1, settings.get("ambient_c", H100.ambient_c))
    sim.idle(3600.0)
    temp = sim.truth(1).temp_c
    sim.close()
    return temp


def test_virtual_copy_is_fresh_with_the_settings_in_force(tmp_path):
    """A copy of a hot, busy, locked GPU: the lock and power limit, none of the heat or work."""
    state = tmp_path / "sim.json"
    hot = SimBackend(n_gpus=2, clock=VirtualClock(), seed=4, state_file=state)
    hot.set_locked_sm_clocks(1, 1200, 1200)
    hot.set_power_limit(1, 500)
    hot.run_work(1, 60.0 * 1980e6)  # a minute of heavy load: the chip is hot
    hot.set_background_load(1, 0.5)
    hot_temp = hot.truth(1).temp_c
    other = SimBackend(n_gpus=2, seed=4, state_file=state)  # another process, real time
    assert other.truth(1).locked_sm == (1200, 1200)  # it sees the settings
    copy = hot.virtual_copy()
    assert copy.clock.virtual and copy.clock is not hot.clock and copy.spec() is None
    assert copy.device_info(1).uuid == other.device_info(1).uuid
    truth = copy.truth(1)
    assert (truth.locked_sm, truth.power_limit_w) == ((1200, 1200), 500.0)
    assert truth.contexts == () and copy.read_fast(1).reasons & REASON_GPU_IDLE
    assert truth.temp_c == pytest.approx(_idled_long(), abs=0.05)  # idle, not hot
    assert hot_temp > truth.temp_c + 20
    copy.run_work(1, 60.0 * 1980e6)  # heats the copy, and nothing another process sees
    assert copy.truth(1).temp_c > truth.temp_c + 20
    again = other.virtual_copy()
    assert again.truth(1).temp_c == pytest.approx(truth.temp_c, abs=1e-9)
    hot.set_ambient(1, 45.0)  # the air the copy's cooler sees is this machine's
    warm = hot.virtual_copy()
    assert warm.truth(1).temp_c == pytest.approx(_idled_long(ambient_c=45.0), abs=0.05)
    assert warm.truth(1).temp_c > truth.temp_c + 5
    for backend in (copy, again, warm, other, hot):
        backend.close()


def test_faults(sim):
    sim.inject_fault(0, "timeout", op="read_fast", count=2)
    for _ in range(2):
        with pytest.raises(DriverTimeout):
            sim.read_fast(0)
    sim.read_fast(0)
    sim.inject_fault(0, "not_supported", op="read_slow")
    with pytest.raises(NotSupported):
        sim.read_slow(0)
    sim.inject_fault(0, "permission", op="set_power_limit")
    with pytest.raises(PermissionDenied):
        sim.set_power_limit(0, 500)
    sim.clear_faults()
    sim.inject_fault(0, "gpu_lost")
    for call in (
        lambda: sim.read_fast(0),
        lambda: sim.device_info(0),
        lambda: sim.run_work(0, 1e6),
    ):
        with pytest.raises(GpuLost):
            call()
    sim.clear_faults(0)
    sim.read_fast(0)
    with pytest.raises(ConfigError):
        sim.inject_fault(0, "meteor")
    with pytest.raises(ConfigError):
        sim.inject_fault(0, "timeout", op="read_fats")


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_an_injected_fault_is_what_the_real_backend_raises_for_its_code(sim, kind):
    sim.inject_fault(0, kind, op="read_fast")
    with pytest.raises(BackendError) as caught:
        sim.read_fast(0)
    code, words = FAULT_CODES[kind]
    assert words == str(pynvml.NVMLError(code))  # as nvml_errors.translate passes them
    real = error_for_code(code, op="read_fast", gpu=0, text=f"{words}, injected fault")
    assert type(caught.value) is type(real)
    assert (caught.value.code, str(caught.value)) == (real.code, str(real))
    assert "injected fault" in str(caught.value)


def test_bad_index(sim):
    with pytest.raises(DeviceNotFound, match="indices 0-0"):
        sim.read_fast(1)


def test_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUENV_SIM_STATE", str(tmp_path / "s.json"))
    monkeypatch.setenv("GPUENV_SIM_PROFILE", "rtx4090")
    monkeypatch.setenv("GPUENV_SIM_GPUS", "2")
    monkeypatch.setenv("GPUENV_SIM_ROOT", "0")
    s = SimBackend.from_env()
    assert s.device_count() == 2 and s.device_info(0).name == "NVIDIA GeForce RTX 4090"
    with pytest.raises(PermissionDenied):
        s.set_power_limit(0, 400)
    s.close()
    monkeypatch.setenv("GPUENV_BACKEND", "sim")
    b = open_backend()
    assert b.name == "sim"
    monkeypatch.setenv("GPUENV_SIM_PROFILE", "h900")
    with pytest.raises(ConfigError, match="h100"):
        SimBackend.from_env()
    monkeypatch.setenv("GPUENV_SIM_PROFILE", "h100")
    monkeypatch.setenv("GPUENV_SIM_GPUS", "lots")
    with pytest.raises(ConfigError, match="GPUENV_SIM_GPUS"):
        SimBackend.from_env()


def test_profiles_are_data():
    assert set(PROFILES) >= {"h100", "rtx4090", "legacy"}
    assert len(H100.sm_clocks_mhz) == 110
    legacy = PROFILES["legacy"]
    assert legacy.sm_clocks_mhz[0] == 1328 and legacy.sm_clocks_mhz[-1] == 544


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("idle"), st.floats(0.0, 3.0)),
            st.tuples(st.just("work"), st.floats(0.0, 3e9)),
            st.tuples(st.just("lock"), st.integers(0, 109), st.integers(0, 109)),
            st.tuples(st.just("unlock")),
            st.tuples(st.just("limit"), st.floats(200.0, 700.0)),
            st.tuples(st.just("background"), st.floats(0.0, 1.0)),
        ),
        max_size=25,
    )
)
def test_invariants_under_any_sequence(ops):
    s = SimBackend(clock=VirtualClock())
    clocks = set(H100.sm_clocks_mhz)
    prev = s.read_slow(0)
    for op in ops:
        if op[0] == "idle":
            s.idle(op[1])
        elif op[0] == "work":
            s.run_work(0, op[1])
        elif op[0] == "lock":
            lo, hi = sorted((H100.sm_clocks_mhz[op[1]], H100.sm_clocks_mhz[op[2]]))
            s.set_locked_sm_clocks(0, lo, hi)
        elif op[0] == "unlock":
            s.reset_locked_sm_clocks(0)
        elif op[0] == "limit":
            s.set_power_limit(0, op[1])
        else:
            s.set_background_load(0, op[1])
        r, t, now = s.read_fast(0), s.truth(0), s.read_slow(0)
        assert r.sm_mhz in clocks and t.sm_mhz in clocks
        assert r.reasons & ~0x1FF == 0
        if t.locked_sm is not None:
            assert t.sm_mhz <= t.locked_sm[1]  # a cap may pull below a lock, never above
        assert t.temp_c < 95
        assert now.energy_mj >= prev.energy_mj
        assert all(now.reason_ns[k] >= prev.reason_ns[k] for k in REASON_COUNTERS)
        prev = now


def test_a_seed_from_the_environment_is_another_machine(monkeypatch, tmp_path):
    """GPUENV_SIM_SEED: simulated nodes of one cluster have GPUs of their own UUIDs (GPU 0 of
    two nodes is two GPUs); text that is not a whole number is refused, naming it."""
    monkeypatch.setenv("GPUENV_SIM_STATE", "none")
    seen = {}
    for seed in ("", "0", "1"):
        monkeypatch.setenv("GPUENV_SIM_SEED", seed)
        with SimBackend.from_env() as s:
            seen[seed] = s.device_info(0).uuid
    assert seen[""] == seen["0"] != seen["1"]
    for bad in ("abc", "1.5", "-1"):
        monkeypatch.setenv("GPUENV_SIM_SEED", bad)
        with pytest.raises(ConfigError, match="GPUENV_SIM_SEED"):
            SimBackend.from_env()
