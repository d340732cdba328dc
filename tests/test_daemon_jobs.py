"""gpuenv/daemon/jobs.py and jobreport.py: gpuenvd's record of each batch job's GPUs, from
the prolog's job_begin to the epilog's job_end, kept on disk (bounded), on the metrics as one
info series per GPU, and judged by the one judge. In-process daemon on the simulated GPU."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuenv.backend.sim import SimBackend
from gpuenv.clocks.journal import Journal
from gpuenv.daemon.auth import Peer, parse_config
from gpuenv.daemon.client import Client
from gpuenv.daemon.jobreport import judge_job, quantiles, render
from gpuenv.daemon.server import Server
from gpuenv.errors import ConfigError, PermissionDenied

ROOT = Peer(pid=os.getpid(), uid=0, gid=0, user="root", groups=frozenset())
ALICE = Peer(pid=os.getpid(), uid=50001, gid=50001, user="alice", groups=frozenset())


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[Server, list[Peer]]]:
    who = [ROOT]  # the peer the next connection is: tests switch it
    backend = SimBackend("h100", n_gpus=2, state_file=tmp_path / "sim.json")
    config = parse_config("[lock]\nuser:alice = all\n").with_socket(str(tmp_path / "s"))
    server = Server(
        config, backend, journal=Journal(tmp_path / "journal"), peer_of=lambda sock: who[0]
    )
    server.start()
    yield server, who
    server.stop()
    backend.close()


def settle(server: Server, mhz: int, gpus: list[int]) -> None:
    """Until the daemon's sampler reads the locked clock (the driver applies it at its next
    update): a prolog's lock is in force before the job starts."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if all((s := server.sampler.latest(g)) is not None and s.sm_mhz == mhz for g in gpus):
            return
        time.sleep(0.02)
    raise AssertionError(f"the clocks did not reach {mhz} MHz")


def test_a_job_is_recorded_from_begin_to_end_and_kept(daemon: tuple[Server, list[Peer]]) -> None:
    server, _ = daemon
    for g in (0, 1):  # the job's work: a lock is judged while the GPU is busy
        server.backend.set_background_load(g, 0.5, pid=os.getpid())
    with Client(server.address) as c:
        lease = c.lock(sm=1350, gpus=[0, 1], standing=True)
        settle(server, 1350, [0, 1])
        c.call(
            "job_begin", job="77", user="alice", gpus=[0, 1], asked="sm=1350", lock="locked sm=1350"
        )
        time.sleep(0.6)
        running = c.call("job_report", job="77")["report"]
        assert running["ended"] is None
        report = judge_job(server.backend, c.call("job_end", job="77")["report"])
        c.release(lease.id)
        kept = judge_job(server.backend, c.call("job_report", job="77")["report"])
    assert kept == report
    assert report["user"] == "alice" and report["lock"] == "locked sm=1350"
    for e in report["gpus_report"]:
        w = e["window"]
        assert w["lock_held"] is True and w["lock_range_mhz"] == [1350, 1350]
        assert w["n_samples"] > 0 and w["energy_j"] > 0
        assert e["sm_quantiles"] == {"p5": 1350.0, "p50": 1350.0, "p95": 1350.0}
    assert report["verdict"].startswith("gpuenv: job 77 GPUs 0,1: locked sm=1350; lock held")
    assert (Path(server.journal.path) / "jobs" / "77.json").exists()
    text = render(report)
    assert "job 77 of alice (ended" in text and "SM clock p5/p50/p95: 1350/1350/1350 MHz" in text


def test_a_lock_lost_mid_job_is_in_its_verdict(daemon: tuple[Server, list[Peer]]) -> None:
    """Fails on a report that trusts the prolog's word: the lock is checked on the samples."""
    server, _ = daemon
    server.backend.set_background_load(0, 0.5, pid=os.getpid())
    with Client(server.address) as c:
        lease = c.lock(sm=1350, gpus=[0], standing=True)
        settle(server, 1350, [0])
        c.call("job_begin", job="78", user="bob", gpus=[0], lock="locked sm=1350")
        time.sleep(0.3)
        server.backend.set_locked_sm_clocks(0, 1800, 1800)  # someone else rewrote the clocks
        time.sleep(0.6)
        report = judge_job(server.backend, c.call("job_end", job="78")["report"])
        c.release(lease.id)
    assert report["gpus_report"][0]["window"]["lock_held"] is False
    assert "lock NOT held" in report["verdict"] and "GPU 0 lock_not_held" in report["verdict"]


