"""gpuenv run: a wrapped command on the simulated GPU, as separate processes.

The command under test is a small Python script; gpuenv runs as
`python -c 'from gpuenv.cli import main; main()' --sim run ...` with the
test's own sim state file and journal directory (conftest), so a test can read
the simulated GPU's truth (what is really locked) from its own SimBackend.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpuenv.backend.sim import SimBackend
from gpuenv.journal import Journal
from gpuenv.region import Edge
from gpuenv.results import load_run
from gpuenv.runner import (
    RUN_NAME,
    Region,
    RegionTracker,
    RunResult,
    default_gpu_selector,
    merge_windows,
    rank_of,
    rank_output_path,
    selector_env,
    summary_table,
)
from gpuenv.telemetry import Window

ROOT = Path(__file__).resolve().parent.parent
GPUENV = [sys.executable, "-c", "from gpuenv.cli import main; main()"]


def gpuenv_run(*args: str, input: str | None = None, timeout: float = 30, **kw):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.update(kw.pop("env", {}))
    return subprocess.run(
        [*GPUENV, "--sim", "run", *args],
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=kw.pop("cwd", None),
    )


def script(tmp_path: Path, body: str, name: str = "child.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.fixture
def sim():
    """The test's view of the simulated GPU (a client of the same state file)."""
    backend = SimBackend(state_file=os.environ["GPUENV_SIM_STATE"])
    backend.set_persistence_mode(0, True)  # only gpuenv may put settings back, not a de-init
    yield backend
    backend.close()


# -- the command is untouched ------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 42])
def test_exit_code_passes_through(tmp_path, code):
    child = script(tmp_path, f"import sys; sys.exit({code})")
    result = gpuenv_run("--", sys.executable, child)
    assert result.returncode == code, result.stderr
    assert f"exited with {code}" in result.stderr


