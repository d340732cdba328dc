"""Issue 22's run-to-run miss on a real GPU (read-only): the 2048^3 bf16 matmul reads
~27.3 or ~28.2 us per gpuenv.bench call, a mode chosen per call. Is it the L2 flush
buffer each call allocates afresh? Calls with a fresh buffer (today) and with one buffer
kept for the process, alternating, plus calls with the output written into one tensor.

    GPUENV_READONLY=1 python3 scripts/probe_flush_mode.py [--calls 8] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import gpuenv
from gpuenv.timing import cuda

_SHARED: dict[str, object] = {}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--json")
    args = ap.parse_args()
    a, b = (torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    out = torch.empty(2048, 2048, device="cuda", dtype=torch.bfloat16)
    fns = {"a @ b": lambda: a @ b, "matmul(out=)": lambda: torch.matmul(a, b, out=out)}
    original = cuda.CudaEvents.__init__

    def shared_init(self, *aa, **kw):  # one flush buffer for the process
        original(self, *aa, **kw)
        if self._flush_buf is not None:
            key = str(self._flush_buf.numel())
            buf = _SHARED.setdefault(key, self._flush_buf)
            self._flush_buf = buf

    rows = []
    for name, fn in fns.items():
        gpuenv.bench(fn)  # set-up
        for i in range(args.calls):
            for variant in ("fresh", "shared"):
                cuda.CudaEvents.__init__ = shared_init if variant == "shared" else original
                time.sleep(0.3)
                m = gpuenv.bench(fn)
                rows.append(
                    {"fn": name, "variant": variant, "call": i, "median_us": m.stats.median_s * 1e6}
                )
                print(json.dumps(rows[-1]), flush=True)
    cuda.CudaEvents.__init__ = original
    for name in fns:
        for variant in ("fresh", "shared"):
            v = [r["median_us"] for r in rows if r["fn"] == name and r["variant"] == variant]
            spread = (max(v) - min(v)) / statistics.median(v) * 100
            print(
                f"{name:14s} {variant:6s}: {min(v):.2f}-{max(v):.2f} us "
                f"(spread {spread:.2f}%): " + " ".join(f"{x:.1f}" for x in v)
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                    "gpu": torch.cuda.get_device_name(),
                    "rows": rows,
                },
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
