"""Run gpuenvd as a subprocess on the simulated GPU (shared by tests and benchmarks/daemon.py).

Not a test module: helpers only. The daemon and this process open the same
simulated-GPU state file, so `truth()` here sees what the daemon wrote.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import strategies as st

from gpuenv.backend.sim import SimBackend
from gpuenv.daemon import protocol
from gpuenv.daemon.client import daemon_available

ROOT = Path(__file__).resolve().parent.parent


def state_tuple(backend: SimBackend, index: int) -> tuple:
    t = backend.truth(index)
    return (t.locked_sm, t.locked_mem, t.app_sm_mhz, t.app_mem_mhz, t.power_limit_w)


class DaemonProcess:
    """gpuenvd in a subprocess: start, SIGKILL, restart; the GPU's truth from this side."""

    def __init__(
        self,
        workdir: Path,
        *,
        n_gpus: int = 2,
        config: str | None = None,
        nice: int = 0,
        sample_period: float = 0.05,
        seed: int = 0,
    ):
        self.nice = nice  # the shipped unit runs gpuenvd at Nice=-10
        self.sample_period = sample_period
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.socket = str(self.workdir / "gpuenvd.sock")
        self.config = self.workdir / "gpuenvd.conf"
        user = _user()
        self.config.write_text(config if config is not None else f"[lock]\nuser:{user} = all\n")
        self.env = {
            **os.environ,
            "GPUENV_BACKEND": "sim",
            "GPUENV_SIM_STATE": str(self.workdir / "sim.json"),
            "GPUENV_SIM_GPUS": str(n_gpus),
            "GPUENV_SIM_SEED": str(seed),  # the machine: its GPUs' UUIDs
            "GPUENV_STATE_DIR": str(self.workdir / "journal"),
            "GPUENV_SOCKET": self.socket,
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p
            ),
        }
        self.env.pop("GPUENV_READONLY", None)
        # this side's view of the same simulated GPUs; being a client of the state file also
        # keeps the simulated driver from resetting when the daemon dies
        self.backend = SimBackend(
            "h100", n_gpus=n_gpus, seed=seed, state_file=self.workdir / "sim.json"
        )
        self.n_gpus = n_gpus
        self.original = [state_tuple(self.backend, i) for i in range(n_gpus)]
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.workdir / "gpuenvd.log"

    def start(self, timeout: float = 30.0) -> None:
        cmd = [
            sys.executable,
            "-c",
            "from gpuenv.cli import main; main()",
            "daemon",
            "--config",
            str(self.config),
            "--socket",
            self.socket,
            "--sample-period",
            str(self.sample_period),
            "--log-level",
            "debug",
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                env=self.env,
                cwd=self.workdir,  # `-c` imports from its cwd first: PYTHONPATH's gpuenv, not ours
                stdout=log,
                stderr=log,
                preexec_fn=(lambda: os.nice(self.nice)) if self.nice else None,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gpuenvd exited with {self.proc.returncode}:\n{self.log.read_text()}"
                )
            if daemon_available(self.socket, timeout=2.0):
                return
            time.sleep(0.05)
        raise RuntimeError(f"gpuenvd did not start within {timeout} s:\n{self.log.read_text()}")

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def truth(self, index: int) -> tuple:
        return state_tuple(self.backend, index)

    def pristine(self) -> bool:
        return all(self.truth(i) == self.original[i] for i in range(self.n_gpus))

    def wait_pristine(self, timeout: float = 5.0) -> float | None:
        """Seconds until every GPU is back to its original state, or None on timeout."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.pristine():
                return time.monotonic() - t0
            time.sleep(0.002)
        return None

    def close(self) -> None:
        self.stop()
        self.backend.close()


def client_process(
    socket: str, sm: int, gpus: str = "0,1", *, env: dict | None = None
) -> subprocess.Popen[str]:
    """A client that takes a lease through the daemon, prints 'locked' and sleeps."""
    code = (
        "import sys, time\n"
        "from gpuenv.daemon.client import lock\n"
        "lease = lock(sm=int(sys.argv[2]), gpus=sys.argv[3], socket=sys.argv[1])\n"
        "print('locked', lease.id, flush=True)\n"
        "time.sleep(120)\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code, socket, str(sm), gpus],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


# -- real local accounts ---------------------------------------------------------------------------

TEST_USERS = ("gpuenv-test-a", "gpuenv-test-b")  # system accounts, made when missing


def local_users(n: int) -> list[pwd.struct_passwd]:
    """`n` real unprivileged accounts; made with `useradd --system` when they are missing.

    Needs root (CI runs as root); anything else skips the calling test with the reason.
    """
    import pytest

    if os.geteuid() != 0:
        pytest.skip("needs root to make and run as a second local account (CI runs as root)")
    if shutil.which("useradd") is None:
        pytest.skip("useradd is not installed: cannot make a second local account")
    users = []
    for name in TEST_USERS[:n]:
        try:
            users.append(pwd.getpwnam(name))
            continue
        except KeyError:
            pass
        made = subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
        )
        if made.returncode not in (0, 9):  # 9: made meanwhile by another test run
            pytest.skip(f"useradd {name} failed: {made.stderr.strip()}")
        users.append(pwd.getpwnam(name))
    if _user_python(users[0]) is None:
        pytest.skip(f"no Python that {users[0].pw_name} may run imports gpuenv here")
    return users


_PYTHONS: dict[int, str | None] = {}


def _user_python(user: pwd.struct_passwd) -> str | None:
    """This Python, or the system's of the same version when this one is out of the
    account's reach (a pyenv under /root), that can import gpuenv as `user`."""
    if user.pw_uid not in _PYTHONS:
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        found = None
        for python in (
            sys.executable,
            f"/usr/bin/python{version}",
            f"/usr/local/bin/python{version}",
        ):
            try:
                ok = subprocess.run(
                    [python, "-c", "import gpuenv.daemon.client"],
                    env=_user_env(os.environ),
                    capture_output=True,
                    timeout=60,
                    **as_user(user),
                )
            except OSError:
                continue
            if ok.returncode == 0:
                found = python
                break
        _PYTHONS[user.pw_uid] = found
    return _PYTHONS[user.pw_uid]


