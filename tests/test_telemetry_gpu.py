"""Telemetry on a real GPU (read-only): power capping and a cold start are seen and named.

Runs on the device machine with GPUENV_READONLY=1: nothing here writes a GPU
setting (stable() is never asked to lock). Needs torch with CUDA. The cold-start
test runs first and in a fresh process: it needs a GPU with no CUDA context on it
(run this file on its own, before anything in the pytest process touches CUDA).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.gpu


def _torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


_COLD_START = textwrap.dedent(
    """
    import json, sys, time
    import gpuenv
    from gpuenv.backend import REASON_GPU_IDLE, open_backend

    backend = open_backend()
    # every GPU (not "cuda:0": mapping CUDA indices may run CUDA in a helper process,
    # which would wake the GPU before the cold start we want to see)
    with gpuenv.stable(backend=backend) as env:
        time.sleep(0.2)  # a few samples from before the context
        before = [env.sampler.latest(g) for g in env.gpus]
        if any(s is None or not s.reasons & REASON_GPU_IDLE for s in before):
            print(json.dumps({"skip": "a GPU is not idle before our context "
                              "(another process holds one)"}))
            sys.exit(0)
        import torch  # the CUDA context is created right here, then measured at once

        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        times, spans = [], []
        for _ in range(30):
            t0 = env.sampler.mark()
            for _ in range(8):
                a @ b
            torch.cuda.synchronize()
            t1 = env.sampler.mark()
            times.append(t1 - t0)
            spans.append((t0, t1))
        m = env.record("cold start", times, spans)
    print(json.dumps(m.to_dict()))
    """
)


def test_cold_start_right_after_context_creation_carries_warmup_ramp_for_the_first_reps():
    _torch()
    # a fresh process: the sampler starts before the CUDA context exists
    out = subprocess.run(
        [sys.executable, "-c", _COLD_START],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
        check=False,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in data:
        pytest.skip(data["skip"])
    from gpuenv.results import Measurement

    m = Measurement.from_dict(data)
    print(m)
    ramp = {f.kind: f for f in m.findings}.get("warmup_ramp")
    assert ramp is not None, f"no warmup_ramp in:\n{m}"
    assert 0 in ramp.reps
    assert max(ramp.reps) < 10  # the first reps, not later
    assert all(i not in ramp.reps for i in range(15, 30))


def test_sustained_bf16_matmul_carries_power_cap_with_time_under_it_and_the_clock():
    torch = _torch()
    import gpuenv
    from gpuenv.backend import REASON_SW_POWER_CAP, open_backend
    from gpuenv.devices import select_gpus

    backend = open_backend()
    gpus = select_gpus(backend, "cuda:0")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()

    def batch() -> None:  # ~0.5 s of back-to-back matmuls (~1.4-1.6 ms each on an H100)
        for _ in range(320):
            a @ b
        torch.cuda.synchronize()

    with gpuenv.stable(backend=backend, gpus=gpus) as env:
        assert not env.locked
        m = env.repeat(batch, reps=20, name="matmul 8192 bf16")  # ~10 s sustained
    print(m)  # what a user sees, for the device log
    cap = {f.kind: f for f in m.findings}.get("power_cap")
    assert cap is not None, f"no power_cap finding in:\n{m}"
    assert cap.details["time_under_cap_s"] > 2.0
    assert cap.details["sm_mhz_mean"] < cap.details["max_sm_mhz"]
    assert "clock_cost_mhz" in cap.details
    late = m.windows[-5:]
    assert all(w.reasons & REASON_SW_POWER_CAP for w in late)
    for w in late:  # the cumulative counter where NVML has it, else the sampled reasons
        under = w.reason_s.get("power", w.reason_sampled_s.get("SwPowerCap", 0.0))
        assert under > 0.5 * w.duration_s
    assert all(w.power_w_mean is not None and w.power_w_mean > 400 for w in late)
    assert m.telemetry is not None and m.telemetry.energy_j and m.telemetry.energy_j > 1000
