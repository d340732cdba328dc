"""Bad CLI input, generated: every command, every flag, the environment variables,
and faults of the file system around them (shared by tests/test_cli_fuzz.py and
benchmarks/cli_fuzz.py).

A `Case` is an argv, extra environment and a fault; `run_case` runs it in process
(click's CliRunner: fast) or in a fresh interpreter (for the faults a process needs:
standard output on /dev/full, a file-size limit); `problems` says what went wrong:
a traceback, an exit code gpuenv does not document, a GPU setting left changed, or
a file left behind.

The faults that need an unwritable directory use /sys when running as root (root
writes anywhere else, and /sys refuses even root), else a directory made read-only.
"""

from __future__ import annotations

import dataclasses
import os
import random
import resource
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuenv.errors import EXIT_CODES

ROOT = Path(__file__).resolve().parents[1]
N_GPUS = 2

# Commands the fuzzer drives, with arguments that keep each one short: the monitor
# and the daemon would otherwise run until stopped.
COMMANDS = (
    "status",
    "doctor",
    "lock",
    "restore",
    "unlock",
    "monitor",
    "run",
    "calibrate",
    "compare",
    "plot",
    "demo",
    "daemon leases",
    "daemon check-config",
    "ops list",  # not `ops install`: its --dest may be a real system directory
    "ops show",
)

# Values that bound how long a command runs: only these are drawn for these flags.
BOUNDED = {
    "--count": ["0", "1", "2", "-1", "x", ""],
    "-n": ["0", "1", "2", "-1", "x", ""],
    "-c": ["0", "1", "2", "-1", "x", ""],
    "--interval": ["0", "0.01", "-1", "nan", "x", ""],
    "-d": ["0", "0.01", "-1", "nan", "x", ""],
    "--duration": ["0", "1", "-1", "nan", "inf", "x", ""],
    "--load-seconds": ["0", "1", "1000", "x"],
    "--period": ["0", "0.01", "-1", "nan", "x", ""],
}
WORDS = [
    "",
    "0",
    "1",
    "-1",
    "7",
    "0,1",
    "0,0",
    "all",
    "auto",
    "local",
    "cuda:0",
    "cuda:9",
    "GPU-nope",
    "1350",
    "1350,1500",
    "99999",
    "max",
    "base",
    "sustained",
    "fast",
    "nan",
    "inf",
    "1e308",
    "-0",
    "2619",
    "500",
    "5000",
    "annotate",
    "reject",
    "idle",
    "load",
    "h100",
    "legacy",
    "nope",
    "\u00e9\u00e8",
    "x" * 300,
    " ",
    "--",
    "-i",
]
ENV_KEYS = {
    "GPUENV_BACKEND": ["sim", "nvml", "tpu", "", "SIM"],
    "GPUENV_READONLY": ["1", "0", "yes", "maybe", ""],
    # (values that would make the sim a different machine would also wipe its state)
    "GPUENV_SIM_GPUS": ["2", "-3", "many", "100000"],
    "GPUENV_SIM_ROOT": ["1", "0", "perhaps"],
    "GPUENV_SIM_PROFILE": ["h100", "nope", ""],
    "CUDA_VISIBLE_DEVICES": ["0", "1", "", "GPU-x", "-1", "0,1"],
    "LOCAL_RANK": ["0", "1", "9", "x"],
    "SLURM_LOCALID": ["0", "x"],
    "GPUENV_SOCKET": ["@sock", "@nodir"],
}
FAULTS = ("none", "unwritable_state", "unwritable_sim_state")
PROCESS_FAULTS = ("dev_full_stdout", "fsize_limit")


@dataclasses.dataclass
class Case:
    argv: list[str]
    env: dict[str, str]
    fault: str = "none"
    fsize: int = 0  # bytes, for fsize_limit

    def describe(self) -> str:
        env = " ".join(f"{k}={v!r}" for k, v in self.env.items())
        fault = f" [{self.fault}{f' {self.fsize}' if self.fault == 'fsize_limit' else ''}]"
        return f"{env} gpuenv {' '.join(repr(a) for a in self.argv)}{fault}"


@dataclasses.dataclass
class Outcome:
    code: int
    output: str