def _user_env(env: dict | os._Environ) -> dict:
    """`env` for another account: gpuenv and its dependencies from this checkout and venv."""
    import site

    paths = [str(ROOT), *site.getsitepackages(), env.get("PYTHONPATH", "")]
    return {**env, "HOME": "/tmp", "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def as_user(user: pwd.struct_passwd) -> dict:
    """subprocess arguments that run a command as `user` (no supplementary groups)."""
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}


def run_as(
    user: pwd.struct_passwd, code: str, *args: str, env: dict, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run Python `code` as `user`; its output comes back as text."""
    return subprocess.run(
        [_user_python(user) or sys.executable, "-c", code, *args],
        env=_user_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        **as_user(user),
    )


def start_as(user: pwd.struct_passwd, code: str, *args: str, env: dict) -> subprocess.Popen[str]:
    """Start Python `code` as `user` (stdout a pipe, line by line)."""
    return subprocess.Popen(
        [_user_python(user) or sys.executable, "-c", code, *args],
        env=_user_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **as_user(user),
    )


def first_line(proc: subprocess.Popen[str]) -> str:
    """The process's first line of output (stripped); its stderr in the error when none."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        raise AssertionError(f"no output; stderr: {proc.stderr.read() if proc.stderr else ''}")
    return line.strip()


def kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the process if it still runs, and reap it."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def shared_workdir() -> Path:
    """A temp dir other accounts may traverse (the socket lives there), removed by the caller."""
    path = Path(tempfile.mkdtemp(prefix="gpuenvd-"))
    path.chmod(0o755)
    return path


# -- fuzzing: malformed, oversized, truncated and out-of-order messages ---------------------------

_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 3000)
    | st.floats(allow_nan=False)
    | st.text(max_size=12),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
