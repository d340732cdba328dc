"""patch_inductor: torch Inductor's max-autotune times its choices with gpuenv.

    from gpuenv.integrations.inductor import patch_inductor
    patch_inductor()                     # then torch.compile(mode="max-autotune") as usual

Inductor's benchmarker (`torch._inductor.runtime.benchmarking`: `InductorBenchmarker`,
`TritonBenchmarker`, `TorchProfilerBenchmarker`) times each autotuning choice with its
own CUDA events, one after the other, in whatever state the choices before it left the
GPU; it never calls `triton.testing.do_bench` (InductorBenchmarker), so
`patch_autotuner()` does not reach it. Patched, each class's `benchmark_gpu` times the
choice with gpuenv's do_bench drop-in (gpuenv.integrations.triton: gpuenv.bench's default
conditioning, each call begun on a cool, uncapped GPU, telemetry on every rep) and
returns the median of its reps in ms (Inductor's own returns the least of its events;
`return_mode="all"` every rep's time). Under `gpuenv run --autotune` this is installed in
the command when Inductor's benchmarking module is imported.

Each choice is so timed in the same GPU state; the choices are not yet ranked together
(paired and interleaved as gpuenv.rank does for triton's autotuner): that needs a hook in
Inductor's AlgorithmSelectorCache, which times choice after choice itself.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from gpuenv.errors import ConfigError

MODULE = "torch._inductor.runtime.benchmarking"
CLASSES = ("TritonBenchmarker", "InductorBenchmarker", "TorchProfilerBenchmarker")
_patched: dict[str, Any] = {}  # class name -> its own benchmark_gpu


def patch_inductor(**defaults: Any) -> None:
    """Make Inductor's benchmarkers time each choice with gpuenv (the module docstring).
    `defaults` go to every do_bench call (its keywords: `warmup=`, `rep=`, `condition=`,
    `backend=`, ...). Undo with `unpatch_inductor()`."""
    from gpuenv.integrations.triton.bench import do_bench

    unknown = sorted(set(defaults) - set(inspect.signature(do_bench).parameters))
    if unknown:
        raise ConfigError(
            f"patch_inductor got unknown settings: {', '.join(unknown)}",
            hint="pass keywords of gpuenv.integrations.triton.do_bench",
        )
    try:
        import importlib

        module = importlib.import_module(MODULE)
    except ImportError as err:
        raise ConfigError(
            "patch_inductor needs torch with Inductor", hint="pip install torch"
        ) from err
    unpatch_inductor()
    for name in CLASSES:
        cls = getattr(module, name, None)
        if isinstance(cls, type) and "benchmark_gpu" in vars(cls):
            _patched[name] = (cls, vars(cls)["benchmark_gpu"])
            cls.benchmark_gpu = _benchmark_gpu(defaults)  # type: ignore[attr-defined]
    if not _patched:
        raise ConfigError(
            f"{MODULE} has none of {', '.join(CLASSES)}: an Inductor gpuenv does not know",
            hint="report the torch version; until then max-autotune times choices itself",
        )


def unpatch_inductor() -> None:
    """Put back Inductor's own benchmark_gpu (nothing when patch_inductor was not called)."""
    for cls, orig in _patched.values():
        cls.benchmark_gpu = orig
    _patched.clear()


def _benchmark_gpu(defaults: dict[str, Any]) -> Callable[..., Any]:
    from gpuenv.integrations.triton.bench import do_bench

    @functools.wraps(do_bench)
    def benchmark_gpu(
        self: Any,
        _callable: Callable[[], Any],
        *args: Any,
        return_mode: str = "median",
        grad_to_none: Any = None,
        quantiles: Any = None,
        warmup: float | None = None,
        rep: float | None = None,
        **kwargs: Any,
    ) -> Any:
        del self, args, kwargs  # Inductor's own sizing (estimation_iters, ...): gpuenv's
        settings = dict(defaults)
        for key, value in (("warmup", warmup), ("rep", rep)):
            if value is not None:
                settings.setdefault(key, value)
        mode = "all" if return_mode == "all" else "median"
        return do_bench(
            _callable,
            grad_to_none=grad_to_none,
            quantiles=quantiles,
            return_mode=mode,
            name="inductor autotune",
            **settings,
        )

    benchmark_gpu.__gpuenv__ = True  # type: ignore[attr-defined]
    return benchmark_gpu


__all__ = ["CLASSES", "MODULE", "patch_inductor", "unpatch_inductor"]
