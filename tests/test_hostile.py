"""A hostile local user gets nothing (issue 21): each attack as a real second account.

The attacker is an account made with `useradd --system` (skipped when the suite does not
run as root, as CI does); root runs gpuenv and gpuenvd on the simulated GPU. Every attack
works through places every account may write (a 0777 or a sticky 1777 directory) and does
not rely on the kernel's fs.protected_symlinks: the 0777 places are not sticky, where that
setting protects nothing.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_harness import (
    ROOT,
    first_line,
    kill,
    local_users,
    run_as,
    shared_workdir,
    start_as,
)
from hostile_harness import (
    FAKE_DAEMON,
    FORGE_RANKS,
    HOLD_LOCK,
    LINK,
    PLANT_PIDS,
    SWAPPER,
)

from gpuenv.clocks.journal import KEPT

GPUENV = [sys.executable, "-c", "from gpuenv.cli import main; main()"]


@pytest.fixture
def work() -> Iterator[Path]:
    path = shared_workdir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _public(work: Path, name: str = "pub", mode: int = 0o777) -> Path:
    """A directory every account may write (0777: not sticky; 01777: as /tmp)."""
    pub = work / name
    pub.mkdir()
    pub.chmod(mode)
    return pub


def _env(work: Path, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "GPUENV_BACKEND": "sim",
        "GPUENV_SIM_GPUS": "1",
        "GPUENV_SIM_STATE": str(work / "sim.json"),
        "GPUENV_STATE_DIR": str(work / "journal"),
        "GPUENV_SOCKET": str(work / "none.sock"),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        **extra,
    }
    env.pop("GPUENV_READONLY", None)
    return env


def _gpuenv(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*GPUENV, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def _truth(env: dict[str, str]) -> tuple:
    from gpuenv.backend.sim import SimBackend

    backend = SimBackend("h100", n_gpus=1, state_file=env["GPUENV_SIM_STATE"])
    try:
        t = backend.truth(0)
        return (t.locked_sm, t.power_limit_w)
    finally:
        backend.close()


# -- 1. a fake gpuenvd -----------------------------------------------------------------------


def test_a_fake_gpuenvd_of_another_account_is_refused_and_named(work: Path) -> None:
    (mallory,) = local_users(1)
    from gpuenv.backend.sim import SimBackend

    uuid = SimBackend("h100", n_gpus=1).device_info(0).uuid
    pub = _public(work)
    env = _env(work, GPUENV_SOCKET=str(pub / "gpuenvd.sock"))
    fake = start_as(mallory, FAKE_DAEMON, env["GPUENV_SOCKET"], uuid, env=env)
    try:
        assert first_line(fake) == "listening"
        before = _truth(env)
        for args in (("lock", "--sm", "1350"), ("restore",)):
            out = _gpuenv(env, *args)
            text = out.stdout + out.stderr
            assert out.returncode != 0, text  # never "locked ... through gpuenvd", exit 0
            assert "through gpuenvd" not in text and "(gpuenvd)" not in text, text
            assert f"served by {mallory.pw_name}" in text, text
            assert f"belongs to {mallory.pw_name}" in text, text
        assert _truth(env) == before
        # `gpuenv doctor` lists the fake as a finding and goes on with its other checks
        out = _gpuenv(env, "doctor", "--json")
        import json

        report = json.loads(out.stdout)
        names = [c["name"] for c in report["checks"]]
        (daemon,) = [c for c in report["checks"] if c["name"] == "daemon"]
        assert daemon["severity"] == "error" and out.returncode == 2, out.stdout
        assert f"served by {mallory.pw_name}" in daemon["message"], daemon
        assert f"belongs to {mallory.pw_name}" in daemon["message"], daemon
        assert names.index("daemon") < names.index("power_limit") < names.index("persistence")
        # the account gpuenvd runs as, when named, is trusted (and only then)
        from gpuenv.daemon.client import Client

        os.environ["GPUENV_DAEMON_USER"] = mallory.pw_name
        try:
            with Client(env["GPUENV_SOCKET"], timeout=10) as c:
                assert c.info["backend"] == "sim"
        finally:
            del os.environ["GPUENV_DAEMON_USER"]
    finally:
        kill(fake)


# -- 2. the socket's bind race ---------------------------------------------------------------


def test_no_swap_of_the_socket_path_makes_gpuenvd_chmod_or_chown_another_file(work: Path) -> None:
    (mallory,) = local_users(1)
    import grp

    from gpuenv.backend.sim import SimBackend
    from gpuenv.clocks.journal import Journal
    from gpuenv.daemon.auth import Config
    from gpuenv.daemon.server import Server

    secret = work / "secret"  # root's 0600 file: what the attacker wants re-moded
    secret.write_text("root only\n")
    secret.chmod(0o600)
    before = secret.stat()
    pub = _public(work)
    path = pub / "gpuenvd.sock"
    group = grp.getgrgid(mallory.pw_gid).gr_name
    config = Config(socket=str(path), socket_group=group, socket_mode=0o666)
    backend = SimBackend("h100", n_gpus=1)
    server = Server(config, backend, journal=Journal(work / "journal"))
    swapper = start_as(mallory, SWAPPER, str(path), str(secret), "30", "0.0002", env=_env(work))
    bound = refused = 0
    try:
        assert first_line(swapper) == "swapping"
        deadline = time.monotonic() + 8.0
        for _ in range(3000):
            if time.monotonic() > deadline:
                break
            try:
                sock = server._bind()
            except Exception:  # refused: something not a socket is in the way
                refused += 1
                continue
            bound += 1
            sock.close()
            place = getattr(server, "_place", None)
            if place is not None:
                place.remove()
            else:  # (the code before issue 21 kept no handle)
                try:
                    if stat.S_ISSOCK(os.lstat(path).st_mode):
                        os.unlink(path)
                except OSError:
                    pass
    finally:
        kill(swapper)
        backend.close()
    after = secret.stat()
    assert bound + refused >= 500, (bound, refused)
    assert (stat.S_IMODE(after.st_mode), after.st_gid, after.st_uid) == (
        stat.S_IMODE(before.st_mode),
        before.st_gid,
        before.st_uid,
    ), f"changed after {bound} binds, {refused} refused"
    assert bound > 0


# -- 3. the state directory by symlink -------------------------------------------------------


def test_a_state_directory_linked_elsewhere_is_refused_not_chmoded(work: Path) -> None:
    (mallory,) = local_users(1)
    target = work / "roots-dir"  # a root-owned 0755 directory the attacker chose
    target.mkdir()
    target.chmod(0o755)
    pub = _public(work, "pub", 0o1777)  # as /tmp
    link = pub / "state"
    made = run_as(mallory, LINK, str(link), str(target), env=_env(work))
    assert made.stdout.strip() == "linked", made.stderr
    env = _env(work, GPUENV_STATE_DIR=str(link))
    out = _gpuenv(env, "lock", "--sm", "1350")
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "symbolic link" in text, text
    assert stat.S_IMODE(target.stat().st_mode) == 0o755
    assert list(target.iterdir()) == []
    assert _truth(env)[0] is None  # nothing locked without a journal to put it back from


# -- 4. a ranks directory made first ---------------------------------------------------------


def test_a_ranks_directory_another_account_made_first_is_not_read(work: Path) -> None:
    (mallory,) = local_users(1)
    from gpuenv.run.ranks import job_key

    pub = _public(work, "pub", 0o1777)  # as /tmp
    job = {
        "TORCHELASTIC_RUN_ID": "t21",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29521",
        "TORCHELASTIC_RESTART_COUNT": "",
    }
    key = job_key(job)
    # the name the code before issue 21 used, and the one with root's uid in it
    names = [str(pub / f"gpuenv-ranks-{key}"), str(pub / f"gpuenv-ranks-0-{key}")]
    made = run_as(mallory, FORGE_RANKS, *names, env=_env(work))
    assert made.stdout.strip() == "forged", made.stderr
    child = work / "child.py"
    child.write_text("pass\n")
    env = _env(
        work,
        RANK="0",
        LOCAL_RANK="0",
        WORLD_SIZE="2",
        GPUENV_RANKS_DIR=str(pub),
        GPUENV_RANKS_WAIT_S="1",
        GPUENV_SIM_GPUS="2",
        **job,
    )
    out = _gpuenv(env, "run", "--summary", "rank0", "--", sys.executable, str(child))
    assert out.returncode == 0, out.stderr
    assert "FORGED" not in out.stderr, out.stderr
    assert "rank 1: no summary" in out.stderr, out.stderr


# -- 8. the simulated GPU's state file -------------------------------------------------------

WRITE_SIM = (
    "import sys\n"
    "from gpuenv.backend.sim import SimBackend\n"
    "b = SimBackend('h100', n_gpus=1, state_file=sys.argv[1])\n"
    "b.set_power_limit(0, 500.0)\n"
    "b.close()\n"
    "print('wrote', flush=True)\n"
)


def test_no_guessed_temp_name_makes_root_overwrite_a_file(work: Path) -> None:
    (mallory,) = local_users(1)
    victim = work / "victim"  # root's file the attacker wants overwritten
    victim.write_text("root's data\n")
    for mode in (0o777, 0o1777):
        pub = _public(work, f"pub{mode:o}", mode)
        planted = run_as(
            mallory, PLANT_PIDS, str(pub), "sim.json", str(victim), "2000", env=_env(work)
        )
        assert planted.stdout.strip() == "planted 2000", planted.stderr
        subprocess.run(
            [sys.executable, "-c", WRITE_SIM, str(pub / "sim.json")],
            env=_env(work),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert victim.read_text() == "root's data\n", f"overwritten through {pub}"


def test_a_sim_lock_held_by_another_account_cannot_hang_root_or_anyone(work: Path) -> None:
    mallory, bob = local_users(2)
    pub = _public(work, "pub", 0o1777)  # as /tmp
    state, state2 = pub / "sim.json", pub / "sim2.json"
    holder = start_as(mallory, HOLD_LOCK, str(state) + ".lock", env=_env(work))
    holder2 = start_as(mallory, HOLD_LOCK, str(state2) + ".lock", env=_env(work))
    try:
        assert first_line(holder) == "held" and first_line(holder2) == "held"
        t0 = time.monotonic()
        try:  # root: a lock file of another account is not ours to wait for
            out = subprocess.run(
                [sys.executable, "-c", WRITE_SIM, str(state)],
                env=_env(work),
                capture_output=True,
                text=True,
                timeout=20,
            )
        except subprocess.TimeoutExpired:
            pytest.fail("root's write of the simulated GPU hung on another account's lock")
        assert out.returncode == 0 and "wrote" in out.stdout, out.stderr
        assert time.monotonic() - t0 < 15
        # another user, who may not replace it in a sticky directory: a bounded wait, a sentence
        t0 = time.monotonic()
        out = run_as(bob, WRITE_SIM, str(state2), env=_env(work), timeout=30)
        assert time.monotonic() - t0 < 25
        assert out.returncode != 0, out.stdout + out.stderr
        assert f"held by pid {holder2.pid} ({mallory.pw_name})" in out.stderr, out.stderr
    finally:
        kill(holder)
        kill(holder2)


# -- 5. stopped subscribers ------------------------------------------------------------------


def _lease_event_delays(sock_path: str, n: int, wait_s: float) -> list[float]:
    """Root takes and releases `n` leases; how long each took to reach a reading subscriber
    (wait_s when it never came)."""
    import threading

    from gpuenv.daemon.client import Client

    seen: dict[str, float] = {}
    reader = Client(sock_path, timeout=60)
    stream = reader.subscribe(period=5.0, events=True)

    def read() -> None:
        try:
            for msg in stream:
                if msg.get("event") == "lease":
                    seen.setdefault(str(msg["lease"]["id"]), time.monotonic())
        except Exception:
            return

    threading.Thread(target=read, daemon=True).start()
    delays = []
    with Client(sock_path, timeout=30) as locker:
        for _ in range(n):
            lease = locker.lock(sm=1350, gpus=[0])
            granted = time.monotonic()
            deadline = granted + wait_s
            while lease.id not in seen and time.monotonic() < deadline:
                time.sleep(0.002)
            delays.append(max(0.0, seen.get(lease.id, deadline) - granted))
            lease.release()
    reader.close()
    return delays


def test_stopped_subscribers_do_not_delay_another_subscribers_events(work: Path) -> None:
    from daemon_harness import DaemonProcess
    from hostile_harness import STOPPED_SUBSCRIBER

    (mallory,) = local_users(1)
    d = DaemonProcess(work, n_gpus=1, config="[daemon]\nsocket_mode = 0666\n")
    d.start()
    stopped = [start_as(mallory, STOPPED_SUBSCRIBER, d.socket, env=d.env) for _ in range(4)]
    try:
        for proc in stopped:
            assert first_line(proc) == "subscribed"
        time.sleep(3.0)  # their socket buffers fill: every further send to them would block
        delays = _lease_event_delays(d.socket, 10, wait_s=3.0)
        # (the goal is 100 ms; 1 s here leaves a loaded 2-core machine room, and before
        # issue 21 the first event waited 5 s per stopped subscriber)
        assert max(delays) < 1.0, [round(x, 3) for x in delays]
    finally:
        for proc in stopped:
            kill(proc)
        d.close()
    assert "dropped the subscriber gpuenv-test-a" in d.log.read_text()


# -- 6. the metrics port ---------------------------------------------------------------------


def test_idle_metrics_connections_and_a_scrape_flood_do_not_stop_locking(work: Path) -> None:
    import re
    import resource
    import urllib.request

    from daemon_harness import DaemonProcess
    from hostile_harness import IDLE_TCP, SCRAPER

    from gpuenv.daemon.client import Client

    (mallory,) = local_users(1)
    d = DaemonProcess(work, n_gpus=1, config="[daemon]\nmetrics = 127.0.0.1:0\n")
    d.start()
    assert d.proc is not None
    resource.prlimit(d.proc.pid, resource.RLIMIT_NOFILE, (1024, 1024))  # systemd's default
    deadline = time.monotonic() + 15
    while not (port := re.search(r"metrics on http://127.0.0.1:(\d+)/", d.log.read_text())):
        assert time.monotonic() < deadline, d.log.read_text()
        time.sleep(0.05)
    idle = start_as(mallory, IDLE_TCP, port.group(1), "1100", env=d.env)
    flood = start_as(mallory, SCRAPER, port.group(1), "30", env=d.env)
    try:
        assert first_line(idle).startswith("open") and first_line(flood) == "scraping"
        for _ in range(10):
            with Client(d.socket, timeout=10) as c, c.lock(sm=1350, gpus=[0]):
                pass
        url = f"http://127.0.0.1:{port.group(1)}/metrics"
        with urllib.request.urlopen(url, timeout=10) as r:  # root's scrape gets its answer
            text = r.read().decode()
        assert "gpuenv_metrics_connections_refused_total" in text
        assert len(os.listdir(f"/proc/{d.proc.pid}/fd")) < 200
    finally:
        kill(idle)
        kill(flood)
        d.close()


# -- 9. every copy of a record gone (both copies alone: tests/clocks/test_journal_faults.py) --

OWNER = (
    "import time, gpuenv\n"
    "lk = gpuenv.lock(sm=1350, power_limit_w=500)\n"
    "print('locked', flush=True)\n"
    "time.sleep(300)\n"
)


def _two_gpus(work: Path) -> tuple[dict[str, str], list[str]]:
    """Two simulated GPUs and their UUIDs."""
    from gpuenv.backend.sim import SimBackend

    env = _env(work, GPUENV_SIM_GPUS="2")
    b = SimBackend("h100", n_gpus=2)
    return env, [b.device_info(i).uuid for i in range(2)]


def test_restore_names_a_gpu_whose_both_records_were_deleted(work: Path) -> None:
    env, uuids = _two_gpus(work)
    out = _gpuenv(env, "lock", "--sm", "1350", "--power-limit", "500")
    assert out.returncode == 0, out.stderr
    kept = work / "journal" / KEPT / f"{uuids[1]}.json"
    for p in [*(work / "journal").glob(f"{uuids[1]}*"), kept]:
        p.unlink()  # an admin or a disk tool: both copies and the original kept at lock time
    out = _gpuenv(env, "restore")
    text = out.stdout + out.stderr
    # GPU 1 has nothing of gpuenv's to put back: exit 0 (issue 31), but it is named (before,
    # it said only "restored GPU 0")
    assert out.returncode == 0, text
    assert "restored GPU 0" in text
    assert "left as it is: GPU 1" in text and "no journal record" in text, text
    assert "power limit 500 W (default 700 W)" in text and "looks locked" in text, text
    assert "'gpuenv restore --defaults -i 1' would:" in text, text


def test_the_watchdog_names_a_gpu_it_could_not_put_back(work: Path) -> None:
    env, uuids = _two_gpus(work)
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert first_line(owner) == "locked"
        kept = work / "journal" / KEPT / f"{uuids[1]}.json"
        for p in [*(work / "journal").glob(f"{uuids[1]}*"), kept]:
            p.write_text('{"version": 2, "uuid": "' + uuids[1] + '", "orig')  # all damaged
        owner.kill()
        owner.wait(timeout=10)
        assert owner.stderr is not None
        said = owner.stderr.read()  # until the watchdog, which shares it, has exited
    finally:
        kill(owner)
    assert "GPU 0" in said and "restored" in said, said
    assert "not restored: GPU 1" in said and "damaged" in said, said
    assert "power limit 500 W (default 700 W)" in said, said
    assert "'gpuenv restore --defaults -i 1' would:" in said and "(now 500 W)" in said, said


# -- 7. memory that keeps growing ------------------------------------------------------------


def test_the_daemon_keeps_nothing_per_connection_once_it_is_gone(tmp_path: Path) -> None:
    """What tracemalloc found growing with requests (issue 21, item 7): an empty lease table
    per connection that ever held a lease, kept after it closed."""
    from gpuenv.backend.sim import SimBackend
    from gpuenv.clocks.journal import Journal
    from gpuenv.daemon.auth import Config
    from gpuenv.daemon.client import Client
    from gpuenv.daemon.server import Server

    backend = SimBackend("h100", n_gpus=1, state_file=tmp_path / "sim.json")
    me = f"user:{pwd.getpwuid(os.getuid()).pw_name}"  # root, or who runs the suite
    server = Server(
        Config(socket=str(tmp_path / "s.sock"), sample_period=5.0, lock_rules={me: ("all",)}),
        backend,
        journal=Journal(tmp_path / "journal"),
    )
    server.start()
    try:
        for _ in range(100):
            with Client(str(tmp_path / "s.sock"), timeout=30) as c:
                with c.lock(sm=1350, gpus=[0]):
                    pass
                w = c.window_start()
                c.window_end(w)
        deadline = time.monotonic() + 10
        while server.connections() and time.monotonic() < deadline:
            time.sleep(0.01)
        leases = server.leases
        assert (len(leases._by_conn), len(leases._peers), server.connections()) == (0, 0, 0)
    finally:
        server.stop()
        backend.close()