class Workspace:
    """A temporary directory with the sim's state, the journal and input files."""

    def __init__(self, path: Path):
        self.path = path
        self.state = path / "state"
        self.sim_state = path / "sim.json"
        self.unwritable = self._unwritable_dir()
        files = path / "in"
        files.mkdir(parents=True, exist_ok=True)
        self.inputs = {
            "@binary": files / "run.png",
            "@truncated": files / "cut.jsonl",
            "@empty": files / "empty.jsonl",
            "@notjson": files / "notes.jsonl",
            "@dir": files,
            "@missing": files / "missing.jsonl",
            "@nodir": path / "no" / "such" / "dir" / "r.jsonl",
            "@unwritable": self.unwritable / "r.jsonl",
        }
        self.inputs["@binary"].write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe" * 8)
        self.inputs["@empty"].write_text("")
        self.inputs["@notjson"].write_text("hello\nworld\n")
        self.good = files / "good.jsonl"

    def _unwritable_dir(self) -> Path:
        if os.geteuid() == 0:
            return Path("/sys/gpuenv-fuzz")  # refuses even root (EPERM/EACCES)
        ro = self.path / "ro"
        ro.mkdir(exist_ok=True)
        ro.chmod(0o555)
        return ro

    def make_good_run(self) -> None:
        """A real results file, written by 'gpuenv run' on the simulated GPU."""
        code = subprocess.run(
            [sys.executable, "-m", "gpuenv", "run", "-o", str(self.good), "--", "true"],
            env=self.env({}),
            capture_output=True,
            timeout=60,
        ).returncode
        assert code == 0, "could not write a results file for the fuzzer"
        text = self.good.read_text()
        self.inputs["@good"] = self.good
        self.inputs["@truncated"].write_text(text[: len(text) // 2])

    def env(self, extra: dict[str, str], fault: str = "none") -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUENV_")}
        env.update(
            GPUENV_BACKEND="sim",
            GPUENV_SIM_GPUS=str(N_GPUS),
            GPUENV_STATE_DIR=str(self.state),
            GPUENV_SIM_STATE=str(self.sim_state),
            GPUENV_SOCKET=str(self.path / "no-daemon.sock"),
            PYTHONPATH=str(ROOT),
        )
        for key, value in extra.items():
            env[key] = self.resolve(value)
        if fault == "unwritable_state":
            env["GPUENV_STATE_DIR"] = str(self.unwritable / "state")
        elif fault == "unwritable_sim_state":
            env["GPUENV_SIM_STATE"] = str(self.unwritable / "sim.json")
        return env

    def resolve(self, word: str) -> str:
        if word == "@sock":
            return str(self.path / "d.sock")
        target = self.inputs.get(word)
        return str(target) if target is not None else word

    # -- what the GPUs and the directory hold --------------------------------------------

    def settings(self) -> list[tuple[Any, ...]]:
        from gpuenv.backend.sim import SimBackend

        sim = SimBackend(n_gpus=N_GPUS, state_file=self.sim_state)
        try:
            out = []
            for i in range(N_GPUS):
                t = sim.truth(i)
                out.append(
                    (t.locked_sm, t.locked_mem, t.app_sm_mhz, t.app_mem_mhz, t.power_limit_w)
                )
            return out
        finally:
            sim.close()

    def files(self) -> set[str]:
        out = set()
        for folder, dirs, names in os.walk(self.path):
            dirs[:] = [d for d in dirs if not d.startswith("ro")]
            for name in names + dirs:
                out.add(os.path.relpath(os.path.join(folder, name), self.path))
        return out

    def prepare(self) -> None:
        """A starting state that is not the driver's default (650 W on GPU 1, application
        clocks on GPU 0), so that a restore to defaults instead of the original shows."""
        from gpuenv.backend.sim import SimBackend

        sim = SimBackend(n_gpus=N_GPUS, state_file=self.sim_state)
        try:
            sim.set_power_limit(1, 650.0)
            sim.set_app_clocks(0, 2619, 1500)
        finally:
            sim.close()

    def reset(self) -> None:
        """Back to the starting point: 'gpuenv restore --all' (exact), then no journal."""
        from click.testing import CliRunner

        from gpuenv.cli import cli

        env = self.env({})
        unset: dict[str, str | None] = {k: None for k in os.environ if k not in env}
        CliRunner().invoke(cli, ["restore", "--all"], env={**unset, **env}, obj={})
        shutil.rmtree(self.state, ignore_errors=True)


# -- generating cases ---------------------------------------------------------------------


def _options(command: str) -> list[tuple[str, bool]]:
    """(flag, takes a value) for every option of a command, hidden ones included."""
    from gpuenv.cli import cli

    group: Any = cli
    ctx: Any = None
    cmd: Any = None
    for part in command.split():
        cmd = group.get_command(ctx, part)
        group = cmd
    out = []
    for param in cmd.params:
        if getattr(param, "param_type_name", "") != "option":
            continue
        for opt in [*param.opts, *param.secondary_opts]:
            if opt not in ("-h", "--help"):
                out.append((opt, not param.is_flag))
    return out


def _tail(command: str, rng: random.Random) -> list[str]:
    """Positional arguments, and what keeps the command short."""
    paths = ["@good", "@binary", "@truncated", "@empty", "@notjson", "@dir", "@missing", "x"]
    if command == "run":
        cmd = rng.choice(
            [
                ["true"],
                ["false"],
                ["sh", "-c", "exit 3"],
                ["/no/such/cmd"],
                ["@binary"],
                ["@dir"],
                [],
            ]
        )
        return ["--", *cmd] if cmd or rng.random() < 0.5 else []
    if command == "compare":
        return [rng.choice(paths) for _ in range(rng.choice([0, 1, 2, 2, 2, 3]))]
    if command == "ops show":
        return [rng.choice(["unit", "prolog", "rules", "x", "", "../unit"])]
    if command == "plot":
        return [rng.choice(paths) for _ in range(rng.choice([0, 1, 1, 1, 2]))]
    if command == "demo":
        return ["--fast"]
    if command == "monitor":
        return rng.choice([["--once"], ["-n", "1"], ["--json", "-n", "1"], ["--csv", "-n", "1"]])
    if command == "calibrate":
        return ["--duration", "1", "--no-save"] if rng.random() < 0.8 else ["--duration", "x"]
    return []


def _value(flag: str, rng: random.Random) -> str:
    if flag in BOUNDED:
        return rng.choice(BOUNDED[flag])
    if flag in ("-o", "--output", "--config", "--socket"):
        pool = [
            "@nodir",
            "@unwritable",
            "@dir",
            "@binary",
            "out.jsonl",
            "out.png",
            "o.bmpx",
            "@sock",
        ]
        return rng.choice(pool)
    return rng.choice(WORDS)


def generate(rng: random.Random, *, process_faults: bool = False) -> Case:
    command = rng.choice(COMMANDS)
    argv: list[str] = []
    if rng.random() < 0.3:
        argv.append(rng.choice(["--sim", "--dry-run"]))
    argv += command.split()
    options = _options(command)
    for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 4]) if options else 0):
        flag, takes = rng.choice(options)
        argv.append(flag)
        if takes and rng.random() < 0.95:
            argv.append(_value(flag, rng))
    if rng.random() < 0.05:
        argv.append(rng.choice(["--no-such-flag", "-Z", "--sim", "--dry-run"]))
    if command == "monitor" and any(a in ("--count", "-n", "-1", "--once") for a in argv):
        tail: list[str] = []
    elif command == "status" and set(argv) & {"-l", "--loop", "--interval", "-lms", "--loop-ms"}:
        tail = ["-lms", "0"]  # a loop runs until Ctrl-C: keep every status case bounded
    else:
        tail = _tail(command, rng)
    # the run command's own words come last: click stops at '--'
    split = argv.index("run") + 1 if command == "run" and "--" in tail else len(argv)
    argv = argv[:split] + argv[split:] + tail
    env = {k: rng.choice(v) for k, v in ENV_KEYS.items() if rng.random() < 0.12}
    if process_faults and rng.random() < 0.6:  # what only a fresh interpreter can suffer
        fault = rng.choice(PROCESS_FAULTS)
    else:
        fault = rng.choice(FAULTS) if rng.random() < 0.4 else "none"
    return Case(argv, env, fault, rng.choice([0, 1, 64, 300, 700, 1500, 4096]))


