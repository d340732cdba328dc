"""The NVML backend.

CPU tests: what a machine without a driver gets, and what the backend says it is
(the error mapping is in test_nvml_errors.py, field values in test_nvml_fields.py).

`gpu` tests (scripts/device-test, GPUENV_READONLY=1): the real backend against
nvidia-smi's own output, and the simulated model of the GPU (H100, H200 ...) against the
real one. They only read; no test here ever calls a write on the real backend.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time

import pynvml
import pytest
from driver_harness import without_driver

from gpuenv.backend import (
    REASON_COUNTERS,
    AppClocks,
    Backend,
    Capabilities,
    ClockLimits,
    DeviceInfo,
    FastReading,
    PowerLimits,
    ReadOnlyBackend,
    SlowReading,
    Thresholds,
    nvml,
    open_backend,
)
from gpuenv.errors import (
    DeviceNotFound,
    NotSupported,
    NvmlUnavailable,
    ReadOnlyError,
)
from gpuenv.timebase import REAL_CLOCK


def test_the_real_backend_says_what_it_is_without_a_name_test() -> None:
    # No nvmlInit needed: what code above the seam asks of a real GPU
    bare = nvml.NvmlBackend.__new__(nvml.NvmlBackend)
    assert bare.capabilities == Capabilities(simulated=False, privileged=os.geteuid() == 0)
    assert bare.workload is None  # real kernels run through CUDA
    assert bare.clock is REAL_CLOCK and not bare.clock.virtual
    assert bare.spec() == {"kind": "nvml"}
    assert json.loads(json.dumps(bare.spec())) == bare.spec()


@without_driver
def test_no_driver_is_one_clear_line() -> None:
    with pytest.raises(NvmlUnavailable) as info:
        open_backend("nvml")
    text = str(info.value)
    assert "\n" not in text
    assert "NVML" in text and "--sim" in text
    assert isinstance(info.value.__cause__, pynvml.NVMLError)  # raise ... from err


# -- the real GPU (device only) ----------------------------------------------------------

_ALIASES = {
    "clocks_event_reasons.active": (
        "clocks_event_reasons.active",
        "clocks_throttle_reasons.active",
    ),
    "clocks_event_reasons.supported": (
        "clocks_event_reasons.supported",
        "clocks_throttle_reasons.supported",
    ),
}


def _smi(*args: str) -> str:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        pytest.skip("nvidia-smi is not on PATH")
    out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"nvidia-smi {' '.join(args)}: {out.stdout}{out.stderr}".strip())
    return out.stdout


def _na(value: str) -> str | None:
    value = value.strip()
    return (
        None if (not value or value.startswith("[") or value in ("N/A", "Unknown Error")) else value
    )


def smi_query(index: int, *fields: str) -> dict[str, str | None]:
    """nvidia-smi --query-gpu for one GPU; fields it does not know under any alias are None."""
    names = [_ALIASES.get(f, (f,))[0] for f in fields]
    try:
        line = _smi(
            f"--query-gpu={','.join(names)}", "--format=csv,noheader,nounits", "-i", str(index)
        )
        values = [v.strip() for v in line.strip().split(",")]
        if len(values) == len(fields):
            return {f: _na(v) for f, v in zip(fields, values, strict=True)}
    except RuntimeError:
        pass
    result: dict[str, str | None] = {}
    for f in fields:  # one by one, trying older names
        result[f] = None
        for name in _ALIASES.get(f, (f,)):
            try:
                out = _smi(f"--query-gpu={name}", "--format=csv,noheader,nounits", "-i", str(index))
            except RuntimeError:
                continue
            result[f] = _na(out.strip())
            break
    return result


def _agrees(attempts: int, check) -> None:
    """Dynamic values move: pass if one of a few side-by-side reads agrees."""
    last: AssertionError | None = None
    for _ in range(attempts):
        try:
            check()
            return
        except AssertionError as err:
            last = err
            time.sleep(0.3)
    assert last is not None
    raise last


@pytest.fixture
def real():
    backend = nvml.NvmlBackend()
    try:
        yield backend
    finally:
        backend.close()


@pytest.mark.gpu
def test_gpu_device_info_matches_nvidia_smi_list(real: nvml.NvmlBackend) -> None:
    listed = [
        m.groups()
        for m in re.finditer(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9a-fA-F-]+)\)", _smi("-L"), re.M)
    ]
    assert real.device_count() == len(listed)
    for index, name, uuid in listed:
        info = real.device_info(int(index))
        assert isinstance(info, DeviceInfo)
        assert (info.index, info.name, info.uuid) == (int(index), name, uuid)
        q = smi_query(int(index), "pci.bus_id", "compute_cap", "memory.total", "mig.mode.current")
        assert info.pci_bus_id.lower() == (q["pci.bus_id"] or "").lower()
        if q["compute_cap"]:
            assert info.compute_capability == tuple(int(x) for x in q["compute_cap"].split("."))
        if q["memory.total"]:
            assert info.memory_total_mib == pytest.approx(float(q["memory.total"]), abs=2)
        if q["mig.mode.current"] is None:
            assert info.mig_mode in (None, False)
        else:
            assert info.mig_mode == (q["mig.mode.current"] == "Enabled")


@pytest.mark.gpu
def test_gpu_minor_numbers_match_nvidia_smi_and_dev(real: nvml.NvmlBackend) -> None:
    # gpuenvd's `job` rule maps a device cgroup's `c 195:N` to a GPU by this number
    for index in range(real.device_count()):
        minor = real.details(index).minor_number
        shown = re.search(r"Minor Number\s*:\s*(\d+)", _smi("-q", "-i", str(index)))
        assert shown is not None and minor == int(shown.group(1))
        dev = os.stat(f"/dev/nvidia{minor}")
        assert (os.major(dev.st_rdev), os.minor(dev.st_rdev)) == (195, minor)


@pytest.mark.gpu
def test_gpu_static_clocks_power_and_thresholds_match_nvidia_smi(real: nvml.NvmlBackend) -> None:
    for i in range(real.device_count()):
        limits = real.clock_limits(i)
        assert isinstance(limits, ClockLimits)
        q = smi_query(
            i,
            "clocks.max.sm",
            "clocks.max.mem",
            "clocks.default_applications.graphics",
            "clocks.default_applications.memory",
            "clocks.applications.graphics",
            "clocks.applications.memory",
            "power.limit",
            "power.default_limit",
            "power.min_limit",
            "power.max_limit",
            "persistence_mode",
            "clocks_event_reasons.supported",
        )
        assert limits.max_sm_mhz == int(q["clocks.max.sm"] or 0)
        assert limits.max_mem_mhz == int(q["clocks.max.mem"] or 0)
        if q["clocks.default_applications.graphics"]:
            assert limits.default_app_sm_mhz == int(q["clocks.default_applications.graphics"])
            assert limits.default_app_mem_mhz == int(q["clocks.default_applications.memory"] or 0)
        app = real.app_clocks(i)
        assert isinstance(app, AppClocks)
        if q["clocks.applications.graphics"]:
            assert app.sm_mhz == int(q["clocks.applications.graphics"])
            assert app.mem_mhz == int(q["clocks.applications.memory"] or 0)
        power = real.power_limits(i)
        assert isinstance(power, PowerLimits)
        assert power.limit_w == pytest.approx(float(q["power.limit"] or "nan"), abs=0.5)
        assert power.default_w == pytest.approx(float(q["power.default_limit"] or "nan"), abs=0.5)
        assert power.min_w == pytest.approx(float(q["power.min_limit"] or "nan"), abs=0.5)
        assert power.max_w == pytest.approx(float(q["power.max_limit"] or "nan"), abs=0.5)
        assert real.persistence_mode(i) == (q["persistence_mode"] == "Enabled")
        if q["clocks_event_reasons.supported"]:
            assert real.supported_reasons(i) == int(q["clocks_event_reasons.supported"], 16)

        # supported clocks: nvidia-smi's list of (memory, graphics) pairs, exactly
        pairs = _smi(
            "--query-supported-clocks=memory,graphics",
            "--format=csv,noheader,nounits",
            "-i",
            str(i),
        )
        smi_pairs = {tuple(int(x) for x in line.split(",")) for line in pairs.strip().splitlines()}
        ours = {(m, g) for m, gs in limits.supported_sm_mhz.items() for g in gs}
        assert ours == smi_pairs
        assert limits.supported_mem_mhz == tuple(sorted({m for m, _ in smi_pairs}, reverse=True))

        # thresholds: nvidia-smi -q -d TEMPERATURE
        text = _smi("-q", "-d", "TEMPERATURE", "-i", str(i))
        t = real.thresholds(i)
        assert isinstance(t, Thresholds)
        compared = 0
        for label, value in (
            ("GPU Shutdown Temp", t.shutdown_c),
            ("GPU Slowdown Temp", t.slowdown_c),
            ("GPU Max Operating Temp", t.gpu_max_c),
            ("Memory Max Operating Temp", t.mem_max_c),
        ):
            # newer nvidia-smi may print only margins ("GPU Shutdown T.Limit Temp"): skip those
            m = re.search(rf"{re.escape(label)}\s*:\s*(\S+)", text)
            if m is None:
                continue
            compared += 1
            shown = m.group(1)
            assert value == (float(shown) if shown.isdigit() else None), (label, shown)
        if compared == 0:
            print(f"nvidia-smi shows no absolute thresholds for GPU {i}:\n{text}")


@pytest.mark.gpu
def test_gpu_fast_reading_matches_nvidia_smi(real: nvml.NvmlBackend) -> None:
    fields = (
        "clocks.sm",
        "clocks.mem",
        "power.draw",
        "temperature.gpu",
        "clocks_event_reasons.active",
    )
    for i in range(real.device_count()):

        def check(i: int = i) -> None:
            before = real.read_fast(i)
            q = smi_query(i, *fields)
            after = real.read_fast(i)
            assert isinstance(before, FastReading)
            assert isinstance(before.sm_mhz, int) and isinstance(before.reasons, int)
            assert isinstance(before.power_w, float) and isinstance(before.temp_c, float)
            sm = int(q["clocks.sm"] or 0)
            assert (
                min(before.sm_mhz, after.sm_mhz) - 30 <= sm <= max(before.sm_mhz, after.sm_mhz) + 30
            )
            assert int(q["clocks.mem"] or 0) in (before.mem_mhz, after.mem_mhz)
            draw = float(q["power.draw"] or "nan")
            lo, hi = sorted((before.power_w, after.power_w))
            assert lo * 0.85 - 10 <= draw <= hi * 1.15 + 10
            temp = float(q["temperature.gpu"] or "nan")
            assert (
                min(before.temp_c, after.temp_c) - 3 <= temp <= max(before.temp_c, after.temp_c) + 3
            )
            reasons = int(q["clocks_event_reasons.active"] or "0", 16)
            assert reasons in (before.reasons, after.reasons)

        _agrees(4, check)


@pytest.mark.gpu
def test_gpu_fast_reading_has_instant_power_with_a_driver_timestamp(real: nvml.NvmlBackend) -> None:
    r = real.read_fast(0)
    if r.power_instant_w is None:
        pytest.skip("this GPU does not fill NVML_FI_DEV_POWER_INSTANT")
    assert 0 < r.power_instant_w < 2000
    assert isinstance(r.driver_ts_us, int) and r.driver_ts_us > 0


@pytest.mark.gpu
def test_gpu_slow_reading_has_counters_and_memory_temperature(real: nvml.NvmlBackend) -> None:
    first = real.read_slow(0)
    time.sleep(0.3)
    second = real.read_slow(0)
    assert isinstance(first, SlowReading)
    assert set(first.reason_ns) <= set(REASON_COUNTERS)
    if first.energy_mj is not None:
        assert isinstance(first.energy_mj, int)
        assert second.energy_mj is not None and second.energy_mj >= first.energy_mj
    for name, ns in first.reason_ns.items():
        assert isinstance(ns, int) and second.reason_ns.get(name, ns) >= ns, name
    q = smi_query(0, "temperature.memory")
    if q["temperature.memory"] is not None:
        assert second.mem_temp_c == pytest.approx(float(q["temperature.memory"]), abs=3)


@pytest.mark.gpu
def test_gpu_processes_match_nvidia_smi(real: nvml.NvmlBackend) -> None:
    def check() -> None:
        ours = {p.pid for p in real.processes(0)}
        out = _smi("--query-compute-apps=pid", "--format=csv,noheader,nounits", "-i", "0")
        smi = {int(x) for x in out.split() if x.strip().isdigit()}
        assert smi <= ours  # ours also lists graphics processes

    _agrees(3, check)


@pytest.mark.gpu
def test_gpu_power_samples_are_watts_with_timestamps(real: nvml.NvmlBackend) -> None:
    try:
        samples = real.power_samples(0)
    except NotSupported:
        pytest.skip("nvmlDeviceGetSamples(TOTAL_POWER) is not supported here")
    for ts, watts in samples:
        assert isinstance(ts, int) and 0 < watts < 2000
    if samples:
        assert real.power_samples(0, since_us=samples[-1][0] + 10_000_000) == []


@pytest.mark.gpu
def test_gpu_bad_index_is_device_not_found(real: nvml.NvmlBackend) -> None:
    with pytest.raises(DeviceNotFound):
        real.read_fast(real.device_count())


@pytest.mark.gpu
def test_gpu_spec_reopens_the_same_gpus(real: nvml.NvmlBackend) -> None:
    assert isinstance(real, Backend)
    again = open_backend(spec=real.spec(), readonly=True)
    try:
        assert again.capabilities.simulated is False and again.workload is None
        uuids = [real.device_info(i).uuid for i in range(real.device_count())]
        assert [again.device_info(i).uuid for i in range(again.device_count())] == uuids
    finally:
        again.close()


@pytest.mark.gpu
def test_gpu_writes_are_refused_before_nvml_when_readonly(monkeypatch: pytest.MonkeyPatch) -> None:
    # scripts/device-test sets GPUENV_READONLY=1 (conftest hides it from tests): set it here
    # and ask for read-only as well, so this can never write, even when run by hand.
    monkeypatch.setenv("GPUENV_READONLY", "1")
    backend = open_backend("nvml", readonly=True)
    try:
        assert isinstance(backend, ReadOnlyBackend)
        before = backend.power_limits(0)
        # An index no GPU has: had a call reached NVML it would raise DeviceNotFound, not
        # ReadOnlyError, and it could not have changed anything on any GPU.
        bad = backend.device_count() + 5
        for op, args in (
            ("set_locked_sm_clocks", (1350, 1350)),
            ("reset_locked_sm_clocks", ()),
            ("set_locked_mem_clocks", (1593, 1593)),
            ("reset_locked_mem_clocks", ()),
            ("set_app_clocks", (1593, 1350)),
            ("reset_app_clocks", ()),
            ("set_power_limit", (650.0,)),
        ):
            with pytest.raises(ReadOnlyError):
                getattr(backend, op)(bad, *args)
        assert backend.power_limits(0) == before
    finally:
        backend.close()


@pytest.mark.gpu
def test_gpu_the_sim_profile_of_this_gpu_reads_like_it(real: nvml.NvmlBackend) -> None:
    """The profile that models the real GPU (found by the name its driver reports: the
    H100's, the H200's ...) against it, read for read. A GPU that no profile models fails
    here: the simulator is meant to model every GPU the gpu suite runs on (issue 42)."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.backend.sim_profiles import PROFILES, profile_for_gpu
    from gpuenv.timebase import VirtualClock

    info = real.device_info(0)
    profile = profile_for_gpu(info.name)
    if profile is None:
        pytest.fail(
            f"no simulated profile models {info.name!r} (profiles: {', '.join(PROFILES)}): "
            "add one to gpuenv/backend/sim_profiles.py from this GPU's nvidia-smi -q"
        )
    sim = SimBackend(profile, clock=VirtualClock())
    try:
        s_info, r_info = sim.device_info(0), info
        assert s_info.name == r_info.name
        assert s_info.compute_capability == r_info.compute_capability
        assert type(s_info.mig_mode) is type(r_info.mig_mode)
        s, r = sim.clock_limits(0), real.clock_limits(0)
        assert s.supported_mem_mhz == r.supported_mem_mhz
        assert s.supported_sm_mhz == r.supported_sm_mhz
        assert (s.max_sm_mhz, s.max_mem_mhz) == (r.max_sm_mhz, r.max_mem_mhz)
        assert (s.default_app_sm_mhz, s.default_app_mem_mhz) == (
            r.default_app_sm_mhz,
            r.default_app_mem_mhz,
        )
        assert s.locked_clocks_supported == r.locked_clocks_supported
        assert s.locked_mem_supported == r.locked_mem_supported
        sp, rp = sim.power_limits(0), real.power_limits(0)
        assert (sp.default_w, sp.min_w, sp.max_w) == (rp.default_w, rp.min_w, rp.max_w)
        assert sim.thresholds(0) == real.thresholds(0)
        assert sim.supported_reasons(0) == real.supported_reasons(0)
        assert isinstance(sim.app_clocks(0), AppClocks)
        # the same reads give the same types and plausible ranges
        for reading in (sim.read_fast(0), real.read_fast(0)):
            assert isinstance(reading.sm_mhz, int) and isinstance(reading.mem_mhz, int)
            assert isinstance(reading.power_w, float) and isinstance(reading.temp_c, float)
            assert isinstance(reading.reasons, int)
            assert reading.mem_mhz in r.supported_mem_mhz
            assert min(map(min, r.supported_sm_mhz.values())) <= reading.sm_mhz <= r.max_sm_mhz
            assert 20 < reading.power_w <= rp.max_w * 1.1
            assert 10 < reading.temp_c < 100
        s_slow, r_slow = sim.read_slow(0), real.read_slow(0)
        assert type(s_slow.energy_mj) is type(r_slow.energy_mj)
        assert set(r_slow.reason_ns) <= set(s_slow.reason_ns)  # the sim offers what NVML does
        assert (s_slow.mem_temp_c is None) == (r_slow.mem_temp_c is None)
        assert type(sim.persistence_mode(0)) is type(real.persistence_mode(0))
        # and the same errors for a GPU that is not there
        with pytest.raises(DeviceNotFound):
            sim.read_fast(sim.device_count())
        with pytest.raises(DeviceNotFound):
            real.read_fast(real.device_count())
    finally:
        sim.close()
