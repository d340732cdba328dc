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
from gpuenv.clocks.journal import Journal
from gpuenv.devices import own_env, own_selector
from gpuenv.results import load_run
from gpuenv.run.ranks import rank_of, rank_output_path
from gpuenv.run.report import RUN_NAME
from gpuenv.run.runner import RunResult

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


def test_a_standing_lock_it_did_not_take_is_named_not_called_unlocked(sim):
    """root's standing lock holds the SM at 1500 MHz while `gpuenv run` takes none: the
    summary says the clocks are locked, by whom and to what (its SM column reads 1500),
    never "clocks not locked"; once restored, it says they are not."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    locked = subprocess.run(
        [*GPUENV, "--sim", "lock", "--sm", "1500", "-i", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert locked.returncode == 0, locked.stderr
    try:
        result = gpuenv_run("--", "true")
        assert result.returncode == 0, result.stderr
        head = result.stderr.splitlines()[0]
        assert "clocks not locked" not in head, head
        assert "clocks locked (SM 1500 MHz) by a standing lock (root: " in head, head
        assert "--sim lock --sm 1500 -i 0, since " in head, head
    finally:
        subprocess.run([*GPUENV, "--sim", "restore"], env=env, capture_output=True, timeout=30)
    assert "; clocks not locked" in gpuenv_run("--", "true").stderr.splitlines()[0]


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
    # the header, and the results' record, say which GPU and why
    assert "on GPU 1 (NVIDIA H100 80GB HBM3) (LOCAL_RANK=1 -> GPU 1)" in result.stderr
    assert run.metadata["gpus_why"] == "LOCAL_RANK=1 -> GPU 1"


def test_each_gpu_is_sampled_by_uuid_in_cuda_visible_devices_order(tmp_path):
    # a command given GPUs 3 and 1 by UUID (as a scheduler may write them) has their
    # telemetry under their own index and UUID, in CUDA's order; a rank under that order
    # samples its LOCAL_RANK's GPU (issue 33 item 5)
    node = SimBackend(n_gpus=4, state_file=None)
    uuid3, uuid1 = node.device_info(3).uuid, node.device_info(1).uuid
    child = script(tmp_path, "import time; time.sleep(0.3)")
    env = {"GPUENV_SIM_GPUS": "4", "CUDA_VISIBLE_DEVICES": f"{uuid3},{uuid1[:12]}"}
    result = gpuenv_run("-o", str(tmp_path / "a.jsonl"), "--", sys.executable, child, env=env)
    assert result.returncode == 0, result.stderr
    run = load_run(tmp_path / "a.jsonl")
    assert run.measurements[0].gpus == (3, 1)
    assert [w.gpu for w in run.measurements[0].summary_windows] == [3, 1]
    gpus = {g["index"]: g["uuid"] for g in run.metadata["gpus"]}
    assert list(gpus) == [3, 1] and gpus[3] == uuid3
    env.update(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1")
    result = gpuenv_run("-o", str(tmp_path / "b.jsonl"), "--", sys.executable, child, env=env)
    assert load_run(tmp_path / "b.rank1.jsonl").measurements[0].gpus == (1,), result.stderr


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


def test_defaults_under_torchrun_slurm_and_cuda_visible_devices():
    assert own_selector({}) == "all"
    assert own_selector({"LOCAL_RANK": "3"}) == "local"
    assert own_selector({"CUDA_VISIBLE_DEVICES": "2,3"}) == "cuda:0,cuda:1"
    assert own_selector({"SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "5"}) == "cuda:0"
    assert own_selector({"SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "0,1"}) == "local"
    assert own_env({"SLURM_LOCALID": "1"})["LOCAL_RANK"] == "1"
    assert rank_of({"RANK": "2", "WORLD_SIZE": "4"}) == 2
    assert rank_of({"RANK": "0", "WORLD_SIZE": "1"}) is None  # one process: no suffix
    assert rank_of({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}) == 5
    assert rank_of({}) is None
    assert rank_output_path("out/run.jsonl", 3) == Path("out/run.rank3.jsonl")
    assert rank_output_path("run.jsonl", None) == Path("run.jsonl")


def test_exit_status_rules():
    def res(code: int, verdict: str) -> RunResult:
        from gpuenv.results import Measurement

        return RunResult(code, [Measurement.build("x", [1.0], verdict=verdict)], None, 1.0)

    assert res(0, "rejected").exit_status("reject") == 1
    assert res(0, "rejected").exit_status("annotate") == 0
    assert res(4, "rejected").exit_status("reject") == 4
    assert res(-9, "ok").exit_status("annotate") == 137


@pytest.mark.parametrize(("asked", "mode"), [(None, "thread"), ("process", "process")])
def test_run_samples_on_a_thread_unless_told(monkeypatch, sim, asked, mode):
    """The command is the benchmark, in a process of its own: a sampler process (a second
    interpreter and nvmlInit before the command starts) would keep nothing off its GIL."""
    import gpuenv.run.runner as runner_mod
    from gpuenv.telemetry import Sampler

    made: list[Sampler] = []

    class Recorded(Sampler):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            made.append(self)

    if asked is None:
        monkeypatch.delenv("GPUENV_SAMPLER", raising=False)
    else:
        monkeypatch.setenv("GPUENV_SAMPLER", asked)
    monkeypatch.setattr(runner_mod, "Sampler", Recorded)
    result = runner_mod.Runner(["true"], backend=sim, gpus=[0], quiet=True).run()
    assert result.returncode == 0
    assert [(s.mode, s.mode_reason) for s in made] == [(mode, "asked for")]
    assert made[0].child_pid is None  # stopped: no sampler process is left behind


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
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    run = load_run(out)
    assert [m.name for m in run.measurements] == [RUN_NAME, "load", "step"]
    w = run.measurements[0].summary_windows[0]
    assert w.sm_mhz_mean and w.sm_mhz_mean > 0 and w.power_w_mean and w.power_w_mean > 0
    assert len(run.measurements[0].extra["trace"]["t_s"]) > 5