_fields = st.sampled_from(
    [
        "gpus",
        "sm",
        "sm_max",
        "mem",
        "power_limit_w",
        "standing",
        "wait",
        "label",
        "lease",
        "window",
        "period",
        "events",
        "all",
        "versions",
        "client",
        "zzz",
    ]
)
_plausible = st.fixed_dictionaries(
    {
        "v": st.sampled_from([1, 1, 1, 2, None]),
        "id": st.integers(0, 10**6),
        "op": st.sampled_from([*protocol.OPS, "bogus"]),
    }
).flatmap(lambda base: st.dictionaries(_fields, _values, max_size=4).map(lambda x: {**base, **x}))
_line = st.one_of(
    _plausible.map(lambda m: json.dumps(m).encode()),
    _plausible.map(lambda m: json.dumps(m).encode()).flatmap(
        lambda b: st.integers(0, len(b)).map(lambda n: b[:n])  # truncated
    ),
    st.binary(max_size=200),
    st.just(b'{"v":1,"id":1,"op":"status","pad":"' + b"x" * 70_000 + b'"}'),  # oversized
)
fuzz_messages = (
    st.lists(_line, min_size=1, max_size=6)
    .map(lambda lines: b"\n".join(lines))
    .flatmap(
        lambda data: st.sampled_from([data, data + b"\n"])  # the last line complete or not
    )
)


def exchange(sock_path: str, data: bytes) -> list[dict]:
    """Send `data`, close our side, and read every reply until the daemon closes."""
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(sock_path)
    try:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    finally:
        s.close()
    return [json.loads(line) for line in out.splitlines()]


def check_exchange(sock_path: str, data: bytes) -> None:
    """One fuzz case: exactly one well-formed reply per complete line, never an internal error."""
    replies = [r for r in exchange(sock_path, data) if "event" not in r]
    expected = protocol.LineReader().feed(data)  # one reply per complete line
    assert len(replies) == len(expected), (len(replies), len(expected))
    for reply in replies:
        assert reply["v"] == 1 and isinstance(reply["ok"], bool)
        if not reply["ok"]:
            assert reply["error"]["type"] != "InternalError", reply


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def mixed_load(socket_path: str, requests: int) -> int:
    """Drive `requests` requests at gpuenvd the way many users do at once: one long
    connection asking status and taking and releasing leases, a new short connection
    (hello, status, close) every 10 requests and a subscriber (subscribe, one event,
    unsubscribe, close) every 100. Returns the number of requests sent."""
    from gpuenv.daemon.client import Client

    sent = 0
    with Client(socket_path) as long:
        sent += 1  # its hello
        while sent < requests:
            i = sent
            if i % 100 == 0:
                with Client(socket_path) as sub:
                    next(sub.subscribe(period=0.05, events=True))
                    sub.call("unsubscribe")
                sent += 3
            elif i % 10 == 0:
                with Client(socket_path) as short:
                    short.status()
                sent += 2
            elif i % 4 == 0:
                long.lock(sm=1350, gpus=[0]).release()
                sent += 2
            else:
                long.status()
                sent += 1
    return sent


# Request kinds of issue 31, item 4: each alone, `requests` of it from `clients` connections
# at once (threads: the windows' and the subscribers' waits overlap, as many users' do).
LOAD_KINDS = ("windows", "lock", "subscribe", "status", "connections", "mix")


def kind_load(socket_path: str, kind: str, requests: int, clients: int = 4) -> int:
    """Drive `requests` requests of one kind (LOAD_KINDS) at gpuenvd; returns how many were
    sent. windows: window_start + window_end; lock: a lease taken and released; subscribe:
    subscribe, one event, unsubscribe on a new connection; status: status on one connection;
    connections: a new connection's hello, status and close; mix: `mixed_load`."""
    import threading

    from gpuenv.daemon.client import Client

    if kind == "mix":
        return mixed_load(socket_path, requests)
    if kind not in LOAD_KINDS:
        raise ValueError(f"not a load kind: {kind!r} (one of {', '.join(LOAD_KINDS)})")
    cost = {"windows": 2, "lock": 2, "subscribe": 4, "status": 1, "connections": 2}[kind]
    sent = [0] * clients

    def one(c: Client) -> None:
        if kind == "windows":
            c.window_end(c.window_start())
        elif kind == "lock":
            c.lock(sm=1350, gpus=[0]).release()
        elif kind == "status":
            c.status()
        elif kind == "subscribe":
            with Client(socket_path) as sub:
                next(sub.subscribe(period=0.05, events=False))
                sub.call("unsubscribe")
        else:
            with Client(socket_path) as short:
                short.status()

    def worker(n: int) -> None:
        with Client(socket_path) as c:
            while sum(sent) < requests:
                one(c)
                sent[n] += cost

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(sent)


