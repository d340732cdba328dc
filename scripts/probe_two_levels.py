"""Issue 22's run-to-run miss on a real GPU (read-only): the 2048^3 bf16 matmul reads
~27.3 or ~28.2 us per gpuenv.bench call, every rep of a call at one level, and the
second level appeared only with triton's do_bench and heavy load between the calls
(scripts/probe_flush_mode.py). Does the level follow where the caching allocator put
the call's output or its L2 flush buffer? The speed benchmark's sequence for this one
kernel (idle or load, do_bench, gpuenv.bench), each call's value beside the addresses.

    GPUENV_READONLY=1 python3 scripts/probe_two_levels.py [--calls 16] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import triton.testing as tt

import gpuenv
from gpuenv.timing import cuda


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--json")
    args = ap.parse_args()
    a, b = (torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    heavy = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    outs: set[int] = set()
    flush: list[int] = []
    original = cuda.CudaEvents.__init__

    def seen_init(self, *aa, **kw):  # the address of each call's flush buffer
        original(self, *aa, **kw)
        if self._flush_buf is not None:
            flush.append(self._flush_buf.data_ptr())

    cuda.CudaEvents.__init__ = seen_init  # type: ignore[method-assign]

    def fn():
        out = a @ b
        outs.add(out.data_ptr())
        return out

    gpuenv.bench(fn)
    rows = []
    for i in range(args.calls):
        state = "hot" if i % 2 else "cold"
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            if state == "hot":
                for _ in range(8):
                    _ = heavy @ heavy
            torch.cuda.synchronize()
            if state == "cold":
                time.sleep(0.05)
        tt.do_bench(fn)
        outs.clear()
        flush.clear()
        m = gpuenv.bench(fn)
        rows.append(
            {
                "call": i,
                "state": state,
                "us": round(m.median_s * 1e6, 2),
                "out_ptrs": sorted(outs),
                "flush_ptr": flush[-1] if flush else None,
                "clock_mhz": m.extra.get("rep_clock_mhz_median"),
                "reserved_mib": torch.cuda.memory_reserved() >> 20,
            }
        )
        r = rows[-1]
        print(
            f"{i:2d} {state:4s} {r['us']:7.2f} us  out {[hex(p) for p in r['out_ptrs']]}  "
            f"flush {hex(r['flush_ptr'] or 0)}  clock {r['clock_mhz']:.0f}  "
            f"reserved {r['reserved_mib']} MiB",
            flush=True,
        )
    cut = statistics.median(r["us"] for r in rows)
    for lvl, pick in (("low", lambda r: r["us"] <= cut), ("high", lambda r: r["us"] > cut)):
        mine = [r for r in rows if pick(r)]
        print(
            f"{lvl}: {len(mine)} calls, {sorted({r['us'] for r in mine})}; outputs at "
            f"{sorted({hex(p) for r in mine for p in r['out_ptrs']})}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
