"""gpuenv: GPU benchmark numbers you can trust.

    import gpuenv
    with gpuenv.stable(sm=1350, policy="reject") as env:
        with env.measure("step") as m:
            train_step()
    print(m.telemetry, m.verdict)

Public names are imported lazily: `import gpuenv` is cheap and never imports
torch or pynvml.
"""

from __future__ import annotations

from gpuenv._lazy import lazy_exports

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS: dict[str, str] = {
    "Backend": "gpuenv.backend",
    "bench": "gpuenv.timing",
    "bench_pair": "gpuenv.timing",
    "ClockState": "gpuenv.clocks",
    "LockRequest": "gpuenv.clocks",
    "lock": "gpuenv.locking",
    "restore": "gpuenv.locking",
    "GpuenvError": "gpuenv.errors",
    "Measurement": "gpuenv.results",
    "Run": "gpuenv.results",
    "Sampler": "gpuenv.telemetry",
    "VerdictConfig": "gpuenv.verdict",
    "Window": "gpuenv.telemetry",
    "load_run": "gpuenv.results",
    "stable": "gpuenv.session",
    "open_backend": "gpuenv.backend",
    "region": "gpuenv.run.region",
    "rank": "gpuenv.timing.rank",
    "Ranking": "gpuenv.timing.rank",
}


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

__all__ = sorted(_EXPORTS)