def test_stdin_and_stdout_are_the_commands(tmp_path):
    child = script(
        tmp_path,
        """
        import sys
        data = sys.stdin.read()
        sys.stdout.write(data.upper())
        sys.stderr.write("child stderr\\n")
        """,
    )
    result = gpuenv_run("--", sys.executable, child, input="hello\nworld\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "HELLO\nWORLD\n"  # nothing of gpuenv's on stdout
    assert result.stderr.startswith("child stderr\n")
    assert "gpuenv run:" in result.stderr  # the summary goes to stderr, after


def test_options_of_the_command_are_not_gpuenvs(tmp_path):
    child = script(tmp_path, "import sys; print(sys.argv[1:])")
    result = gpuenv_run(sys.executable, child, "-o", "x", "--sm", "1")  # no '--'
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "['-o', 'x', '--sm', '1']"


def test_command_not_found_is_127_and_nothing_is_locked(sim):
    result = gpuenv_run("--sm", "1350", "--", "no-such-command-gpuenv")
    assert result.returncode == 127
    assert "command not found: no-such-command-gpuenv" in result.stderr
    assert sim.truth(0).locked_sm is None and Journal().entries() == []


def test_retry_policy_is_refused():
    result = gpuenv_run("--policy", "retry", "--", "true")
    assert result.returncode == 2 and "retry" in result.stderr


# -- signals -----------------------------------------------------------------------------

SIGNAL_CHILD = """
import os, signal, sys, time
got = []
signal.signal(signal.SIGINT, lambda s, f: got.append("INT"))
signal.signal(signal.SIGTERM, lambda s, f: got.append("TERM"))
open(sys.argv[1], "w").write(str(os.getpid()))
deadline = time.monotonic() + 10
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.3)  # a second copy of the signal would arrive by now
print(" ".join(got))
sys.exit(10 + len(got))
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_sent_to_gpuenv_reach_the_command_once(tmp_path, sig):
    child = script(tmp_path, SIGNAL_CHILD)
    ready = tmp_path / "ready"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [*GPUENV, "--sim", "run", "--", sys.executable, child, str(ready)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 20
        while not (ready.exists() and ready.read_text()) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), "the command never started"
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert out.split() == [sig.name[3:]]  # handled exactly once
    assert proc.returncode == 11, err  # the command's exit code (it handled the signal)


def test_a_command_killed_by_a_signal_kills_gpuenv_the_same_way(tmp_path):
    child = script(tmp_path, "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    result = gpuenv_run("--", sys.executable, child)
    assert result.returncode == -signal.SIGTERM
    assert "was killed by SIGTERM" in result.stderr


# -- the lock is always put back ---------------------------------------------------------


def test_lock_held_during_the_run_and_restored_after_a_sigkill_of_the_command(tmp_path, sim):
    before = sim.truth(0)
    child = script(
        tmp_path,
        """
        import os, signal, sys
        from gpuenv.backend.sim import SimBackend
        b = SimBackend(state_file=os.environ["GPUENV_SIM_STATE"])
        print(b.truth(0).locked_sm, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        """,
    )
    result = gpuenv_run("--sm", "1350", "--", sys.executable, child)
    assert result.stdout.strip() == "(1350, 1350)"  # locked while the command ran
    assert result.returncode == -signal.SIGKILL
    after = sim.truth(0)
    assert (after.locked_sm, after.power_limit_w, after.app_sm_mhz) == (
        before.locked_sm,
        before.power_limit_w,
        before.app_sm_mhz,
    )
    assert Journal().entries() == []


def test_lock_restored_when_gpuenv_itself_is_killed(tmp_path, sim):
    child = script(
        tmp_path,
        """
        import os, sys, time
        open(sys.argv[1], "w").write("x")
        time.sleep(30)
        """,
    )
    ready = tmp_path / "ready"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [*GPUENV, "--sim", "run", "--sm", "1350", "--", sys.executable, child, str(ready)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,  # so the test can kill the command too, afterwards
    )
    try:
        deadline = time.monotonic() + 20
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sim.truth(0).locked_sm == (1350, 1350)
        proc.kill()  # SIGKILL: no finally runs in gpuenv; its watchdog restores
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while sim.truth(0).locked_sm is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sim.truth(0).locked_sm is None
    finally:
        os.killpg(proc.pid, signal.SIGKILL)


# -- regions and the results file --------------------------------------------------------

REGIONS_CHILD = """
import json, sys, time
import gpuenv
times = {}
with gpuenv.region("load") as r:
    time.sleep(0.2)
times["load"] = [r.elapsed_s]
times["step"] = []
for _ in range(3):
    with gpuenv.region("step") as r:
        time.sleep(0.05)
    times["step"].append(r.elapsed_s)
print(json.dumps(times))
"""


def test_regions_from_the_command_become_measurements(tmp_path):
    child = script(tmp_path, REGIONS_CHILD)
    out = tmp_path / "run.jsonl"
    result = gpuenv_run("-o", str(out), "--", sys.executable, child)
    assert result.returncode == 0, result.stderr
    told = json.loads(result.stdout)
    run = load_run(out)
    by_name = {m.name: m for m in run.measurements}
    assert list(by_name) == [RUN_NAME, "load", "step"]
    assert by_name["step"].times_s == pytest.approx(told["step"], abs=1e-6)  # the child's clock
    assert by_name["load"].times_s == pytest.approx(told["load"], abs=1e-6)
    assert len(by_name["step"].windows) == 3 and by_name["step"].windows[0].n_samples >= 1
    assert by_name["load"].summary_windows[0].sm_mhz_mean == 345  # the parent's sim is idle
    whole = by_name[RUN_NAME]
    assert whole.times_s[0] > sum(told["step"]) + told["load"][0]
    assert whole.extra["returncode"] == 0
    assert [r["name"] for r in whole.extra["regions"]] == ["load", "step", "step", "step"]
    trace = whole.extra["trace"]  # what gpuenv plot draws
    assert len(trace["t_s"]) == len(trace["sm_mhz"]) == len(trace["power_w"]) > 5
    assert trace["t0"] == pytest.approx(whole.summary_windows[0].t0)
    assert run.metadata["command"] == [sys.executable, child]
    for name in ("load", "step"):
        assert name in result.stderr  # the summary table


# Another tool moves the locked clock in the middle of the run (as `nvidia-smi -lgc`
# would): the parent sees the SM clock drift between reps of "step", which a lock
# was meant to prevent, so every rep is affected and --policy reject rejects it.
DRIFT_CHILD = """
import os, sys, time
import gpuenv
from gpuenv.backend.sim import SimBackend
for k in range(6):
    if k == 3:
        other_tool = SimBackend(state_file=os.environ["GPUENV_SIM_STATE"])
        other_tool.set_locked_sm_clocks(0, 1200, 1200)
        time.sleep(0.3)
    with gpuenv.region("step"):
        time.sleep(0.15)
"""


def test_policy_reject_exits_1_when_a_region_is_rejected(tmp_path):
    child = script(tmp_path, DRIFT_CHILD)
    result = gpuenv_run("--sm", "1350", "--policy", "reject", "--", sys.executable, child)
    assert result.returncode == 1, result.stderr
    assert "rejected: step" in result.stderr and "clock_drift" in result.stderr
    annotated = gpuenv_run("--sm", "1350", "--", sys.executable, child)
    assert annotated.returncode == 0, annotated.stderr
    assert "clock_drift" in annotated.stderr


def test_policy_reject_keeps_a_failing_commands_code(tmp_path):
    child = script(tmp_path, DRIFT_CHILD + "\nsys.exit(5)\n")
    result = gpuenv_run("--sm", "1350", "--policy", "reject", "--", sys.executable, child)
    assert result.returncode == 5, result.stderr


def test_each_rank_writes_its_own_file_for_its_own_gpu(tmp_path):
    child = script(tmp_path, "print('rank')")
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "GPUENV_SIM_GPUS": "2"}
    result = gpuenv_run("-o", str(tmp_path / "run.jsonl"), "--", sys.executable, child, env=env)
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "run.jsonl").exists()
    run = load_run(tmp_path / "run.rank1.jsonl")
    assert run.metadata["rank"] == 1
    assert [g["index"] for g in run.metadata["gpus"]] == [1]
    assert run.measurements[0].gpus == (1,)


def test_dry_run_runs_nothing(tmp_path, sim):
    marker = tmp_path / "ran"
    child = script(tmp_path, f"open({str(marker)!r}, 'w')")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [*GPUENV, "--sim", "--dry-run", "run", "--sm", "1350", "--", sys.executable, child],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "would lock" in result.stdout and "1350" in result.stdout
    assert not marker.exists() and sim.truth(0).locked_sm is None


# -- the pieces, in-process --------------------------------------------------------------


def _w(t0, t1, **kw) -> Window:
    return Window(gpu=0, t0=t0, t1=t1, n_samples=kw.pop("n", 1), **kw)


def test_merge_windows_weights_by_time_and_adds_counters():
    a = _w(
        0,
        1,
        sm_mhz_mean=1000,
        sm_mhz_min=900,
        sm_mhz_max=1100,
        power_w_mean=100,
        energy_j=100.0,
        temp_c_start=30,
        temp_c_end=40,
        temp_c_max=40,
        reasons=0x1,
        reasons_start=0x1,
        reason_s={"power": 0.5},
        lock_held=True,
        sm_mhz_start=900,
    )
    b = _w(
        1,
        4,
        sm_mhz_mean=2000,
        sm_mhz_min=1900,
        sm_mhz_max=2100,
        power_w_mean=300,
        energy_j=900.0,
        temp_c_start=40,
        temp_c_end=50,
        temp_c_max=55,
        reasons=0x4,
        reason_s={"power": 1.0, "thermal": 0.25},
        lock_held=False,
        sm_mhz_end=2000,
    )
    m = merge_windows([a, b])
    assert (m.t0, m.t1, m.n_samples) == (0, 4, 2)
    assert m.sm_mhz_mean == pytest.approx(1750)  # (1000*1 + 2000*3) / 4
    assert m.power_w_mean == pytest.approx(250)
    assert (m.sm_mhz_min, m.sm_mhz_max) == (900, 2100)
    assert m.energy_j == 1000.0
    assert (m.temp_c_start, m.temp_c_end, m.temp_c_max) == (30, 50, 55)
    assert m.reasons == 0x5 and m.reasons_start == 0x1
    assert m.reason_s == {"power": 1.5, "thermal": 0.25}
    assert m.lock_held is False
    assert (m.sm_mhz_start, m.sm_mhz_end) == (900, 2000)
    assert merge_windows([a]) is a


def test_tracker_pairs_edges_by_process_and_id_and_closes_what_is_open():
    tr = RegionTracker()
    tr.feed(Edge("b", 10, 1, 1.0, "a"))
    tr.feed(Edge("b", 11, 1, 1.5, "a"))  # another process, same id
    tr.feed(Edge("e", 10, 1, 2.0, None))
    tr.feed(Edge("e", 99, 7, 2.5, None))  # an end without a begin
    tr.close_all(3.0)
    assert [(r.pid, r.t0, r.t1, r.complete) for r in tr.finished] == [
        (10, 1.0, 2.0, True),
        (11, 1.5, 3.0, False),
    ]
    assert tr.ignored == 1 and tr.names == ["a"]


def test_defaults_under_torchrun_slurm_and_cuda_visible_devices():
    assert default_gpu_selector({}) == "all"
    assert default_gpu_selector({"LOCAL_RANK": "3"}) == "local"
    assert default_gpu_selector({"CUDA_VISIBLE_DEVICES": "2,3"}) == "cuda:0,cuda:1"
    assert default_gpu_selector({"SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "5"}) == "cuda:0"
    assert default_gpu_selector({"SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "0,1"}) == "local"
    assert selector_env({"SLURM_LOCALID": "1"})["LOCAL_RANK"] == "1"
    assert rank_of({"RANK": "2", "WORLD_SIZE": "4"}) == 2
    assert rank_of({"RANK": "0", "WORLD_SIZE": "1"}) is None  # one process: no suffix
    assert rank_of({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}) == 5
    assert rank_of({}) is None
    assert rank_output_path("out/run.jsonl", 3) == Path("out/run.rank3.jsonl")
    assert rank_output_path("run.jsonl", None) == Path("run.jsonl")


def _idle_start_window(t0: float, t1: float) -> Window:
    # a command's start on a real GPU: idle (GpuIdle) until its CUDA context exists
    return _w(t0, t1, sm_mhz_start=345, sm_mhz_mean=1500, sm_mhz_min=345, sm_mhz_max=1980,
              reasons=0x1, reasons_start=0x1, reasons_end=0x0)  # fmt: skip


def test_the_idle_start_of_a_command_is_not_held_against_it_but_a_regions_is():
    from gpuenv.runner import build_measurements
    from gpuenv.verdict import GpuFacts

    facts = {0: GpuFacts(max_sm_mhz=1980.0)}
    run = Region(RUN_NAME, 1, 0.0, 10.0)
    run.windows = {0: _idle_start_window(0.0, 10.0)}
    (whole,) = build_measurements(
        [], run, gpus=[0], facts=facts, policy="reject", stable_clocks=False, wall_at=float
    )
    warm = next(f for f in whole.findings if f.kind == "warmup_ramp")
    assert warm.severity == "info" and "expected: a command starts" in warm.message
    assert whole.verdict != "rejected"
    region = Region("first step", 1, 0.0, 1.0)
    region.windows = {0: _idle_start_window(0.0, 1.0)}
    whole, step = build_measurements(
        [region], run, gpus=[0], facts=facts, policy="reject", stable_clocks=False, wall_at=float
    )
    assert step.verdict == "rejected"  # a region that began cold measured the warmup
    assert whole.policy == "annotate"  # with regions, the policy is theirs


def test_exit_status_rules():
    def res(code: int, verdict: str) -> RunResult:
        from gpuenv.results import Measurement

        return RunResult(code, [Measurement.build("x", [1.0], verdict=verdict)], None, 1.0)

    assert res(0, "rejected").exit_status("reject") == 1
    assert res(0, "rejected").exit_status("annotate") == 0
    assert res(4, "rejected").exit_status("reject") == 4
    assert res(-9, "ok").exit_status("annotate") == 137


def test_summary_table_has_a_row_per_region_and_the_findings():
    from gpuenv.results import Measurement
    from gpuenv.verdict import Finding

    w = _w(
        0,
        2,
        sm_mhz_mean=1350,
        sm_mhz_min=1350,
        sm_mhz_max=1350,
        power_w_mean=690,
        energy_j=1380.0,
        temp_c_start=40,
        temp_c_max=61,
        reason_s={"power": 1.25},
    )
    f = Finding("power_cap", "info", (0,), "the SW power cap held GPU 0 back", 0)
    m = Measurement.build("train", [2.0], summary_windows=(w,), findings=(f,), gpus=(0,))
    text = summary_table([m], header="gpuenv run: x")
    row = next(line for line in text.splitlines() if line.strip().startswith("train"))
    for part in ("2.00 s", "1350", "690 W", "1.38 kJ", "40-61", "power cap 1.25 s", "ok"):
        assert part in row
    assert "[info] power_cap" in text
    assert Region("r", 1, 5.0).covered_to == 5.0


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_ctrl_c_in_a_terminal_reaches_the_command_once(tmp_path):
    # The terminal sends SIGINT to the whole foreground process group, gpuenv and the
    # command alike: gpuenv must not forward a second copy.
    child = script(tmp_path, SIGNAL_CHILD)
    ready, out = tmp_path / "ready", tmp_path / "out"
    sock = str(tmp_path / "tmux.sock")
    exports = " ".join(
        f"{k}={shlex.quote(v)}" for k, v in os.environ.items() if k.startswith("GPUENV_")
    )
    cmd = " ".join(shlex.quote(c) for c in [*GPUENV, "--sim", "run", "--", sys.executable])
    line = (
        f"cd {shlex.quote(str(ROOT))} && env {exports} {cmd} {shlex.quote(child)} {ready} "
        f"> {out} 2>&1; echo $? >> {out}; sleep 30"
    )
    tmux = ["tmux", "-S", sock]
    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "t", "-x", "100", "-y", "20", line],
        check=True,
        timeout=10,
    )
    try:
        deadline = time.monotonic() + 20
        while not (ready.exists() and ready.read_text()) and time.monotonic() < deadline:
            time.sleep(0.02)
        subprocess.run([*tmux, "send-keys", "-t", "t", "C-c"], check=True, timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            lines = out.read_text().splitlines() if out.exists() else []
            if lines and lines[-1].strip().isdigit():
                break
            time.sleep(0.05)
        lines = out.read_text().splitlines()
        assert lines[0] == "INT"  # once: the child printed one name
        assert lines[-1] == "11"  # its exit code, passed through
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True, timeout=10)


@pytest.mark.gpu
def test_run_on_the_real_gpu_samples_and_writes_results(tmp_path):
    child = script(tmp_path, REGIONS_CHILD)
    out = tmp_path / "run.jsonl"
    env = dict(os.environ, PYTHONPATH=str(ROOT), GPUENV_READONLY="1")  # never write the GPU
    result = subprocess.run(
        [*GPUENV, "run", "-i", "0", "-o", str(out), "--", sys.executable, child],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    run = load_run(out)
    assert [m.name for m in run.measurements] == [RUN_NAME, "load", "step"]
    w = run.measurements[0].summary_windows[0]
    assert w.sm_mhz_mean and w.sm_mhz_mean > 0 and w.power_w_mean and w.power_w_mean > 0
    assert len(run.measurements[0].extra["trace"]["t_s"]) > 5