def test_only_an_admin_begins_or_ends_a_job(daemon: tuple[Server, list[Peer]]) -> None:
    server, who = daemon
    who[0] = ALICE
    with Client(server.address) as c:
        with pytest.raises(PermissionDenied, match="only an admin"):
            c.call("job_begin", job="79", user="alice", gpus=[0])
        with pytest.raises(ConfigError, match="no report of job 79"):
            c.call("job_report", job="79")
        with pytest.raises(Exception, match="not a job id"):
            c.call("job_report", job="../etc/passwd")


def test_running_jobs_are_one_info_series_per_gpu(daemon: tuple[Server, list[Peer]]) -> None:
    pytest.importorskip("prometheus_client")
    from gpuenv.daemon.metrics import render as render_metrics

    server, _ = daemon
    uuid = server.infos[1].uuid
    with Client(server.address) as c:
        c.call("job_begin", job="80", user="alice", gpus=[1])
        text = render_metrics(server).decode()
        assert f'gpuenv_gpu_job{{UUID="{uuid}",jobid="80",user="alice"}} 1.0' in text
        assert text.count("jobid=") == 1  # no other series carries the job
        c.call("job_end", job="80")
    assert "jobid=" not in render_metrics(server).decode()


def test_long_jobs_are_chunked_and_reports_on_disk_are_bounded(
    daemon: tuple[Server, list[Peer]],
) -> None:
    server, _ = daemon
    book = server.ops.jobs
    book.chunk_s, book.keep = 0.2, 3
    with Client(server.address) as c:
        for n in range(5):
            c.call("job_begin", job=f"9{n}", user="alice", gpus=[0])
            if n == 0:
                time.sleep(0.7)
                assert len(book._open["90"].per_gpu[0].windows) >= 2  # chunks closed meanwhile
            c.call("job_end", job=f"9{n}")
            time.sleep(0.02)  # distinct modification times
        kept = sorted(p.name for p in (Path(server.journal.path) / "jobs").glob("*.json"))
        assert kept == ["92.json", "93.json", "94.json"]
        with pytest.raises(ConfigError, match="no report of job 90"):
            c.call("job_report", job="90")


def test_a_job_open_when_gpuenvd_dies_is_taken_up_by_the_next_one(tmp_path: Path) -> None:
    """A daemon killed (or its node restarted) mid-job: the next one on the same state dir
    takes the job up, so the epilog's job_end still gets a report; it names the telemetry
    that died with the first daemon. A kept file that is no open job is dropped, not fatal."""
    backend = SimBackend("h100", n_gpus=2, state_file=tmp_path / "sim.json")
    journal = tmp_path / "journal"
    config = parse_config("").with_socket(str(tmp_path / "s"))
    first = Server(config, backend, journal=Journal(journal), peer_of=lambda sock: ROOT)
    first.start()
    with Client(first.address) as c:
        c.call("job_begin", job="81", user="alice", gpus=[1], asked="sm=1350", lock="locked")
    first.stop()  # what a SIGKILL leaves too: the job never ended
    (journal / "jobs" / "open" / "82.json").write_text("{not json")
    second = Server(config, backend, journal=Journal(journal), peer_of=lambda sock: ROOT)
    second.start()
    try:
        with Client(second.address) as c:
            time.sleep(0.2)
            report = judge_job(backend, c.call("job_end", job="81")["report"])
    finally:
        second.stop()
        backend.close()
    assert report["user"] == "alice" and report["gpus"] == [1] and report["restarts"] == 1
    assert report["telemetry_from"] > report["started"]
    (gap,) = report["gpus_report"][0]["findings"]
    assert gap["kind"] == "telemetry_gap" and gap["severity"] == "warning"
    assert "gpuenvd restarted while job 81 ran: GPU 1's telemetry of its first" in gap["message"]
    assert report["verdict"].endswith("check: GPU 1 telemetry_gap")
    assert report["gpus_report"][0]["window"]["n_samples"] > 0  # the new daemon's share
    assert list((journal / "jobs" / "open").iterdir()) == []  # ended; the bad file dropped


def test_quantiles_of_a_histogram() -> None:
    assert quantiles({}) is None
    assert quantiles({1350: 90, 1200: 10}) == {"p5": 1200.0, "p50": 1350.0, "p95": 1350.0}


def test_gpuenv_job_prints_the_report_and_names_a_job_it_does_not_know(
    daemon: tuple[Server, list[Peer]],
) -> None:
    from click.testing import CliRunner

    from gpuenv.cli import cli

    server, _ = daemon
    env = {"GPUENV_SOCKET": server.address, "GPUENV_SIM_GPUS": "2"}
    run = CliRunner().invoke
    begun = run(
        cli,
        ["--sim", "job", "81", "--begin", "-i", "0,1", "--user", "alice", "--lock", "not asked"],
        env=env,
    )
    assert begun.exit_code == 0, begun.output
    shown = run(cli, ["--sim", "job", "81"], env=env)
    assert shown.exit_code == 0 and "job 81 of alice (running): not asked" in shown.output
    ended = run(cli, ["--sim", "job", "81", "--end"], env=env)
    assert ended.output.startswith("gpuenv: job 81 GPUs 0,1: not asked")
    unknown = run(cli, ["--sim", "job", "82"], env=env)
    assert unknown.exit_code == 2 and "gpuenvd has no report of job 82" in unknown.output


