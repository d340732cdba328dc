"""The child process of benchmarks/autotune_rank.py: triton's tutorial 03 matmul kernel
(fp16, 4096^3; the kernel as benchmarks/workloads/perf_report_matmul.py has it), autotuned
over a case's configs by plain triton or by gpuenv (`patch_autotuner(rank=True)`).

    python benchmarks/workloads/autotune_matmul.py warm
    python benchmarks/workloads/autotune_matmul.py careful
    python benchmarks/workloads/autotune_matmul.py tune TUNER STATE TRIALS REST_S HOT_S TOPUP_S

`warm` compiles every config (triton's disk cache: the tuning runs then load them);
`careful` times every config with gpuenv.bench (its default: each burst from a cool,
uncapped GPU) and prints {config: median_s}; `tune` autotunes a fresh `@triton.autotune`
kernel of each case TRIALS times, each after REST_S of idle ("rested") or after heavy load
("hot": HOT_S of bf16 8192 matmuls before the first, TOPUP_S before each later one), and
prints a JSON line per autotune: case, tuner, state, winner, tie set, wall. Reads the GPU
only (run it with GPUENV_READONLY=1); needs torch and triton.
"""

import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

from benchmarks._kernels import GpuEnv
from benchmarks.autotune_rank import ranking_parts

K4 = 4096
# 8 configs: the two the issue saw plain triton choose (BM128/BN128/BK64, 3 and 4 stages)
# before the best (BM256/BN128/BK64), as a tuner lists them
MATMUL8 = [
    (128, 128, 64, 8, 3, 8),
    (128, 128, 64, 8, 4, 8),
    (128, 256, 64, 8, 3, 8),
    (256, 128, 64, 8, 3, 8),
    (64, 256, 32, 8, 4, 4),
    (128, 128, 32, 8, 4, 4),
    (128, 64, 32, 8, 4, 4),
    (64, 128, 32, 8, 4, 4),
]
# configs that differ only in the grouped ordering of the best one (BM128/BN256/BK64 on an
# H200): within about 1% of each other (the careful times say how close), and one ~7% behind
CLOSE = [
    (128, 256, 64, 4, 3, 8),
    (128, 256, 64, 8, 3, 8),
    (128, 256, 64, 16, 3, 8),
    (256, 128, 64, 8, 3, 8),
]
ALL_CASES = {"matmul8": MATMUL8, "close": CLOSE}
# the cases to run (benchmarks.autotune_rank --cases): AUTOTUNE_CASES=close, default all
CASES = {
    k: v
    for k, v in ALL_CASES.items()
    if k in (os.environ.get("AUTOTUNE_CASES") or ",".join(ALL_CASES)).split(",")
}


