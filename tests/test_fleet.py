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


def _metrics(backend: SimBackend, tmp_path: Path) -> str:
    """gpuenvd's metrics page, its state directory tmp_path/state (then the backend closed)."""
    from gpuenv.daemon.metrics import render

    root = Peer(pid=os.getpid(), uid=0, gid=0, user="root", groups=frozenset())
    server = Server(
        parse_config("").with_socket(str(tmp_path / "s")),
        backend,
        journal=Journal(tmp_path / "state"),
        peer_of=lambda sock: root,
    )
    server.start()
    try:
        return render(server).decode()
    finally:
        server.stop()
        backend.close()


def test_each_calibrated_gpu_is_one_sustained_clock_gauge(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    backend = SimBackend("h100", n_gpus=2, state_file=tmp_path / "sim.json")
    uuid = backend.device_info(0).uuid
    save_calibration(uuid, 1392, state_dir=tmp_path / "state")  # root's `gpuenv calibrate`
    text = _metrics(backend, tmp_path)
    lines = [x for x in text.splitlines() if x.startswith("gpuenv_gpu_sustained_sm_mhz{")]
    assert len(lines) == 1 and f'UUID="{uuid}"' in lines[0] and lines[0].endswith(" 1392.0")


def test_root_s_last_check_is_gauges_per_gpu(tmp_path: Path) -> None:
    # `gpuenv check`'s figures on gpuenvd's metrics: each kernel's time and the sustained
    # clock, alone and all at once, and the GPU the check named (a lower power limit)
    pytest.importorskip("prometheus_client")
    from gpuenv.check import check_node
    from gpuenv.check.store import load_check, save_checks

    backend = SimBackend("h100", n_gpus=3, state_file=tmp_path / "sim.json")
    backend.set_power_limit(1, 450)
    report = check_node(backend, [0, 1, 2], budget_s=20)
    assert report.named == [1]
    save_checks(report, state_dir=tmp_path / "state")
    uuid = backend.device_info(1).uuid
    kept = load_check(uuid, state_dir=tmp_path / "state")
    assert kept is not None and kept.check == report.gpus[1]  # read back as it was
    text = _metrics(backend, tmp_path)

    def value(name: str, *labels: str) -> float:
        (line,) = [
            x
            for x in text.splitlines()
            if x.startswith(name + "{") and all(lb in x for lb in labels)
        ]
        return float(line.rsplit(" ", 1)[1])

    gpu1 = f'UUID="{uuid}"'
    assert value("gpuenv_check_named", gpu1) == 1.0
    assert value("gpuenv_check_named", 'gpu="0"') == 0.0
    assert value("gpuenv_check_rank", gpu1) == 3.0
    assert value("gpuenv_check_sm_mhz", gpu1, 'phase="alone"') == report.gpus[1].alone.sm_mhz
    sustained = value("gpuenv_check_seconds", gpu1, 'kernel="sustained"', 'phase="together"')
    assert sustained == report.gpus[1].together.sustained_s
    assert value("gpuenv_check_seconds", 'gpu="2"', 'kernel="tiny"', 'phase="alone"') > 0
    assert value("gpuenv_check_timestamp_seconds", gpu1) == kept.measured_at


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


def test_a_damaged_kept_check_is_refused_with_what_to_do(tmp_path: Path) -> None:
    from gpuenv.check.store import load_check
    from gpuenv.errors import ConfigError

    uuid = "GPU-00000000-0000-0000-0000-000000000000"
    (tmp_path / "checks").mkdir()
    (tmp_path / "checks" / f"{uuid}.json").write_text('{"measured_at": "yesterday"}')
    with pytest.raises(ConfigError) as err:
        load_check(uuid, state_dir=tmp_path)
    assert "damaged" in str(err.value) and "gpuenv check" in (err.value.hint or "")


def test_a_kept_check_not_as_written_is_no_gauge() -> None:
    # gpuenvd reads the kept check as plain JSON (it sits below gpuenv.check): a file that
    # is not as gpuenv.check.store writes it gives no gauge rather than a wrong one
    from gpuenv.daemon.fleet import _check_figures

    good = {"measured_at": 1.0, "check": {"rank": 2, "slower": ["x"], "alone": {}}}
    assert _check_figures(good) == ({}, {}, True, 2.0, 1.0)
    for bad in ({}, {"measured_at": "now", "check": {"rank": 1}}, {"measured_at": 1.0}):
        assert _check_figures(bad) is None
    odd = {"measured_at": 1.0, "check": {"rank": 1, "alone": {"times_s": {"copy": "1 ms"}}}}
    assert _check_figures(odd) == ({}, {}, False, 1.0, 1.0)  # a value that is no number