def test_other_processes_are_named_and_the_jobs_own_are_not(
    daemon: tuple[Server, list[Peer]],
) -> None:
    import subprocess

    server, _ = daemon
    own = subprocess.Popen(["sleep", "30"], env={**os.environ, "SLURM_JOB_ID": "83"})
    try:
        server.backend.set_background_load(0, 0.4, pid=own.pid)  # the job's work
        server.backend.set_background_load(0, 0.2, pid=424242)  # someone else's
        with Client(server.address) as c:
            c.call("job_begin", job="83", user="nobody-here", gpus=[0])
            time.sleep(1.5)  # processes are read on their own grid
            report = judge_job(server.backend, c.call("job_end", job="83")["report"])
    finally:
        own.kill()
        own.wait()
    assert report["gpus_report"][0]["window"]["other_pids"] == [424242]
    assert "GPU 0 other_process" in report["verdict"]


def test_under_the_job_rule_a_user_locks_their_jobs_gpus_and_no_one_elses(
    tmp_path: Path,
) -> None:
    """`* = job`: the prolog's job_begin gives alice her job's GPU; bob's lock on it is refused
    naming her job, even under `all`; once her job ends it is no one's."""
    bob = Peer(pid=os.getpid(), uid=50002, gid=50002, user="bob", groups=frozenset())
    who = [ROOT]
    backend = SimBackend("h100", n_gpus=2, state_file=tmp_path / "sim.json")
    config = parse_config("[lock]\n* = job\nuser:bob = all\n").with_socket(str(tmp_path / "s"))
    server = Server(config, backend, journal=Journal(tmp_path / "j"), peer_of=lambda s: who[0])
    server.start()
    try:
        with Client(server.address) as c:
            c.call("job_begin", job="301", user="alice", gpus=[0])
        who[0] = ALICE
        with Client(server.address) as c:
            assert c.info["may_lock"] == [0]
            with c.lock(sm=1350, gpus=[0]):
                assert backend.truth(0).locked_sm == (1350, 1350)
            with pytest.raises(PermissionDenied, match="none of them is on this GPU"):
                c.lock(sm=1350, gpus=[1])
        who[0] = bob
        with Client(server.address) as c:
            with pytest.raises(PermissionDenied) as err:
                c.lock(sm=1350, gpus=[0])
            text = str(err.value)
            assert "bob may not lock a GPU of alice's running Slurm job 301 (allowed: GPUs" in text
            assert err.value.gpu == 0 and "once job 301 ends" in text
            assert err.value.exit_code == 4
            with c.lock(sm=1350, gpus=[1]):  # all: every GPU no other account's job holds
                pass
        who[0] = ROOT
        with Client(server.address) as c:
            c.call("job_end", job="301")
        who[0] = bob
        with Client(server.address) as c, c.lock(sm=1350, gpus=[0]):
            assert backend.truth(0).locked_sm == (1350, 1350)
    finally:
        server.stop()
        backend.close()


def test_the_daemon_runs_on_the_clock_it_is_given(tmp_path: Path) -> None:
    """Virtual time: a job's chunks close on the clock's timer, its start and end, a lease's
    grant and the daemon's uptime are the clock's, not the machine's."""
    from gpuenv.timebase import VirtualClock

    clock = VirtualClock(start=50.0, epoch=1_700_000_000.0)
    backend = SimBackend("h100", n_gpus=1, state_file=tmp_path / "sim.json", clock=clock)
    config = parse_config("").with_socket(str(tmp_path / "s"))
    server = Server(config, backend, journal=Journal(tmp_path / "j"), peer_of=lambda s: ROOT)
    server.start()
    try:
        with Client(server.address) as c:
            began = clock.wall()
            c.call("job_begin", job="401", user="alice", gpus=[0])
            clock.advance(150.0)  # 2.5 chunks of 60 s
            assert len(server.ops.jobs._open["401"].per_gpu[0].windows) == 2
            with c.lock(sm=1350, gpus=[0]):
                (lease,) = c.status()["leases"]
                assert lease["granted_at"] == clock.wall()
            assert c.status()["daemon"]["uptime_s"] == pytest.approx(150.0, abs=1.0)
            report = c.call("job_end", job="401")["report"]
    finally:
        server.stop()
        backend.close()
    assert report["started"] == began and report["ended"] == began + 150.0
