"""The child process of benchmarks/inductor_waits.py: one `torch.compile(mode="max-autotune")`
of a function of three GEMMs (relu(a @ b) at 2048x1024x2048, 1024^3 and 512x4096x512, fp16),
three selections, under gpuenv's switch (`patch_inductor(rank=True)`), in a fresh process.
STATE `rested` leaves the GPU idle; `hot` runs HOT_S seconds of heavy load right before the
first selection's ranking only (after its choices compiled: load before torch.compile would
cool while they compile), as a model's first selection after a training step meets the GPU.

    python benchmarks/workloads/inductor_waits.py STATE [HOT_S]

Prints one JSON line: each selection in the order ranked, with its benchmark function's wall
(`wall_s`: the ranking and Inductor's pass handing it each choice's work), the ranking's
wait for a ready GPU (`waited_s`: `RankState.waited_s`), its winner and rounds. Reads the GPU
only (run it with GPUENV_READONLY=1); needs CUDA torch.
"""

import json
import sys
import time
from typing import Any

import torch

SHAPES = ((2048, 1024, 2048), (1024, 1024, 1024), (512, 4096, 512))  # M, K, N


def main(state: str, hot_s: str = "7") -> None:
    import torch._inductor.select_algorithm as select

    from benchmarks.workloads.inductor_mm import heavy_load
    from gpuenv.integrations import inductor

    if state not in ("rested", "hot"):
        raise SystemExit("usage: STATE in ('rested', 'hot') [HOT_S]")
    inductor.patch_inductor(rank=True)
    load = heavy_load() if state == "hot" else None
    walls: list[float] = []
    cls: Any = select.AlgorithmSelectorCache  # its hook replaced below
    own = vars(cls)["make_benchmark_fn"].__func__  # gpuenv's: the patch is in force

    def make_benchmark_fn(c, *args, **kwargs):
        fn = own(c, *args, **kwargs)

        def benchmark(choices):
            if load is not None and not walls:  # the first selection only
                load(float(hot_s))
            t0 = time.perf_counter()
            try:
                return fn(choices)
            finally:
                walls.append(time.perf_counter() - t0)

        return benchmark

    cls.make_benchmark_fn = classmethod(make_benchmark_fn)

    def f(a, b, c, d, e, g):  # one GEMM per SHAPES entry
        return torch.relu(a @ b), torch.relu(c @ d), torch.relu(e @ g)

    kw: dict[str, Any] = {"device": "cuda", "dtype": torch.float16}
    args = [t for m, k, n in SHAPES for t in (torch.randn(m, k, **kw), torch.randn(k, n, **kw))]
    torch.compile(f, mode="max-autotune")(*args)
    torch.cuda.synchronize()
    ranked = inductor.rankings()
    if len(ranked) != len(walls):
        raise SystemExit(f"{len(walls)} selections benchmarked, {len(ranked)} ranked")
    sels = [
        {
            "key": d["key"],
            "choices": len(d["choices"]),
            "wall_s": wall,
            "ranking_s": d["ranking"].wall_s,
            "waited_s": d["ranking"].state.waited_s,
            "winner": d["ranking"].winner,
            "rounds": d["ranking"].rounds,
        }
        for d, wall in zip(ranked, walls, strict=True)
    ]
    out = {"state": state, "selections": sels, "torch": torch.__version__}
    print(json.dumps({**out, "gpu": torch.cuda.get_device_name()}))


if __name__ == "__main__":
    main(*sys.argv[1:])
