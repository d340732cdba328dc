"""The Prometheus endpoint: clocks, power, lock state and holder, lease counts."""

from __future__ import annotations

import os
import re
import socket
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


def _alice_server(tmp_path: Path, backend: SimBackend, *, metrics: bool = True) -> Server:
    """gpuenvd on `backend` (not started) that lets alice lock, with a metrics endpoint."""
    text = ("[daemon]\nmetrics = 127.0.0.1:0\n" if metrics else "") + "[lock]\nuser:alice = all\n"
    return Server(
        parse_config(text).with_socket(str(tmp_path / "s.sock")),
        backend,
        journal=Journal(tmp_path / "journal"),
        peer_of=lambda sock: ALICE,
    )


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
    server = _alice_server(tmp_path, backend)
    server.start()
    try:
        text = render(server).decode()
        assert _value(text, "gpuenv_lock_active", gpu="0") == 0
        assert _value(text, "gpuenv_lock_stale", gpu="0") == 0
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
        assert _value(scraped, "gpuenv_lock_holders", gpu="0", user="alice", kind="lease") == 1
        assert _value(scraped, "gpuenv_leases", kind="connection") == 1
        assert _value(scraped, "gpuenv_lease_grants_total") == 1
        assert _value(scraped, "gpuenv_energy_joules_total", gpu="0") is not None
        assert (
            _value(scraped, "gpuenv_clock_event_reason_seconds_total", gpu="0", reason="SwPowerCap")
            is not None
        )
        after = render(server).decode()
        assert _value(after, "gpuenv_lock_active", gpu="0") == 0
        assert _value(after, "gpuenv_lock_holders", gpu="0", user="alice") is None
        assert _value(after, "gpuenv_lease_releases_total") == 1
    finally:
        server.stop()
        backend.close()


def _labels(line: str) -> dict[str, str]:
    inside = line[line.index("{") + 1 : line.rindex("}")]
    return dict(re.findall(r'(\w+)="([^"]*)"', inside))


def test_series_join_dcgm_exporter_and_speak_one_reason_vocabulary(tmp_path: Path) -> None:
    """Every GPU series has dcgm-exporter's labels with its values (UUID, pci_bus_id as NVML
    gives them, modelName, Hostname); reasons use NVML's names in both reason metrics; no
    label names a process; power limit, thresholds, memory temperature and build info are
    there (so "power against its cap" and "temperature against slowdown" can be graphed)."""
    from gpuenv.daemon.metrics import render
    from gpuenv.reasons import REASON_NAMES

    backend = SimBackend("h100", n_gpus=2, state_file=tmp_path / "sim.json")
    server = _alice_server(tmp_path, backend, metrics=False)
    server.start()
    try:
        with Client(server.address) as c, c.lock(sm=1350, gpus=[1]):
            text = render(server).decode()
    finally:
        server.stop()
        backend.close()
    info = backend.device_info(1)
    series = [ln for ln in text.splitlines() if ln.startswith("gpuenv_") and "{" in ln]
    per_gpu = [ln for ln in series if 'gpu="' in ln]
    assert per_gpu and all(
        {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "hostname"}
        <= set(_labels(ln))
        for ln in per_gpu
    )
    assert all("pid" not in _labels(ln) for ln in series)
    one = _labels(
        next(ln for ln in per_gpu if ln.startswith("gpuenv_sm_clock_mhz") and 'gpu="1"' in ln)
    )
    host = socket.gethostname()  # as dcgm-exporter 4.x (Hostname) and its main branch (hostname)
    assert one == {
        "gpu": "1",
        "UUID": info.uuid,
        "pci_bus_id": info.pci_bus_id,
        "device": "nvidia1",
        "modelName": info.name,
        "Hostname": host,
        "hostname": host,
    }
    names = set(REASON_NAMES.values())
    for metric in ("gpuenv_clock_event_reason_active{", "gpuenv_clock_event_reason_seconds_total{"):
        reasons = {_labels(ln)["reason"] for ln in series if ln.startswith(metric)}
        assert reasons and all(set(r.split("|")) <= names for r in reasons), reasons
    assert _value(text, "gpuenv_power_limit_watts", gpu="1") == 700
    assert _value(text, "gpuenv_temperature_threshold_celsius", gpu="1", threshold="slowdown") == 89
    assert (
        _value(text, "gpuenv_temperature_threshold_celsius", gpu="1", threshold="gpu_max_operating")
        == 87
    )
    assert _value(text, "gpuenv_memory_temperature_celsius", gpu="1") is not None
    assert _value(text, "gpuenv_build_info") == 1
    assert _value(text, "gpuenv_lock_active", gpu="1") == 1
    assert _value(text, "gpuenv_lock_active", gpu="0") == 0


