"""The fleet view (gpuenv/daemon/fleet.py): each GPU's sustained clock on gpuenvd's metrics,
in every run's metadata, and `gpuenv compare` saying when the GPUs differ by more than the
change it reports. The recording rule and alert: tests/test_prometheus.py (promtool)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_compare import measure

from gpuenv.backend.sim import SimBackend
from gpuenv.clocks.calibration_store import save_calibration
from gpuenv.clocks.journal import Journal
from gpuenv.compare import compare_files, format_report
from gpuenv.daemon.auth import Peer, parse_config
from gpuenv.daemon.server import Server
from gpuenv.results import load_run


def test_each_calibrated_gpu_is_one_sustained_clock_gauge(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    from gpuenv.daemon.metrics import render

    root = Peer(pid=os.getpid(), uid=0, gid=0, user="root", groups=frozenset())
    backend = SimBackend("h100", n_gpus=2, state_file=tmp_path / "sim.json")
    server = Server(
        parse_config("").with_socket(str(tmp_path / "s")),
        backend,
        journal=Journal(tmp_path / "state"),
        peer_of=lambda sock: root,
    )
    uuid = backend.device_info(0).uuid
    save_calibration(uuid, 1392, state_dir=tmp_path / "state")  # root's `gpuenv calibrate`
    server.start()
    try:
        text = render(server).decode()
    finally:
        server.stop()
        backend.close()
    lines = [x for x in text.splitlines() if x.startswith("gpuenv_gpu_sustained_sm_mhz{")]
    assert len(lines) == 1 and f'UUID="{uuid}"' in lines[0] and lines[0].endswith(" 1392.0")


def test_compare_says_when_the_gpus_differ_more_than_the_code(tmp_path: Path) -> None:
    uuid = SimBackend().device_info(0).uuid
    save_calibration(uuid, 1400)
    a = measure(tmp_path / "a.jsonl", seed=1)
    save_calibration(uuid, 1320)  # "another node": a card that holds 5.7% less
    b = measure(tmp_path / "b.jsonl", seed=2)
    assert load_run(a).metadata["gpus"][0]["sustained_sm_mhz"] == 1400
    report = compare_files(str(a), str(b))
    (note,) = [c for c in report.env_changes if c.startswith("GPU sustained clock")]
    assert "1400 -> 1320 MHz (-5.7%)" in note and note in format_report(report)


def test_compare_is_quiet_when_the_gpus_hold_the_same_clock(tmp_path: Path) -> None:
    save_calibration(SimBackend().device_info(0).uuid, 1400)
    a = measure(tmp_path / "a.jsonl", seed=1)
    b = measure(tmp_path / "b.jsonl", seed=2)
    assert not [c for c in compare_files(str(a), str(b)).env_changes if "sustained" in c]
