# ruff: noqa: E501  (the tutorial's lines, as triton writes them)
"""triton's tutorial 01-vector-add as a user runs it: a perf_report sweep, unmodified.

The kernel, `add`, the Benchmark (16 sizes x triton / torch, quantiles=[0.5, 0.2,
0.8]) and `benchmark.run(print_data=True, show_plots=True)` are the tutorial's;
only the save path (an optional argument) and a fallback for a triton without
`get_active_torch_device` are added. Run it under `gpuenv run` to see a verdict
per point (32 measurements, named `vector-add-performance size=4096
provider=triton`), the grid of verdicts on stderr, and
`<save_path>/vector-add-performance.gpuenv.csv` beside triton's CSV:

    GPUENV_READONLY=1 MPLBACKEND=Agg gpuenv run -i 0 -o vadd.jsonl -- \\
        python3 benchmarks/workloads/perf_report_vadd.py /tmp/vadd

Reads the GPU only (gpuenv run without --sm locks nothing); needs torch, triton,
pandas and matplotlib.
"""

import sys

import torch
import triton
import triton.language as tl

try:
    DEVICE = triton.runtime.driver.active.get_active_torch_device()
except AttributeError:  # triton < 3.2
    DEVICE = torch.device("cuda")


@triton.jit
def add_kernel(x_ptr,  # *Pointer* to first input vector.
               y_ptr,  # *Pointer* to second input vector.
               output_ptr,  # *Pointer* to output vector.
               n_elements,  # Size of the vector.
               BLOCK_SIZE: tl.constexpr,  # Number of elements each program should process.
               ):
    pid = tl.program_id(axis=0)
    block_start = pid * BLOCK_SIZE
    offsets = block_start + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    output = x + y
    tl.store(output_ptr + offsets, output, mask=mask)


def add(x: torch.Tensor, y: torch.Tensor):
    output = torch.empty_like(x)
    assert x.device == DEVICE and y.device == DEVICE and output.device == DEVICE
    n_elements = output.numel()
    grid = lambda meta: (triton.cdiv(n_elements, meta['BLOCK_SIZE']), )  # noqa: E731
    add_kernel[grid](x, y, output, n_elements, BLOCK_SIZE=1024)
    return output


@triton.testing.perf_report(
    triton.testing.Benchmark(
        x_names=['size'],  # Argument names to use as an x-axis for the plot.
        x_vals=[2**i for i in range(12, 28, 1)],  # Different possible values for `x_name`.
        x_log=True,  # x axis is logarithmic.
        line_arg='provider',  # Argument name whose value corresponds to a different line in the plot.
        line_vals=['triton', 'torch'],  # Possible values for `line_arg`.
        line_names=['Triton', 'Torch'],  # Label name for the lines.
        styles=[('blue', '-'), ('green', '-')],  # Line styles.
        ylabel='GB/s',  # Label name for the y-axis.
        plot_name='vector-add-performance',  # Name for the plot. Used also as a file name for saving the plot.
        args={},  # Values for function arguments not in `x_names` and `y_name`.
    ))
def benchmark(size, provider):
    x = torch.rand(size, device=DEVICE, dtype=torch.float32)
    y = torch.rand(size, device=DEVICE, dtype=torch.float32)
    quantiles = [0.5, 0.2, 0.8]
    if provider == 'torch':
        ms, min_ms, max_ms = triton.testing.do_bench(lambda: x + y, quantiles=quantiles)
    if provider == 'triton':
        ms, min_ms, max_ms = triton.testing.do_bench(lambda: add(x, y), quantiles=quantiles)
    gbps = lambda ms: 3 * x.numel() * x.element_size() * 1e-9 / (ms * 1e-3)  # noqa: E731
    return gbps(ms), gbps(max_ms), gbps(min_ms)


benchmark.run(print_data=True, show_plots=True, save_path=sys.argv[1] if len(sys.argv) > 1 else '')
