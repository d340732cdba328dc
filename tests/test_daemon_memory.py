"""gpuenvd's memory stays flat under load (issue 21, item 7): a real gpuenvd on a socket in a
temp dir, driven by a client process with the mixed load of daemon_harness.mixed_load (new
connections, a long one, leases taken and released, status, subscribers).

This test drives 8,000 requests (15 s on 2 quiet cores); the figure at 100,000, before and
after the fix side by side, is `python -m benchmarks.daemon_memory`'s
(docs/benchmarks/daemon_memory.md).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from daemon_harness import ROOT, DaemonProcess

WARMUP = 4_000  # requests before the first reading: the allocators' own warm-up
MEASURED = 4_000  # requests between the two readings
# RSS growth allowed over MEASURED requests (131 bytes a request). Measured on a 2-core
# machine, side by side: +0.10 MB; the code before the fix +1.02 MB.
BOUND_MB = 0.5

LOAD = (
    "import sys\nsys.path.insert(0, sys.argv[3])\nfrom daemon_harness import mixed_load\n"
    "print(mixed_load(sys.argv[1], int(sys.argv[2])))\n"
)


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS in /proc/{pid}/status")


def _drive(d: DaemonProcess, requests: int) -> int:
    out = subprocess.run(
        [sys.executable, "-c", LOAD, d.socket, str(requests), str(ROOT / "tests")],
        env=d.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def test_the_daemon_memory_stays_flat_under_a_mixed_load() -> None:
    work = Path(tempfile.mkdtemp(prefix="gpuenv-mem-"))
    # the sampler's rings grow with time until full (bounded, not per request): at 10 s a
    # sample they stay out of what this test measures
    d = DaemonProcess(work, n_gpus=1, sample_period=10.0)
    try:
        d.start()
        assert d.proc is not None
        assert _drive(d, WARMUP) >= WARMUP
        before = _rss_mb(d.proc.pid)
        assert _drive(d, MEASURED) >= MEASURED
        after = _rss_mb(d.proc.pid)
        assert d.alive()
        assert after - before < BOUND_MB, (
            f"gpuenvd's RSS grew {after - before:.2f} MB over {MEASURED:,} requests after "
            f"{WARMUP:,} of warm-up ({before:.1f} -> {after:.1f} MB): over {BOUND_MB:.2f} MB"
        )
    finally:
        d.close()
        shutil.rmtree(work, ignore_errors=True)