def test_a_host_alone_gets_the_default_port_which_is_not_dcgm_exporters() -> None:
    from gpuenv.daemon.auth import parse_listen
    from gpuenv.daemon.metrics import DEFAULT_PORT

    assert parse_listen("0.0.0.0") == ("0.0.0.0", DEFAULT_PORT)
    assert parse_listen("localhost") == ("localhost", DEFAULT_PORT)
    assert parse_listen("::1") == ("::1", DEFAULT_PORT)
    assert parse_listen("9500") == ("127.0.0.1", 9500)
    assert parse_config("[daemon]\nmetrics = 127.0.0.1\n").metrics == "127.0.0.1"
    # 9100-9999: the Prometheus wiki's exporter range, fully allocated (9400: dcgm-exporter)
    assert not 9100 <= DEFAULT_PORT <= 9999


# -- the HTTP side under a flood (metrics_http.py) ------------------------------------------------


def _scrape(port: int, method: str = "GET") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(f"{method} /metrics HTTP/1.0\r\n\r\n".encode())
        data = b""
        while chunk := c.recv(65536):
            data += chunk
    return data


def test_a_scrape_flood_is_served_one_rendered_page_until_it_ages() -> None:
    """Every scrape within SNAPSHOT_S is sent the bytes rendered once: 30 scrapes over
    0.3 s of the endpoint's clock render the page once, and one more after SNAPSHOT_S
    renders it again."""
    from gpuenv.daemon.metrics_http import SNAPSHOT_S, MetricsHTTP

    now = [100.0]
    renders: list[int] = []

    def render() -> bytes:
        renders.append(1)
        return f"gpuenv_test {len(renders)}\n".encode()

    http = MetricsHTTP("127.0.0.1", 0, render, clock=lambda: now[0])
    try:
        pages = set()
        for _ in range(30):
            now[0] += 0.01  # (the accept pace refills on the same clock)
            pages.add(_scrape(http.port))
        assert len(renders) == 1 and len(pages) == 1
        (page,) = pages
        assert page.startswith(b"HTTP/1.1 200") and page.endswith(b"gpuenv_test 1\n")
        head = _scrape(http.port, "HEAD")
        assert page.startswith(head) and head.endswith(b"\r\n\r\n") and b"gpuenv_test" not in head
        now[0] += SNAPSHOT_S
        assert _scrape(http.port).endswith(b"gpuenv_test 2\n") and len(renders) == 2
        assert http.served == 32
    finally:
        http.stop()


def test_the_endpoint_takes_hundreds_of_scrapes_a_second_in_bounded_bursts() -> None:
    """The accept pace lets a flood through at ACCEPTS_PER_S, at least 200 scrapes a second
    (it was 50: a flood then got 54 a second), never more than a tenth of a second's worth
    at once. A scrape asked every millisecond for a second of the pace's clock:"""
    from gpuenv.daemon.metrics_http import ACCEPTS_PER_S, BURST_S, AcceptPace

    now = [0.0]
    pace = AcceptPace(ACCEPTS_PER_S, clock=lambda: now[0])
    taken = 0
    for _ in range(1000):
        now[0] += 0.001
        pace.refill()
        taken += pace.take()
    assert 200 <= taken <= ACCEPTS_PER_S * (1 + BURST_S)
    now[0] += 60.0  # a quiet minute fills the bucket only to its size
    pace.refill()
    burst = 0
    while pace.take():
        burst += 1
    assert burst == int(ACCEPTS_PER_S * BURST_S)


def test_a_scrape_stopped_in_the_middle_of_its_render_holds_up_no_lease(tmp_path: Path) -> None:
    """The exposition is built on the endpoint's own thread from what the lease manager
    lets it copy, never while a journal or a GPU is written: a render stopped inside a
    driver read (a slow NVML call) holds up no lock, release or status request."""
    import threading

    from gpuenv.backend import PowerLimits

    gate, inside = threading.Event(), threading.Event()

    class SlowReads(SimBackend):
        def power_limits(self, index: int) -> PowerLimits:
            if threading.current_thread().name == "gpuenvd-metrics":
                inside.set()
                gate.wait(30)
            return super().power_limits(index)

    backend = SlowReads("h100", n_gpus=1, state_file=tmp_path / "sim.json")
    server = _alice_server(tmp_path, backend)
    server.start()
    try:
        scrape = threading.Thread(target=_scrape, args=(server._metrics.port,), daemon=True)
        scrape.start()
        assert inside.wait(10)  # the render is stopped in its driver read
        with Client(server.address, timeout=10) as c:
            for sm in (1350, 1500, 1350):  # each changes the GPU's state: journal and GPU
                c.lock(sm=sm, gpus=[0]).release()
            assert c.status()["daemon"]["grants"] == 3
        assert server._metrics.http.renders == 0  # still inside the first one
        gate.set()
        scrape.join(10)
        assert server._metrics.http.renders == 1
    finally:
        gate.set()
        server.stop()
        backend.close()
