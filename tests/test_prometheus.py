"""gpuenv/ops/: the alert rules (promtool check/test rules), the Grafana dashboard, and gpuenvd
scraped by a real Prometheus server (Debian's `prometheus` package; .ci/run installs it)."""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuenv import ops

pytest.importorskip("prometheus_client")

# the copies `gpuenv ops` prints and installs
RULES = ops.packaged("rules")
RULE_TESTS = ops.packaged("rules-test")
DASHBOARD = ops.packaged("dashboard")


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
    server = Server(
        parse_config("[lock]\nuser:alice = all\n").with_socket(str(tmp_path / "s")),
        backend,
        journal=Journal(tmp_path / "journal"),
        peer_of=lambda sock: alice,
    )
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
    check = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 8 rules found" in check.stdout
    test = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=RULE_TESTS.parent,
    )
    assert test.returncode == 0, test.stdout + test.stderr


def test_the_exposition_passes_promtool_lint_but_for_dcgm_exporters_label_names(
    tmp_path: Path,
) -> None:
    """The one complaint allowed: dcgm-exporter's camelCase labels (UUID, modelName,
    Hostname), kept as it spells them so that the two exporters' series join."""
    promtool = _tool("promtool")
    out = subprocess.run(
        [promtool, "check", "metrics"],
        input=_served_text(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    complaints = [ln for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    assert complaints, "promtool no longer objects to camelCase labels: drop this exception"
    other = [ln for ln in complaints if "label names should be written in 'snake_case'" not in ln]
    assert other == []


def test_dashboard_and_rules_ask_only_for_series_the_daemon_serves(tmp_path: Path) -> None:
    """A renamed metric must not leave a dashboard panel or an alert silently empty."""
    served = {
        ln.split("{")[0].split(" ")[0]
        for ln in _served_text(tmp_path).splitlines()
        if ln.startswith("gpuenv_")
    }
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [
        v["query"]["query"]
        for v in dashboard["templating"]["list"]
        if "query" in v and isinstance(v["query"], dict)
    ]
    asked = {m for e in exprs for m in re.findall(r"\bgpuenv_\w+", e)}
    asked |= set(re.findall(r"\bgpuenv_[a-z_]+\b", RULES.read_text()))
    assert len(asked) > 10
    assert asked <= served, asked - served


@pytest.fixture
def gpuenvd(tmp_path: Path) -> Iterator[int]:
    """`gpuenv daemon` on the simulated GPU with metrics on 127.0.0.1 (a free port)."""
    env = {**os.environ, "GPUENV_BACKEND": "sim", "GPUENV_STATE_DIR": str(tmp_path / "state")}
    with _serving(tmp_path, env) as port:
        yield port


@contextlib.contextmanager
def _serving(tmp_path: Path, env: dict[str, str]) -> Iterator[int]:
    """`gpuenv daemon` with metrics on a free port of 127.0.0.1, once it answers a scrape."""
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuenv",
            "daemon",
            "--socket",
            str(tmp_path / "gpuenvd.sock"),
            "--metrics",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
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


Query = Callable[[str], "list[dict[str, Any]] | None"]


@contextlib.contextmanager
def _prometheus(tmp_path: Path, config: str) -> Iterator[tuple[subprocess.Popen, Query, str]]:  # type: ignore[type-arg]
    """Debian's Prometheus on a free port of 127.0.0.1 with `config` (prometheus.yml's text):
    the process, a function that asks its query API (None: no result yet), its API's URL."""
    prometheus = _tool("prometheus")
    path = tmp_path / "prometheus.yml"
    path.write_text(config)
    web = _free_port()
    proc = subprocess.Popen(
        [
            prometheus,
            f"--config.file={path}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web}",
            "--log.level=warn",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    def query(q: str) -> list[dict] | None:  # type: ignore[type-arg]
        text = _get(f"{api}/query?query=" + urllib.parse.quote(q))
        body = json.loads(text) if text else {}
        assert body.get("status", "success") == "success", (q, body)
        return body.get("data", {}).get("result") or None

    api = f"http://127.0.0.1:{web}/api/v1"
    try:
        yield proc, query, api
    finally:
        _stop(proc)


def test_a_real_prometheus_scrapes_gpuenvd(gpuenvd: int, tmp_path: Path) -> None:
    """Prometheus scrapes the daemon every second; its query API then has gpuenv's series,
    with dcgm-exporter's join labels, and the daemon counts as up."""
    config = (
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        f"rule_files: ['{RULES}']\n"
        "scrape_configs:\n  - job_name: gpuenv\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{gpuenvd}']\n"
    )
    with _prometheus(tmp_path, config) as (proc, query, api):
        sm = _wait(lambda: query("gpuenv_sm_clock_mhz"), 60, proc)
        assert isinstance(sm, list)
        labels = sm[0]["metric"]
        assert labels["job"] == "gpuenv" and labels["gpu"] == "0"
        assert labels["UUID"].startswith("GPU-") and labels["modelName"].startswith("NVIDIA")
        assert {"pci_bus_id", "Hostname"} <= set(labels)
        assert float(sm[0]["value"][1]) > 0
        up = _wait(lambda: query('up{job="gpuenv"} == 1'), 30, proc)
        assert isinstance(up, list) and len(up) == 1
        rules = json.loads(_get(f"{api}/rules") or "{}")
        names = {r["name"] for g in rules["data"]["groups"] for r in g["rules"]}
        assert "GpuenvLockNotHolding" in names


# -- beside dcgm-exporter: gpuenv ops show scrape, and the docs' joins -----------------------

SCRAPE = ops.packaged("scrape")


def _labels_of(line: str) -> dict[str, str]:
    return dict(re.findall(r'(\w+)="([^"]*)"', line))


def _fake_dcgm_exporter(gpus: list[dict[str, str]]) -> tuple[object, int]:
    """An HTTP endpoint speaking dcgm-exporter's exposition for the same GPUs (same UUIDs),
    SM clock with its release's `Hostname`, temperature with its main branch's `hostname`."""
    import http.server
    import threading

    lines = []
    for g in gpus:
        common = (
            f'gpu="{g["gpu"]}",UUID="{g["UUID"]}",pci_bus_id="{g["pci_bus_id"]}",'
            f'device="nvidia{g["gpu"]}",modelName="{g["modelName"]}"'
        )
        lines.append(f'DCGM_FI_DEV_SM_CLOCK{{{common},Hostname="{g["Hostname"]}"}} 1980')
        lines.append(f'DCGM_FI_DEV_GPU_TEMP{{{common},hostname="{g["Hostname"]}"}} 36')
    body = (
        "# TYPE DCGM_FI_DEV_SM_CLOCK gauge\n# TYPE DCGM_FI_DEV_GPU_TEMP gauge\n"
        + "\n".join(sorted(lines))
        + "\n"
    ).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the name http.server calls
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, int(httpd.server_address[1])


@pytest.fixture
def two_gpus_one_locked(tmp_path: Path) -> Iterator[int]:
    """gpuenvd on two simulated GPUs, GPU 0 locked by `gpuenv lock` (GPU 1 not)."""
    env = {
        **os.environ,
        "GPUENV_BACKEND": "sim",
        "GPUENV_SIM_GPUS": "2",
        "GPUENV_STATE_DIR": str(tmp_path / "state"),
    }
    lock = subprocess.run(
        [sys.executable, "-m", "gpuenv", "lock", "--sm", "1350", "-i", "0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert lock.returncode == 0, lock.stdout + lock.stderr
    try:
        with _serving(tmp_path, env) as port:
            yield port
    finally:
        subprocess.run(
            [sys.executable, "-m", "gpuenv", "restore"], env=env, capture_output=True, timeout=60
        )


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def _readme_promql() -> list[tuple[str, str]]:
    """(query, its comment) of each line of the docs' PromQL block beside dcgm-exporter."""
    from docs_harness import find_block

    block = find_block("promql", "DCGM_FI_DEV_SM_CLOCK").text
    pairs = [line.partition("#") for line in block.splitlines() if line.strip()]
    return [(q.strip(), comment.strip()) for q, _, comment in pairs]


def test_beside_dcgm_exporter_the_scrape_snippet_and_the_readme_joins_work(
    two_gpus_one_locked: int, tmp_path: Path
) -> None:
    """With the scrape jobs gpuenv ships (gpuenv ops show scrape) both jobs name the node
    the same (instance without the port), so NVIDIA's dashboard filter and `on(instance,
    UUID)` joins match; both of dcgm-exporter's host label spellings join; each README query
    answers as its comment says (the locked-GPUs-only join keeps GPU 0 alone)."""
    _tool("prometheus")  # before the fake dcgm-exporter starts
    served = _get(f"http://127.0.0.1:{two_gpus_one_locked}/metrics") or ""
    gpus = [_labels_of(ln) for ln in served.splitlines() if ln.startswith("gpuenv_gpu_info{")]
    assert len(gpus) == 2 and all(g["hostname"] == g["Hostname"] for g in gpus)
    assert {g["device"] for g in gpus} == {"nvidia0", "nvidia1"}
    httpd, dcgm = _fake_dcgm_exporter(gpus)
    snippet = SCRAPE.read_text()  # as written: only the example targets are replaced
    for example, real in (
        ('["gpu-node-1:9400", "gpu-node-2:9400"]', f'["127.0.0.1:{dcgm}"]'),
        ('["gpu-node-1:19400", "gpu-node-2:19400"]', f'["127.0.0.1:{two_gpus_one_locked}"]'),
    ):
        assert example in snippet
        snippet = snippet.replace(example, real)
    try:
        with _prometheus(tmp_path, "global:\n  scrape_interval: 1s\n" + snippet) as (
            proc,
            query,
            _,
        ):
            # NVIDIA's dashboard: instance from DCGM_FI_DEV_GPU_TEMP, then every panel filters on it
            nodes = _wait(lambda: query("count by (instance) (DCGM_FI_DEV_GPU_TEMP)"), 60, proc)
            assert [n["metric"]["instance"] for n in nodes] == ["127.0.0.1"]  # type: ignore[union-attr]
            mine = _wait(lambda: query('gpuenv_sm_clock_mhz{instance="127.0.0.1"}'), 30, proc)
            assert len(mine) == 2  # type: ignore[arg-type]
            joined = query(
                "gpuenv_lock_active * on(instance, UUID) group_right DCGM_FI_DEV_SM_CLOCK"
            )
            assert joined is not None and len(joined) == 2
            for host in ("Hostname", "hostname"):  # dcgm-exporter 4.x and its main branch
                metric = "DCGM_FI_DEV_SM_CLOCK" if host == "Hostname" else "DCGM_FI_DEV_GPU_TEMP"
                both = query(f"{metric} * on({host}, gpu) group_left gpuenv_lock_active")
                assert both is not None and len(both) == 2, host
            _wait(lambda: query("count_over_time(gpuenv_power_watts[5m]) >= 2"), 30, proc)
            locked = [g["UUID"] for g in gpus if g["gpu"] == "0"]
            # gpuenv's dashboard: its node variable drops the port (the regex Grafana applies),
            # so the same node name picks gpuenvd's series with or without the relabeling
            var = next(
                v
                for v in json.loads(DASHBOARD.read_text())["templating"]["list"]
                if v["name"] == "instance"
            )
            node = re.fullmatch(var["regex"].strip("/"), f"127.0.0.1:{two_gpus_one_locked}")
            assert node is not None and node.group(1) == "127.0.0.1"
            host = gpus[0]["Hostname"]
            for expr in _dashboard_exprs():
                q = (
                    expr.replace("$instance", "127.0.0.1")
                    .replace("$Hostname", host)
                    .replace("$gpu", ".*")
                    .replace("$__rate_interval", "1m")
                )
                # counted live owners: none after `gpuenv lock`; a Slurm job's GPUs and the fleet's
                # sustained clocks: no job and no calibration here, no recording rules loaded
                # (test_dashboard_and_rules_ask_only_for_series_the_daemon_serves serves them)
                if not any(k in q for k in ("gpuenv_lock_holders", "gpuenv_gpu_job", "sustained")):
                    assert query(q), f"dashboard query answers nothing: {q}"
            for q, comment in _readme_promql():
                result = query(q)
                assert result, f"README query answers nothing: {q}"
                if "locked GPUs only" in comment:
                    assert [r["metric"]["UUID"] for r in result] == locked, q
    finally:
        httpd.shutdown()  # type: ignore[attr-defined]


def _daemon_with_metrics(tmp_path: Path, listen: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUENV_BACKEND": "sim", "GPUENV_STATE_DIR": str(tmp_path / "state")}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuenv",
            "daemon",
            "--socket",
            str(tmp_path / "gpuenvd.sock"),
            "--metrics",
            listen,
            "--log-level",
            "warning",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_metrics_port_in_use_stops_the_daemon_and_leaves_no_socket(tmp_path: Path) -> None:
    """The daemon had bound its Unix socket before the metrics port failed: it exited
    and left the socket file, which a client then found and could not reach."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        proc = _daemon_with_metrics(tmp_path, f"127.0.0.1:{port}")
    finally:
        taken.close()
    assert proc.returncode != 0
    assert f"cannot serve metrics on 127.0.0.1:{port}" in proc.stderr
    assert "choose another port" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "gpuenvd.sock").exists()


def test_a_host_that_is_not_this_machine_is_not_told_to_choose_another_port(
    tmp_path: Path,
) -> None:
    proc = _daemon_with_metrics(tmp_path, "192.0.2.1:19555")  # TEST-NET-1: nobody's address
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "192.0.2.1 is not an address of this machine" in proc.stderr, proc.stderr
    assert "choose another port" not in proc.stderr
    assert not (tmp_path / "gpuenvd.sock").exists()


# -- the fleet across nodes: one Prometheus, every node's gpuenvd --------------------------


def _calibrated_node(home: Path, seed: int, slow_w: float | None) -> dict[str, str]:
    """A node's environment: its own simulated machine of 2 GPUs (seed: its GPUs' UUIDs) and
    state directory, each GPU calibrated by root's `gpuenv calibrate` (virtual time, ~1 s a
    GPU), GPU 0 first held to `slow_w` watts where given: the card that holds a lower clock."""
    from gpuenv.backend.sim import SimBackend

    home.mkdir()
    env = {
        **os.environ,
        "GPUENV_BACKEND": "sim",
        "GPUENV_SIM_STATE": str(home / "sim.json"),
        "GPUENV_SIM_GPUS": "2",
        "GPUENV_SIM_SEED": str(seed),
        "GPUENV_STATE_DIR": str(home / "state"),
    }
    with SimBackend("h100", n_gpus=2, seed=seed, state_file=home / "sim.json", root=True) as b:
        if slow_w is not None:
            b.set_power_limit(0, slow_w)
        env["UUIDS"] = ",".join(b.device_info(g).uuid for g in (0, 1))
    done = subprocess.run(
        [sys.executable, "-m", "gpuenv", "calibrate"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return env


def test_one_prometheus_over_two_nodes_names_the_slow_nodes_gpu(tmp_path: Path) -> None:
    """Two nodes (each a gpuenvd on its own simulated machine, its metrics on its own port),
    one Prometheus scraping both with the shipped rules: node1's GPU 0, held to 450 W, holds a
    lower sustained clock; the fleet's ratio and GpuenvSlowGpu (pending: it fires after
    10 min, which the rules' promtool test covers) name that node (instance) and that GPU
    (gpu 0 and its UUID), and not GPU 0 of node0."""
    _tool("prometheus")
    nodes = [_calibrated_node(tmp_path / f"node{i}", i, 450.0 if i == 1 else None) for i in (0, 1)]
    with contextlib.ExitStack() as stack:
        ports = [
            stack.enter_context(_serving(Path(n["GPUENV_STATE_DIR"]).parent, n)) for n in nodes
        ]
        targets = [f"127.0.0.1:{p}" for p in ports]
        config = (
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"rule_files: ['{RULES}']\n"
            "scrape_configs:\n  - job_name: gpuenv\n"
            f"    static_configs:\n      - targets: {targets}\n"
        )
        proc, query, _ = stack.enter_context(_prometheus(tmp_path, config))
        # the rules evaluated over both nodes' GPUs (one node alone has a median of its own)
        ratio = "gpuenv:gpu_sustained_sm_mhz:ratio_to_model_median"
        assert _wait(lambda: query(f"count({ratio}) == 4"), 60, proc)
        slow = _wait(lambda: query(f"{ratio} < 0.97"), 30, proc)
        assert isinstance(slow, list) and len(slow) == 1, slow
        labels = slow[0]["metric"]
        assert labels["instance"] == targets[1] and labels["gpu"] == "0", labels
        assert labels["UUID"] == nodes[1]["UUIDS"].split(",")[0], labels
        pending = _wait(lambda: query('ALERTS{alertname="GpuenvSlowGpu"}'), 30, proc)
        assert isinstance(pending, list) and len(pending) == 1, pending
        alert = pending[0]["metric"]
        assert alert["alertstate"] == "pending"
        assert (alert["instance"], alert["gpu"], alert["UUID"]) == (
            targets[1],
            "0",
            labels["UUID"],
        )
        # node0's GPU 0 (same index, its own UUID) holds its model's median
        ratios = query(ratio)
        assert isinstance(ratios, list) and len(ratios) == 4
        by_gpu = {
            (r["metric"]["instance"], r["metric"]["gpu"]): float(r["value"][1]) for r in ratios
        }
        assert by_gpu[targets[0], "0"] >= 0.97 and by_gpu[targets[1], "0"] < 0.8, by_gpu