# -- issue 31's stress: a scrape flood while clients lock and release in a loop ------------------


def metrics_port(d: DaemonProcess, timeout: float = 15.0) -> int:
    """The port of the daemon's metrics endpoint (config `metrics = 127.0.0.1:0`), from its log."""
    import re

    deadline = time.monotonic() + timeout
    while not (m := re.search(r"metrics on http://127.0.0.1:(\d+)/", d.log.read_text())):
        if time.monotonic() > deadline:
            raise AssertionError(f"no metrics endpoint in the log:\n{d.log.read_text()}")
        time.sleep(0.05)
    return int(m.group(1))


class StressResult:
    """What `stress` saw: lock/release round trips, scrapes, and every failure."""

    def __init__(self) -> None:
        self.cycles = 0
        self.lease_s: list[float] = []  # each lock + release round trip, seconds
        self.scrapes = 0
        self.scrape_s = 0.0  # how long the scrapers ran
        self.internal: list[str] = []  # requests that failed inside the daemon
        self.failed: list[str] = []  # any other failure of a lock or release


# Scrape /metrics in a loop from a line on stdin until SIGTERM; say "ready" once started,
# then how many were answered 200. A process of its own: as threads of the process that
# times the leases, a flood of hundreds of scrapes a second took that process's GIL from
# the lockers, and the lease times measured it.
SCRAPE_LOOP = r"""
import signal, socket, sys
port, ok, stop = int(sys.argv[1]), 0, []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print("ready", flush=True)
sys.stdin.readline()
while not stop:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            data = b""
            while chunk := c.recv(65536):
                data += chunk
    except OSError:
        continue
    ok += data.startswith((b"HTTP/1.1 200", b"HTTP/1.0 200"))
print(ok, flush=True)
"""


def stress(
    sock: str,
    port: int,
    *,
    cycles: int,
    scrapers: int,
    lockers: tuple[tuple[int, ...], ...] = ((0, 1), (0,)),
) -> StressResult:
    """Scrape the metrics endpoint from `scrapers` processes while each of `lockers` (the
    GPUs one client asks for) locks SM 1350 MHz and releases, `cycles` times, on a new
    connection each time. Returns what happened; asserts nothing."""
    import threading

    from gpuenv.daemon.client import Client
    from gpuenv.errors import GpuenvError

    out = StressResult()
    mutex = threading.Lock()

    def locker(gpus: tuple[int, ...]) -> None:
        for _ in range(cycles):
            t0 = time.perf_counter()
            try:
                with Client(sock, timeout=60) as c:
                    c.lock(sm=1350, gpus=list(gpus), wait=30).release()
            except GpuenvError as err:
                where = out.internal if "the daemon failed" in str(err) else out.failed
                with mutex:
                    where.append(f"GPUs {gpus}: {err}")
                continue
            except Exception as err:
                with mutex:
                    out.failed.append(f"GPUs {gpus}: {err!r}")
                continue
            with mutex:
                out.cycles += 1
                out.lease_s.append(time.perf_counter() - t0)

    scraping = [
        subprocess.Popen(
            [sys.executable, "-c", SCRAPE_LOOP, str(port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(scrapers)
    ]
    try:
        for proc in scraping:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        locking = [threading.Thread(target=locker, args=(g,), daemon=True) for g in lockers]
        t0 = time.perf_counter()
        for proc in scraping:  # all at once: the rate is counted from here
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for t in locking:
            t.start()
        for t in locking:
            t.join()
        out.scrape_s = time.perf_counter() - t0
        for proc in scraping:
            proc.terminate()
        for proc in scraping:
            answered, _ = proc.communicate(timeout=30)  # (closes its stdin)
            out.scrapes += int(answered.split()[-1])
    finally:
        for proc in scraping:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out