# -- running and judging --------------------------------------------------------------------


def run_case(ws: Workspace, case: Case, *, in_process: bool, timeout: float = 60) -> Outcome:
    argv = [ws.resolve(a) for a in case.argv]
    env = ws.env(case.env, case.fault)
    if in_process:
        from click.testing import CliRunner

        from gpuenv.cli import cli

        unset: dict[str, str | None] = {k: None for k in os.environ if k not in env}
        result = CliRunner().invoke(cli, argv, env={**unset, **env}, obj={})
        text = result.output
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            import traceback

            text += "".join(traceback.format_exception(result.exception))
        return Outcome(result.exit_code, text)
    stdout: Any = subprocess.PIPE
    preexec = None
    if case.fault == "dev_full_stdout":
        stdout = open("/dev/full", "w")  # noqa: SIM115
    elif case.fault == "fsize_limit":
        limit = case.fsize

        def preexec() -> None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gpuenv", *argv],
            env=env,
            stdout=stdout,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            preexec_fn=preexec,
            cwd=ws.path,
            check=False,
        )
    finally:
        if stdout is not subprocess.PIPE:
            stdout.close()
    out = (proc.stdout or b"").decode(errors="replace") + proc.stderr.decode(errors="replace")
    return Outcome(proc.returncode, out)