def config(bm, bn, bk, group, stages, warps):
    meta = {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": group}
    return triton.Config(meta, num_stages=stages, num_warps=warps)


def name_of(cfg):
    k = cfg.kwargs
    return (
        f"BM{k['BLOCK_SIZE_M']}/BN{k['BLOCK_SIZE_N']}/BK{k['BLOCK_SIZE_K']}/G{k['GROUP_SIZE_M']}"
        f" s{cfg.num_stages} w{cfg.num_warps}"
    )


@triton.jit
def matmul_kernel(
    a_ptr,
    b_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_am,
    stride_ak,
    stride_bk,
    stride_bn,
    stride_cm,
    stride_cn,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    GROUP_SIZE_M: tl.constexpr,
):
    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    offs_am = (pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)) % M
    offs_bn = (pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)) % N
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (offs_am[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = b_ptr + (offs_k[:, None] * stride_bk + offs_bn[None, :] * stride_bn)
    accumulator = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        a = tl.load(a_ptrs, mask=offs_k[None, :] < K - k * BLOCK_SIZE_K, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < K - k * BLOCK_SIZE_K, other=0.0)
        accumulator = tl.dot(a, b, accumulator)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        b_ptrs += BLOCK_SIZE_K * stride_bk
    c = accumulator.to(tl.float16)
    offs_cm = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_cn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + stride_cm * offs_cm[:, None] + stride_cn * offs_cn[None, :]
    c_mask = (offs_cm[:, None] < M) & (offs_cn[None, :] < N)
    tl.store(c_ptrs, c, mask=c_mask)


def tensors():
    a = torch.randn((K4, K4), device="cuda", dtype=torch.float16)
    b = torch.randn((K4, K4), device="cuda", dtype=torch.float16)
    return a, b, torch.empty((K4, K4), device="cuda", dtype=torch.float16)


def launch(kernel, a, b, c, **meta):
    def grid(m):
        return (triton.cdiv(K4, m["BLOCK_SIZE_M"]) * triton.cdiv(K4, m["BLOCK_SIZE_N"]),)

    kernel[grid](a, b, c, K4, K4, K4, *a.stride(), *b.stride(), *c.stride(), **meta)


def fresh(case):
    """A new @triton.autotune kernel over the case's configs: nothing tuned yet."""
    return triton.autotune([config(*c) for c in CASES[case]], key=["M", "N", "K"])(matmul_kernel)


def warm():
    a, b, c = tensors()
    for case in CASES:
        launch(fresh(case), a, b, c)
    torch.cuda.synchronize()
    print(json.dumps({"warm": True}))


def careful():
    import gpuenv

    a, b, c = tensors()
    out = {}
    seen = {tuple(cfg) for case in CASES.values() for cfg in case}
    for spec in sorted(seen):
        cfg = config(*spec)
        meta = {**cfg.kwargs, "num_stages": cfg.num_stages, "num_warps": cfg.num_warps}
        m = gpuenv.bench(lambda meta=meta: launch(matmul_kernel, a, b, c, **meta), budget_s=2.0)
        out[name_of(cfg)] = m.stats.median_s
    print(json.dumps({"careful": out}))


def heavy():
    """Heavy load: bf16 8192^3 matmuls back to back (GpuEnv.load)."""
    x = torch.randn((8192, 8192), device="cuda", dtype=torch.bfloat16)
    y = torch.randn((8192, 8192), device="cuda", dtype=torch.bfloat16)
    return GpuEnv(torch, lambda: x @ y)


def tune(tuner, state, trials, rest_s, hot_s, topup_s):
    if tuner == "gpuenv":
        from gpuenv.integrations import triton as gtriton

        gtriton.patch_autotuner(rank=True)
    a, b, c = tensors()
    load = heavy() if state == "hot" else None
    first = True
    for trial in range(trials):
        for case in CASES:
            torch.cuda.synchronize()
            if load is not None:
                load.load(hot_s if first else topup_s)
            else:
                time.sleep(rest_s)
            first = False
            kernel = fresh(case)
            t0 = time.perf_counter()
            launch(kernel, a, b, c)
            torch.cuda.synchronize()
            wall = time.perf_counter() - t0
            row = {"case": case, "tuner": tuner, "state": state, "trial": trial}
            row.update(winner=name_of(kernel.best_config), wall_s=wall)
            row["bench_s"] = getattr(kernel, "bench_time", None)
            if tuner == "gpuenv":
                r = gtriton.rankings()[-1]["ranking"]
                names = [name_of(config(*spec)) for spec in CASES[case]]
                by_label = dict(zip(r.order, names, strict=True))
                row["tied"] = [by_label[n] for n in r.tied]
                row["rounds"] = r.rounds
                row["calls"] = sum(c.rounds for c in r.candidates)
                row["rank_wall_s"] = r.wall_s
                row["parts"] = ranking_parts(r)
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "warm":
        warm()
    elif mode == "careful":
        careful()
    else:
        tuner, state = sys.argv[2], sys.argv[3]
        trials, rest_s, hot_s, topup_s = sys.argv[4:8]
        tune(tuner, state, int(trials), float(rest_s), float(hot_s), float(topup_s))
