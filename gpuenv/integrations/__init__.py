"""Adapters that put gpuenv's telemetry into the benchmarking tools people already use.

- `gpuenv.integrations.triton`: triton.testing's do_bench, do_bench_cudagraph and
  set_gpu_clock with their signatures and return values, at triton's pace, measured
  by gpuenv.bench (telemetry, findings, verdict kept); patch_autotuner() (rank=True: the
  autotuner's choice is gpuenv.rank's).
- `gpuenv.integrations.inductor`: patch_inductor(): torch Inductor's max-autotune times
  each choice with gpuenv (rank=True: each selection's choice is gpuenv.rank's).
- `gpuenv.integrations.pytest_plugin`: `pytest --gpuenv` adds telemetry, findings
  and a verdict to each pytest-benchmark benchmark's extra_info (the pytest11 entry
  point `gpuenv` registers it).
- `gpuenv.integrations.torch_benchmark`: torch.utils.benchmark measurements with
  telemetry in `Measurement.metadata["gpuenv"]`; its Timer, Measurement and Compare
  subclass torch's (torch_classes, loaded on first use), the records are torch_record's.

Nothing here is imported by `import gpuenv`; the triton and torch adapters import
torch when used.
"""
