"""contrib/: the alert rules (promtool check/test rules), the Grafana dashboard, and gpuenvd
scraped by a real Prometheus server (Debian's `prometheus` package; .ci/run installs it)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "contrib" / "prometheus" / "gpuenv.rules.yml"
RULE_TESTS = ROOT / "contrib" / "prometheus" / "gpuenv.rules.test.yml"
DASHBOARD = ROOT / "contrib" / "grafana" / "gpuenv-dashboard.json"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (apt-get install prometheus; .ci/run does)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _served_text(tmp_path: Path) -> str:
    """One scrape of gpuenvd on the simulated GPU, a lock held (every family present)."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.clocks.journal import Journal
    from gpuenv.daemon.auth import Peer, parse_config
    from gpuenv.daemon.client import Client
    from gpuenv.daemon.metrics import render
    from gpuenv.daemon.server import Server

    alice = Peer(pid=os.getpid(), uid=50001, gid=50001, user="alice", groups=frozenset())
    backend = SimBackend("h100", n_gpus=1, state_file=tmp_path / "sim.json")
    from gpuenv.clocks.calibration_store import save_calibration

    save_calibration(backend.device_info(0).uuid, 1392, state_dir=tmp_path / "journal")
    server = Server(parse_config("[lock]\nuser:alice = all\n").with_socket(str(tmp_path / "s")),
                    backend, journal=Journal(tmp_path / "journal"), peer_of=lambda sock: alice)
    server.start()
    try:
        time.sleep(1.2)  # the energy and violation counters are read once a second
        server.ops.jobs.begin("7", "alice", [0], None, "not asked")  # a Slurm prolog's record
        with Client(server.address) as c, c.lock(sm=1350, gpus=[0]):
            return render(server).decode()
    finally:
        server.stop()
        backend.close()


def test_rules_pass_promtool_check_and_their_unit_tests() -> None:
    promtool = _tool("promtool")
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 8 rules found" in check.stdout
    test = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], capture_output=True,
                          text=True, timeout=60, cwd=RULE_TESTS.parent)
    assert test.returncode == 0, test.stdout + test.stderr


def test_the_exposition_passes_promtool_lint_but_for_dcgm_exporters_label_names(
        tmp_path: Path) -> None:
    """The one complaint allowed: dcgm-exporter's camelCase labels (UUID, modelName,
    Hostname), kept as it spells them so that the two exporters' series join."""
    promtool = _tool("promtool")
    out = subprocess.run([promtool, "check", "metrics"], input=_served_text(tmp_path),
                         capture_output=True, text=True, timeout=60)
    complaints = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert complaints, "promtool no longer objects to camelCase labels: drop this exception"
    other = [ln for ln in complaints if "label names should be written in 'snake_case'" not in ln]
    assert other == []


def test_dashboard_and_rules_ask_only_for_series_the_daemon_serves(tmp_path: Path) -> None:
    """A renamed metric must not leave a dashboard panel or an alert silently empty."""
    served = {ln.split("{")[0].split(" ")[0] for ln in _served_text(tmp_path).splitlines()
              if ln.startswith("gpuenv_")}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if "query" in v
              and isinstance(v["query"], dict)]
    asked = {m for e in exprs for m in re.findall(r"\bgpuenv_\w+", e)}
    asked |= set(re.findall(r"\bgpuenv_[a-z_]+\b", RULES.read_text()))
    assert len(asked) > 10
    assert asked <= served, asked - served


@pytest.fixture
def gpuenvd(tmp_path: Path) -> Iterator[int]:
    """`gpuenv daemon` on the simulated GPU with metrics on 127.0.0.1 (a free port)."""
    port = _free_port()
    env = {**os.environ, "GPUENV_BACKEND": "sim", "GPUENV_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuenv", "daemon", "--socket", str(tmp_path / "gpuenvd.sock"),
         "--metrics", f"127.0.0.1:{port}", "--log-level", "warning"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        _wait(lambda: _get(f"http://127.0.0.1:{port}/metrics"), 30, proc)
        yield port
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


def _wait(ready, seconds: float, proc: subprocess.Popen) -> object:  # type: ignore[type-arg]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = ready()
        if value:
            return value
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"exited with {proc.returncode}: {out}")
        time.sleep(0.3)
    raise AssertionError(f"not ready within {seconds} s")


def test_a_real_prometheus_scrapes_gpuenvd(gpuenvd: int, tmp_path: Path) -> None:
    """Prometheus scrapes the daemon every second; its query API then has gpuenv's series,
    with dcgm-exporter's join labels, and the daemon counts as up."""
    prometheus = _tool("prometheus")
    web = _free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n  - job_name: gpuenv\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{gpuenvd}']\n"
    )
    proc = subprocess.Popen(
        [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{web}", "--log.level=warn"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    api = f"http://127.0.0.1:{web}/api/v1/query?query="

    def query(q: str) -> list[dict] | None:  # type: ignore[type-arg]
        text = _get(api + urllib.parse.quote(q))
        result = json.loads(text)["data"]["result"] if text else None
        return result or None

    try:
        sm = _wait(lambda: query("gpuenv_sm_clock_mhz"), 60, proc)
        assert isinstance(sm, list)
        labels = sm[0]["metric"]
        assert labels["job"] == "gpuenv" and labels["gpu"] == "0"
        assert labels["UUID"].startswith("GPU-") and labels["modelName"].startswith("NVIDIA")
        assert {"pci_bus_id", "Hostname"} <= set(labels)
        assert float(sm[0]["value"][1]) > 0
        up = _wait(lambda: query('up{job="gpuenv"} == 1'), 30, proc)
        assert isinstance(up, list) and len(up) == 1
        rules = json.loads(_get(f"http://127.0.0.1:{web}/api/v1/rules") or "{}")
        names = {r["name"] for g in rules["data"]["groups"] for r in g["rules"]}
        assert "GpuenvLockNotHolding" in names
    finally:
        _stop(proc)
