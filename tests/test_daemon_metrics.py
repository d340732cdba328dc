"""The Prometheus endpoint: clocks, power, lock state and holder, lease counts."""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import pytest

from gpuenv.backend.sim import SimBackend
from gpuenv.clocks.journal import Journal
from gpuenv.daemon.auth import Peer, parse_config
from gpuenv.daemon.client import Client
from gpuenv.daemon.server import Server

pytest.importorskip("prometheus_client")

ALICE = Peer(pid=os.getpid(), uid=50001, gid=50001, user="alice", groups=frozenset())


def _value(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if not line.startswith((name + "{", name + " ")):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_metrics_show_clocks_and_who_holds_the_lock(tmp_path: Path) -> None:
    from gpuenv.daemon.metrics import render

    backend = SimBackend("h100", n_gpus=1, state_file=tmp_path / "sim.json")
    config = parse_config("[daemon]\nmetrics = 127.0.0.1:0\n[lock]\nuser:alice = all\n")
    server = Server(
        config.with_socket(str(tmp_path / "s.sock")),
        backend,
        journal=Journal(tmp_path / "journal"),
        peer_of=lambda sock: ALICE,
    )
    server.start()
    try:
        text = render(server).decode()
        assert _value(text, "gpuenv_lock_active", gpu="0") == 0
        assert _value(text, "gpuenv_sm_clock_mhz", gpu="0") == 345  # idle
        assert _value(text, "gpuenv_clock_event_reason_active", gpu="0", reason="GpuIdle") == 1
        assert _value(text, "gpuenv_power_watts", gpu="0") > 0  # type: ignore[operator]
        with Client(server.address) as c, c.lock(sm=1350, gpus=[0]):
            backend.open_context(0)
            port = server._metrics.port
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
                scraped = resp.read().decode()
            backend.close_context(0)
        assert _value(scraped, "gpuenv_lock_active", gpu="0") == 1
        assert _value(scraped, "gpuenv_lock_sm_mhz", gpu="0", bound="max") == 1350
        assert _value(scraped, "gpuenv_lock_holder", gpu="0", user="alice", kind="lease") == 1
        assert _value(scraped, "gpuenv_leases", kind="connection") == 1
        assert _value(scraped, "gpuenv_lease_grants_total") == 1
        assert _value(scraped, "gpuenv_energy_joules_total", gpu="0") is not None
        assert (
            _value(scraped, "gpuenv_clock_event_reason_seconds_total", gpu="0", reason="power")
            is not None
        )
        after = render(server).decode()
        assert _value(after, "gpuenv_lock_active", gpu="0") == 0
        assert _value(after, "gpuenv_lock_holder", gpu="0", user="alice") is None
        assert _value(after, "gpuenv_lease_releases_total") == 1
    finally:
        server.stop()
        backend.close()