def documented(code: int, case: Case) -> bool:
    # `run` exits with the command's own code, or dies of its signal
    return code in EXIT_CODES or ("run" in case.argv and "--" in case.argv)


def problems(ws: Workspace, case: Case, outcome: Outcome, before: dict[str, Any]) -> list[str]:
    found = []
    if "Traceback (most recent call last)" in outcome.output:
        found.append("a traceback")
    if not documented(outcome.code, case):
        found.append(f"exit code {outcome.code}, not a documented one")
    files = ws.files()
    tmp = sorted(f for f in files if f.endswith(".tmp"))
    if tmp:
        found.append(f"temporary files left: {tmp}")
    allowed = _changes_allowed(case) or _reset_asked(case, outcome)
    if outcome.code not in (0, 1) and not allowed:
        new = sorted(f for f in files - before["files"] if not _bookkeeping(f))
        if new:
            found.append(f"files left by a failed command: {new}")
        if ws.settings() != before["settings"]:
            found.append("a GPU setting changed although the command failed")
    return found


def _changes_allowed(case: Case) -> bool:
    """`run` changes and restores; a command it ran may fail with its own code."""
    return "run" in case.argv and "--" in case.argv


def _reset_asked(case: Case, outcome: Outcome) -> bool:
    """`--defaults` resets GPUs on purpose (to the driver's defaults, not what was there):
    when it ran (exit 0), or did and only its report could not be written (stdout on a
    full device: exit 2 and "cannot write to standard output"), the changed GPU is what
    the user asked for."""
    return "--defaults" in case.argv and (
        outcome.code == 0
        or (case.fault == "dev_full_stdout" and "cannot write to standard output" in outcome.output)
    )


def _bookkeeping(path: str) -> bool:
    name = os.path.basename(path)
    return (
        name.endswith((".lock", ".lock-private"))
        or path in ("state", "state/original")  # the journal's directories (kept originals')
        or name.startswith("sim.json")
        or name.startswith("gpuenv-sim")
    )


def check(ws: Workspace, case: Case, *, in_process: bool) -> tuple[Outcome, list[str]]:
    """Run one case from a clean start and judge it; the workspace is reset after."""
    before = {"files": ws.files(), "settings": ws.settings()}
    outcome = run_case(ws, case, in_process=in_process)
    found = problems(ws, case, outcome, before)
    ws.reset()
    if ws.settings() != before["settings"]:
        if not _reset_asked(case, outcome):
            found.append("'gpuenv restore' did not put the GPUs back afterwards")
        ws.prepare()  # the next case starts from the same state either way
    return outcome, found


def sample(n: int, seed: int, *, process_share: float) -> Sequence[tuple[Case, bool]]:
    """`n` cases; about `process_share` of them run in a fresh interpreter."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        in_process = rng.random() >= process_share
        out.append((generate(rng, process_faults=not in_process), in_process))
    return out
