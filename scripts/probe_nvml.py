#!/usr/bin/env python3
"""Read-only NVML probe: prints what this machine's driver answers to the calls gpuenv uses.

Never writes a GPU setting. Used to check the recorded H100 facts against the lent device
before relying on a fact. Usage: python3 scripts/probe_nvml.py [--json FILE]
"""

from __future__ import annotations

import json
import sys
import time

import pynvml as N


def attempt(fn, *args):
    try:
        return fn(*args)
    except N.NVMLError as err:
        return f"NVMLError({err.value}: {err})"
    except Exception as err:
        return f"{type(err).__name__}: {err}"


def main() -> None:
    N.nvmlInit()
    out: dict = {
        "nvml_py": getattr(N, "__version__", None),
        "driver": attempt(N.nvmlSystemGetDriverVersion),
        "nvml": attempt(N.nvmlSystemGetNVMLVersion),
        "cuda_driver": attempt(N.nvmlSystemGetCudaDriverVersion_v2),
        "count": N.nvmlDeviceGetCount(),
    }
    h = N.nvmlDeviceGetHandleByIndex(0)
    d: dict = {}
    d["name"] = attempt(N.nvmlDeviceGetName, h)
    d["uuid"] = attempt(N.nvmlDeviceGetUUID, h)
    d["pci"] = str(attempt(lambda: N.nvmlDeviceGetPciInfo(h).busId))
    d["cc"] = attempt(N.nvmlDeviceGetCudaComputeCapability, h)
    d["mig"] = attempt(N.nvmlDeviceGetMigMode, h)
    d["persistence"] = attempt(N.nvmlDeviceGetPersistenceMode, h)
    for cname, ctype in (
        ("graphics", N.NVML_CLOCK_GRAPHICS),
        ("sm", N.NVML_CLOCK_SM),
        ("mem", N.NVML_CLOCK_MEM),
    ):
        for idname in (
            "NVML_CLOCK_ID_CURRENT",
            "NVML_CLOCK_ID_APP_CLOCK_TARGET",
            "NVML_CLOCK_ID_APP_CLOCK_DEFAULT",
            "NVML_CLOCK_ID_CUSTOMER_BOOST_MAX",
        ):
            cid = getattr(N, idname, None)
            if cid is not None:
                d[f"clock.{cname}.{idname}"] = attempt(N.nvmlDeviceGetClock, h, ctype, cid)
        d[f"max.{cname}"] = attempt(N.nvmlDeviceGetMaxClockInfo, h, ctype)
        d[f"app.{cname}"] = attempt(N.nvmlDeviceGetApplicationsClock, h, ctype)
        d[f"defapp.{cname}"] = attempt(N.nvmlDeviceGetDefaultApplicationsClock, h, ctype)
        d[f"maxboost.{cname}"] = attempt(N.nvmlDeviceGetMaxCustomerBoostClock, h, ctype)
    d["perf_modes"] = attempt(getattr(N, "nvmlDeviceGetPerformanceModes", lambda h: "absent"), h)
    d["cur_clock_freqs"] = attempt(
        getattr(N, "nvmlDeviceGetCurrentClockFreqs", lambda h: "absent"), h
    )
    d["gpc_clk_min_max"] = attempt(
        getattr(N, "nvmlDeviceGetGpcClkMinMaxVfOffset", lambda h: "absent"), h
    )
    d["mem_clocks"] = attempt(N.nvmlDeviceGetSupportedMemoryClocks, h)
    d["power_limit"] = attempt(N.nvmlDeviceGetPowerManagementLimit, h)
    d["enforced_limit"] = attempt(N.nvmlDeviceGetEnforcedPowerLimit, h)
    d["power_constraints"] = attempt(N.nvmlDeviceGetPowerManagementLimitConstraints, h)
    d["power_default"] = attempt(N.nvmlDeviceGetPowerManagementDefaultLimit, h)
    d["power"] = attempt(N.nvmlDeviceGetPowerUsage, h)
    d["temp"] = attempt(N.nvmlDeviceGetTemperature, h, N.NVML_TEMPERATURE_GPU)
    if hasattr(N, "nvmlDeviceGetTemperatureV"):
        d["tempV"] = str(attempt(N.nvmlDeviceGetTemperatureV, h, N.NVML_TEMPERATURE_GPU))
    for t in (
        "SHUTDOWN",
        "SLOWDOWN",
        "MEM_MAX",
        "GPU_MAX",
        "ACOUSTIC_MIN",
        "ACOUSTIC_CURR",
        "ACOUSTIC_MAX",
    ):
        tid = getattr(N, f"NVML_TEMPERATURE_THRESHOLD_{t}", None)
        if tid is not None:
            d[f"thr.{t}"] = attempt(N.nvmlDeviceGetTemperatureThreshold, h, tid)
    d["reasons_event"] = attempt(
        getattr(N, "nvmlDeviceGetCurrentClocksEventReasons", lambda h: "absent"), h
    )
    d["reasons_throttle"] = attempt(N.nvmlDeviceGetCurrentClocksThrottleReasons, h)
    d["supported_reasons"] = attempt(N.nvmlDeviceGetSupportedClocksThrottleReasons, h)
    d["energy"] = attempt(N.nvmlDeviceGetTotalEnergyConsumption, h)
    d["util"] = str(attempt(N.nvmlDeviceGetUtilizationRates, h))
    d["pstate"] = attempt(N.nvmlDeviceGetPerformanceState, h)
    d["memory"] = str(attempt(N.nvmlDeviceGetMemoryInfo, h))
    d["procs"] = str(attempt(N.nvmlDeviceGetComputeRunningProcesses, h))
    fids = [74, 75, 76, 77, 78, 79, 80, 81, 82, 186]
    vals = attempt(N.nvmlDeviceGetFieldValues, h, fids)
    if isinstance(vals, str):
        d["fields"] = vals
    else:
        d["fields"] = {
            str(v.fieldId): {
                "ret": v.nvmlReturn,
                "type": v.valueType,
                "ts": v.timestamp,
                "ull": v.value.ullVal,
                "d": v.value.dVal,
                "ui": v.value.uiVal,
            }
            for v in vals
        }
    t0 = time.perf_counter()
    for _ in range(1000):
        N.nvmlDeviceGetClockInfo(h, N.NVML_CLOCK_SM)
    d["cost_clock_us"] = (time.perf_counter() - t0) * 1e3
    out["gpu0"] = d
    text = json.dumps(out, indent=1, default=str)
    if len(sys.argv) > 2 and sys.argv[1] == "--json":
        with open(sys.argv[2], "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
