"""Find the fenced code blocks of README.md and docs/**/*.md and run them as a user would, on
the simulated GPU (tests/test_docs_examples.py; `python tests/docs_harness.py` prints the counts).

The conventions the docs follow (one per block, read from its fence and the line before it):

- The fence names what the block is: ```` ```text ```` is output (sample output, a table, a
  picture in characters) and never runs; ```` ```console ```` is a transcript: each line that
  starts with `$ ` is a command (a trailing `\\` continues it), the lines under it its output
  (not compared; a shown `gpuenv: error:` line means the command must fail, a shown
  `exit N` under a command ending `echo "exit $?"` must be what it prints, any other must
  exit 0); ```` ```bash ```` (or `sh`) is commands only, each line one (`#` comments skipped,
  `\\` continues), each must exit 0; ```` ```python ```` runs as a script; ```` ```pycon ````
  runs its `>>> `/`... ` lines as one script.
- `<!-- not run: REASON -->` on the line before the fence: the block needs what the
  simulated GPU cannot give (a real GPU, root, systemd, Slurm, Prometheus); it is counted by
  its REASON, which must say something. Every block in another language (ini, c, promql,
  yaml) needs this or the next marker.
- `<!-- file: NAME -->` on the line before the fence: the block is a file a later block uses
  (`python bench.py`): it is written to NAME in the working directory, not run itself.
- `<!-- as root: REASON -->` on the line before the fence, with "as root" in the paragraph
  just above it (the reader never sees the comment): the block runs as its fence says, as
  root even where the page runs as a second account (`run_file(..., user=)`); REASON says
  why an ordinary account cannot run it as written (it writes the GPU's settings).
- `<!-- output: TOLERANCE -->` on the line before the fence: what the block shows is what the
  tool prints, and a drift fails. On a ```` ```text ```` block: it is the output of the command
  just before it (the last command of the nearest block above that runs: a console or bash
  block's last command, a python block's whole script). On a ```` ```console ```` block: the
  lines under each command are its output. On a ```` ```pycon ```` block: the lines under
  each `>>> ` statement are what it printed (as doctest reads a session). TOLERANCE names
  how far numbers may move (`TOLERANCES`: `exact` for virtual time and output that does not
  vary, `run-to-run` for a run on the real clock); the words must match. A line `...` in the
  shown output stands for any lines (none included), `...` within a line for any text: the
  page elides what varies from run to run (a timestamp, a verdict on noise).
- `<!-- needs: MODULE[, MODULE] -->` on the line before the fence: the block runs as its fence
  says where each MODULE imports (an optional package: torch, triton); where one does not, it
  is skipped and the test of its file skips naming it (the README's test command passes on a
  machine with nothing else installed).

Each markdown file's blocks run in order in one fresh directory that is their working
directory, HOME, XDG_RUNTIME_DIR, gpuenv's state dir and the simulated machine (the host's
one for a reader, /tmp/gpuenv-sim.json; the page's own here, through GPUENV_SIM_STATE, so
that pages run side by side do not see each other's locks and loads), with no gpuenvd, and
with no GPUENV_* variable a reader would need to set:
a block gets the simulated GPU only as the page shows it (`--sim`, or an `export
GPUENV_BACKEND=sim` line, which carries to the page's later blocks as in a reader's shell;
`export` is the only command that carries). Files that one block writes (run.jsonl) are
there for the next; Python names are not: each python block stands alone (it imports and
defines what it uses), as a reader who copies one block needs.
After the last block no clock lock may be left (the journal is empty) and no command may have
left a process behind.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND_TIMEOUT_S = 60.0

SHELL = ("bash", "sh", "shell", "console")
RUNS = (*SHELL, "python", "pycon")
OUTPUT = ("text",)

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
_EXIT = re.compile(r"^exit \d+\s*$")
_MARKER = re.compile(
    r"^\s*<!--\s*(?P<key>not[ -]?run|file|needs|as root|output)\b(?P<rest>.*?)-->\s*$", re.I
)


@dataclass(frozen=True)
class Tolerance:
    """How far a number in shown output may be from the one printed: within `rel` of it, or
    within `abs_` (for numbers near zero); the text between numbers must match."""

    rel: float
    abs_: float
    why: str

    def allows(self, shown: float, printed: float) -> bool:
        return abs(shown - printed) <= max(self.abs_, self.rel * abs(shown))


TOLERANCES = {
    "exact": Tolerance(0.0, 0.0, "virtual time, or output that does not vary: as printed"),
    "run-to-run": Tolerance(
        1.0,
        1.0,
        "a run on the real clock: step times, intervals and p-values move from run to run "
        "(within 2x, or 1 near zero); the words and the shape may not",
    ),
}


class ConventionError(ValueError):
    """A block that follows none of the conventions: what to write says the message."""


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # the opening fence's line, 1-based
    lang: str  # the fence's first word ('' for none)
    text: str  # the content, its fence's indentation removed
    marker: str = ""  # the HTML comment on the line before the fence, if any
    said: str = ""  # the paragraph of prose just before the block (and its marker)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def kind(self) -> str:
        """'output', 'not run', 'file' or the language it runs in; ConventionError if none."""
        if self.marker:
            m = _MARKER.match(self.marker)
            assert m is not None
            key = m["key"].lower()
            key = key if key in ("file", "needs", "as root", "output") else "not run"
            if not self.reason():
                what = {"file": "NAME", "needs": "MODULE", "output": "TOLERANCE"}.get(key, "REASON")
                raise ConventionError(
                    f"{self.where}: `{self.marker.strip()}` says nothing: "
                    f"write `<!-- {key}: {what} -->`"
                )
            if key == "as root" and "as root" not in self.said.lower():
                raise ConventionError(
                    f"{self.where}: `{self.marker.strip()}` is a comment the reader never "
                    "sees: say 'as root' in the prose just before the block"
                )
            if key == "output":
                self.tolerance()  # a name TOLERANCES has, on a block that shows output
            elif key != "needs" and key != "as root":
                return key
        if self.lang in OUTPUT:
            return "output"
        if self.lang in RUNS:
            return self.lang
        raise ConventionError(
            f"{self.where}: a ```{self.lang} block is neither run nor marked: use ```text for "
            "output, ```console/```bash/```python for what runs on the simulated GPU, or put "
            "`<!-- not run: REASON -->` (or `<!-- file: NAME -->`) on the line before it"
        )

    def reason(self) -> str:
        """A not-run block's REASON, a file block's NAME, a needs block's MODULEs."""
        m = _MARKER.match(self.marker)
        return m["rest"].strip()[1:].strip() if m else ""

    def tolerance(self) -> Tolerance | None:
        """The tolerance an `<!-- output: NAME -->` block's numbers are compared with; None
        for a block without one; ConventionError for an unknown name or a block that does
        not show output."""
        m = _MARKER.match(self.marker)
        if not m or m["key"].lower() != "output":
            return None
        name = self.reason()
        if name not in TOLERANCES:
            raise ConventionError(
                f"{self.where}: `{self.marker.strip()}` names no tolerance: use one of "
                + ", ".join(TOLERANCES)
            )
        if self.lang not in ("text", "console", "pycon"):
            raise ConventionError(
                f"{self.where}: `{self.marker.strip()}` is for a ```text block (the output "
                "of the command before it) or a ```console or ```pycon transcript"
            )
        return TOLERANCES[name]

    def as_root(self) -> bool:
        """The block runs as root (`<!-- as root: REASON -->`): an ordinary account cannot run
        it as written (it writes the GPU's settings without gpuenvd, installs a service)."""
        m = _MARKER.match(self.marker)
        return bool(m) and m["key"].lower() == "as root"

    def missing(self) -> list[str]:
        """The modules a `needs:` block names that do not import here."""
        m = _MARKER.match(self.marker)
        if not m or m["key"].lower() != "needs":
            return []
        names = [n.strip() for n in self.reason().split(",") if n.strip()]
        return [n for n in names if importlib.util.find_spec(n) is None]


def markdown_files(root: Path = ROOT) -> list[Path]:
    """README.md, then docs/**/*.md in path order: wherever the docs put a block, it is found."""
    files = [root / "README.md"] if (root / "README.md").exists() else []
    return files + sorted((root / "docs").rglob("*.md"))


def blocks(path: Path, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of one markdown file, in order; an unclosed fence is an error."""
    lines = path.read_text(encoding="utf-8").split("\n")
    rel = str(path.relative_to(root)) if path.is_relative_to(root) else str(path)
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip()
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = next((j for j in range(i + 1, len(lines)) if close.match(lines[j])), None)
        if end is None:
            raise ConventionError(f"{rel}:{i + 1}: the fence opened here is never closed")
        body = [
            ln[len(indent) :] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1 : end]
        ]
        prev = next((j for j in range(i - 1, -1, -1) if lines[j].strip()), -1)
        marker = lines[prev] if prev >= 0 and _MARKER.match(lines[prev]) else ""
        said = _paragraph_before(lines, prev - 1 if marker else prev)
        lang = info.split()[0].lstrip("{.").rstrip("}").lower() if info else ""
        out.append(Block(rel, i + 1, lang, "\n".join(body) + "\n", marker, said))
        i = end + 1
    return out


def _paragraph_before(lines: list[str], j: int) -> str:
    """The paragraph of prose that ends at line `j` (skipping blank lines; "" after a fence)."""
    while j >= 0 and not lines[j].strip():
        j -= 1
    para: list[str] = []
    while j >= 0 and lines[j].strip() and not _FENCE.match(lines[j]):
        para.insert(0, lines[j])
        j -= 1
    return " ".join(ln.strip() for ln in para)


def find_block(lang: str, contains: str = "") -> Block:
    """The one ```lang block of the docs whose text has `contains`, in whichever file it is:
    a test that checks a documented config or query reads it so, and survives the docs moving.
    """
    found = [
        b
        for path in markdown_files()
        for b in blocks(path)
        if b.lang == lang and contains in b.text
    ]
    if len(found) != 1:
        where = ", ".join(b.where for b in found) or "none"
        raise LookupError(f"{len(found)} ```{lang} blocks with {contains!r} in the docs ({where})")
    return found[0]


@dataclass(frozen=True)
class Command:
    text: str
    fails: bool = False  # the transcript shows it failing (`gpuenv: error:`)
    exit_line: str = ""  # `exit N`, shown under a command that ends `echo "exit $?"`


def commands(block: Block) -> list[Command]:
    """The shell commands of a console or bash block, continuations joined."""
    out: list[Command] = []
    lines = block.text.rstrip("\n").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if block.lang == "console" and not line.startswith("$ "):
            if line.startswith("gpuenv: error:") and out:
                out[-1] = Command(out[-1].text, True, out[-1].exit_line)
            if _EXIT.match(line) and out and out[-1].text.rstrip().endswith('echo "exit $?"'):
                out[-1] = Command(out[-1].text, out[-1].fails, line.strip())
            i += 1
            continue
        text = line[2:] if block.lang == "console" else line
        if not text.strip() or text.lstrip().startswith("#"):
            i += 1
            continue
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text += "\n" + lines[i]  # bash joins a backslash-newline: one command, as typed
        out.append(Command(text))
        i += 1
    return out


def shown_outputs(block: Block) -> list[str]:
    """What a console block shows under each of its commands (`commands`), one text each
    ("" for none; a bash block shows none)."""
    if block.lang != "console":
        return [""] * len(commands(block))
    out: list[list[str]] = []
    lines = block.text.rstrip("\n").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            text = line[2:]
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = lines[i]
            if line[2:].strip() and not line[2:].lstrip().startswith("#"):
                out.append([])
        elif out:
            out[-1].append(line)
        i += 1
    return ["\n".join(o) + "\n" if o else "" for o in out]


_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"


def _pattern(shown: str) -> re.Pattern[str]:
    """A regular expression for output like `shown`: its words as written (runs of spaces
    any run of spaces: a wider number moves a column), each number any number (compared
    after), a line `...` any lines, `...` within a line any text."""
    parts = []
    for line in shown.rstrip("\n").split("\n"):
        if line.strip() == "...":
            parts.append(r"(?:[^\n]*\n)*?")
            continue
        pieces = []
        for k, chunk in enumerate(line.split("...")):
            if k:
                pieces.append(r"[^\n]*?")
            for j, token in enumerate(re.split(f"({_NUMBER})", chunk)):
                if j % 2:
                    pieces.append(f"({_NUMBER})")
                else:
                    pieces.append(r"[ \t]+".join(re.escape(w) for w in re.split(r"[ \t]+", token)))
        parts.append("".join(pieces) + r"\n")
    return re.compile("".join(parts))


def _normal(text: str) -> str:
    """Lines without trailing spaces or the blank lines around them, ending in a newline."""
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    return "\n".join(lines).strip("\n") + "\n"


def drift(shown: str, printed: str, tolerance: Tolerance) -> str | None:
    """None when `printed` is what `shown` shows (its words, its numbers within `tolerance`,
    `...` for what it elides); else what differs, for a person to read."""
    shown, printed = _normal(shown), _normal(printed)
    if shown == printed:
        return None
    m = _pattern(shown).fullmatch(printed)
    if m is None:
        import difflib

        diff = difflib.unified_diff(
            shown.splitlines(), printed.splitlines(), "shown", "printed", lineterm=""
        )
        return "\n".join(diff)
    numbers = [float(x) for x in re.findall(_NUMBER, re.sub(r"\.\.\.", " ", shown))]
    got = [float(x) for x in m.groups()]
    for want, have in zip(numbers, got, strict=True):
        if not tolerance.allows(want, have):
            return f"shows {want:g} where it printed {have:g}:\n{printed}"
    return None


def _compare_shown(
    block: Block, printed: str | None, shown: str | None = None, what: str = ""
) -> list[Failure]:
    """A marked block's shown output against what its command printed: a Failure per drift."""
    tolerance = block.tolerance()
    if tolerance is None:
        return []
    if printed is None:
        return [Failure(block.where, "shows output, but no command ran before it")]
    found = drift(block.text if shown is None else shown, printed, tolerance)
    if found is None:
        return []
    who = what or "the command before it"
    return [Failure(block.where, f"the output shown is not what {who} prints now:\n{found}")]


_SESSION = """
import doctest, json, sys
pairs = []
class Record(doctest.OutputChecker):
    def check_output(self, want, got, optionflags):
        pairs.append([want, got])
        return True
class Runner(doctest.DocTestRunner):
    def report_unexpected_exception(self, out, test, example, exc_info):
        pairs.append([example.want, "".join(doctest._exception_traceback(exc_info))])
text = open(sys.argv[1], encoding="utf-8").read()
test = doctest.DocTestParser().get_doctest(text, {"__name__": "__main__"}, "block", None, 0)
Runner(checker=Record(), optionflags=0).run(test, out=lambda _: None, clear_globs=False)
json.dump(pairs, open(sys.argv[2], "w"))
"""


def _run_session(block: Block, work: Workdir) -> list[Failure]:
    """A marked pycon block as a reader's interpreter session: each statement's output
    against the lines shown under it."""
    import json

    script = work.path / f".doc-session-{block.line}.py"
    text = work.path / f".doc-session-{block.line}.txt"
    result = work.path / f".doc-session-{block.line}.json"
    script.write_text(_SESSION)
    text.write_text(block.text)
    for path in (script, text):
        work.give(path)
    if work.user is not None:
        result.touch()
        work.give(result)
    root = block.as_root()
    try:
        argv = [*work.argv_python(script.name, root), text.name, result.name]
        rc, out, left = _run(argv, work, COMMAND_TIMEOUT_S, root)
        pairs = json.loads(result.read_text()) if rc == 0 else []
    finally:
        for path in (script, text, result):
            path.unlink(missing_ok=True)
    if rc:
        return [Failure(block.where, f"the python session exited {rc}:\n{_tail(out)}")]
    failures = [Failure(block.where, f"left running: {p}") for p in left]
    for want, got in pairs:
        work.last_output = got
        failures += _compare_shown(block, got, want or "\n", "its statement")
    return failures


def python_source(block: Block) -> str:
    """A python block as it is; a pycon block's `>>> `/`... ` lines."""
    if block.lang != "pycon":
        return block.text
    return "".join(
        ln[4:] + "\n"
        for ln in block.text.split("\n")
        if ln.startswith((">>> ", "... ")) or ln in (">>>", "...")
    )


@dataclass
class Workdir:
    """One markdown file's fresh directory and the environment its blocks run in.

    With `user` (a second account, `run_file(..., user=)`) the blocks run as that account in
    a directory it owns, with its Python (one it may run that imports gpuenv from this
    checkout: tests/daemon_harness.py's `_user_python`) as `python` and `gpuenv`, and the
    page's simulated machine in a directory every account may write, as /tmp is on a host;
    a block marked `<!-- as root: REASON -->` runs as root there, with root's own HOME and
    journal, as `sudo -i` gives a reader.
    """

    path: Path
    env: dict[str, str] = field(default_factory=dict)
    user: pwd.struct_passwd | None = None
    root_env: dict[str, str] = field(default_factory=dict)  # for `as root` blocks
    last_output: str | None = None  # what the last command run printed (stdout and stderr)

    @classmethod
    def create(cls, base: Path, user: pwd.struct_passwd | None = None) -> Workdir:
        work = base / "work"
        for d in (work, base / "home", base / "state", base / "run", base / "cache"):
            d.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUENV_")}
        env.update(_places(base), MPLBACKEND="Agg", COLUMNS="120")
        bindir = str(Path(sys.executable).parent)
        root_env = {
            **env,
            "PATH": bindir + os.pathsep + env.get("PATH", ""),
            "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
        }
        if user is None:
            # the host's simulated machine, one per page (a reader's is /tmp/gpuenv-sim.json)
            root_env["GPUENV_SIM_STATE"] = str(base / "run" / "gpuenv-sim.json")
            return cls(work, root_env)
        base.chmod(0o755)
        sim = base / "sim"  # the host's /tmp for this page: every account writes there
        sim.mkdir(mode=0o1777)
        sim.chmod(0o1777)
        root_env["GPUENV_SIM_STATE"] = str(sim / "gpuenv-sim.json")
        for d in (work, base / "home", base / "state", base / "run", base / "cache"):
            os.chown(d, user.pw_uid, user.pw_gid)
        user_env = {
            **root_env,
            "PATH": str(_user_bin(base / "bin", user)) + os.pathsep + env.get("PATH", ""),
            "PYTHONPATH": _user_pythonpath(),
            "USER": user.pw_name,
            "LOGNAME": user.pw_name,
        }
        root_home = base / "root"
        root_env.update(_places(root_home))
        # one host: gpuenvd's socket directory is root's and everyone's (/run/gpuenv), and
        # root's local locks are posted there for every account to read (clocks/notice.py)
        user_env["GPUENV_SOCKET"] = root_env["GPUENV_SOCKET"]
        for d in (root_home / "home", root_home / "run", root_home / "cache"):
            d.mkdir(parents=True)
        return cls(work, user_env, user, root_env)

    def argv_python(self, script: str, as_root: bool = False) -> list[str]:
        """The command that runs a python block's script, as the block's account."""
        if self.user is None or as_root:
            return [sys.executable, script]
        return ["python", script]

    def as_account(self, as_root: bool = False) -> tuple[dict[str, str], dict[str, object]]:
        """The environment and the subprocess arguments a block runs with."""
        if self.user is None and as_root and os.geteuid() != 0:
            # the suite run by an ordinary account: root on the page's own simulated machine
            # (GPUENV_SIM_STATE in a directory this account owns), as CI's root is on it
            return {**self.env, "GPUENV_SIM_ROOT": "1"}, {}
        if self.user is None or as_root:
            return (self.root_env if self.user else self.env), {}
        who = {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}
        return self.env, who

    def journals(self) -> list[Path]:
        """Where locks are journaled: the page's account's, and root's in a second-account run."""
        found = [self.env["GPUENV_STATE_DIR"]]
        if self.user is not None:
            found.append(self.root_env["GPUENV_STATE_DIR"])
        return [Path(p) for p in found]

    def give(self, path: Path) -> None:
        """A file the harness wrote for the page's blocks (a `file:` block, a script) belongs
        to the page's account, as it would had the reader saved it."""
        if self.user is not None:
            os.chown(path, self.user.pw_uid, self.user.pw_gid)


def _places(base: Path) -> dict[str, str]:
    """Where one account's state lives, under `base`: gpuenv's journal, HOME, XDG dirs, and
    a socket path with no gpuenvd behind it."""
    return {
        "GPUENV_STATE_DIR": str(base / "state" / "journal"),
        "GPUENV_SOCKET": str(base / "run" / "no-daemon.sock"),
        "HOME": str(base / "home"),
        "XDG_RUNTIME_DIR": str(base / "run"),
        "XDG_STATE_HOME": str(base / "state"),
        "XDG_CACHE_HOME": str(base / "cache"),
    }


def _user_pythonpath() -> str:
    """gpuenv from this checkout and its dependencies from this environment, for an account
    that cannot run this environment's Python (as tests/daemon_harness.py runs one)."""
    from daemon_harness import _user_env

    return str(_user_env(os.environ)["PYTHONPATH"])


def _user_bin(bindir: Path, user: pwd.struct_passwd) -> Path:
    """`python`, `python3`, `gpuenv` and this environment's other commands (pytest) for
    `user`: run by its Python with gpuenv importable, as a reader's activated virtual
    environment gives them."""
    from daemon_harness import _user_python

    python = _user_python(user)
    if python is None:
        raise RuntimeError(f"no Python that {user.pw_name} may run imports gpuenv here")
    bindir.mkdir()
    ours = Path(sys.executable).parent
    run = {"python": "", "python3": "", "gpuenv": " -m gpuenv"}
    for script in sorted(ours.iterdir()):
        try:
            first = script.read_bytes()[:200].split(b"\n", 1)[0]
        except OSError:
            continue
        if script.name not in run and first.startswith(b"#!") and b"python" in first:
            run[script.name] = " " + shlex.quote(str(script))
    for name, tail in run.items():
        (bindir / name).write_text(f'#!/bin/sh\nexec {shlex.quote(python)}{tail} "$@"\n')
        (bindir / name).chmod(0o755)
    return bindir


@dataclass(frozen=True)
class Failure:
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


def _run(
    argv: list[str], work: Workdir, timeout: float, as_root: bool = False
) -> tuple[int, str, list[str]]:
    """(exit code, stdout+stderr, what it left running) of one command."""
    env, who = work.as_account(as_root)
    proc = subprocess.Popen(  # type: ignore[call-overload]
        argv,
        cwd=work.path,
        env=env,
        **who,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return -1, out.decode(errors="replace") + f"\n(killed after {timeout:.0f} s)", []
    left = _leftovers(proc.pid)
    return proc.returncode, out.decode(errors="replace"), left


def _tail(out: str) -> str:
    return out[-2000:]


def _leftovers(pgid: int) -> list[str]:
    """Processes of the command's group still alive (a daemon it started and did not stop)."""
    left = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            left.append(cmdline.strip())
    if left:
        os.killpg(pgid, signal.SIGKILL)
    return left


def run_block(block: Block, work: Workdir) -> list[Failure]:
    """Run one block in `work`; what went wrong, each with its file:line."""
    try:
        kind = block.kind()
    except ConventionError as err:
        return [Failure(block.where, str(err).split(": ", 1)[1])]
    if kind == "output":
        return _compare_shown(block, work.last_output)
    if kind == "not run" or block.missing():
        return []
    if kind == "file":
        target = work.path / block.reason()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(block.text)
        work.give(target)
        return []
    if kind == "pycon" and block.tolerance() is not None:
        return _run_session(block, work)
    if kind in ("python", "pycon"):
        script = work.path / f".doc-block-{block.line}.py"
        script.write_text(python_source(block))
        work.give(script)
        root = block.as_root()
        try:
            argv = work.argv_python(script.name, root)
            rc, out, left = _run(argv, work, COMMAND_TIMEOUT_S, root)
        finally:
            script.unlink()
        work.last_output = out
        bad = [Failure(block.where, f"the python block exited {rc}:\n{_tail(out)}")] if rc else []
        return bad + [Failure(block.where, f"left running: {p}") for p in left]
    failures = []
    tolerance = block.tolerance()
    for cmd, shown in zip(commands(block), shown_outputs(block), strict=True):
        rc, out, left = _run(["bash", "-c", cmd.text], work, COMMAND_TIMEOUT_S, block.as_root())
        work.last_output = out
        if tolerance is not None and shown.strip():
            failures += _compare_shown(block, out, shown, f"`{cmd.text}`")
        out = _tail(out)
        if "Traceback (most recent call last)" in out:
            failures.append(Failure(block.where, f"`{cmd.text}` printed a traceback:\n{out}"))
        elif cmd.exit_line and cmd.exit_line not in out.split("\n"):
            failures.append(
                Failure(
                    block.where, f"`{cmd.text}` should print `{cmd.exit_line}` as shown:\n{out}"
                )
            )
        elif cmd.fails and rc == 0:
            failures.append(
                Failure(block.where, f"`{cmd.text}` should fail as shown, but exited 0:\n{out}")
            )
        elif not cmd.fails and rc != 0:
            failures.append(Failure(block.where, f"`{cmd.text}` exited {rc}:\n{out}"))
        failures += [Failure(block.where, f"`{cmd.text}` left running: {p}") for p in left]
        if rc == 0:
            work.env.update(exported(cmd.text))
            if work.user is not None:  # the page's reader exports in each shell they use
                work.root_env.update(exported(cmd.text))
    return failures


def exported(command: str) -> dict[str, str]:
    """What `export NAME=VALUE ...` sets for the page's later blocks, as in a reader's shell;
    {} for any other command (each runs in a shell of its own: only an export carries)."""
    try:
        words = shlex.split(command, comments=True)
    except ValueError:
        return {}
    if len(words) < 2 or words[0] != "export":
        return {}
    pairs = [w.split("=", 1) for w in words[1:]]
    if not all(len(p) == 2 and re.fullmatch(r"[A-Za-z_]\w*", p[0]) for p in pairs):
        return {}
    return {name: os.path.expandvars(value) for name, value in pairs}


def left_locks(work: Workdir) -> list[str]:
    """The GPUs whose lock the file's examples left in the journal."""
    return sorted(p.stem for j in work.journals() if j.is_dir() for p in j.glob("*.json"))


@dataclass
class FileResult:
    path: str
    blocks: list[Block]
    failures: list[Failure]
    seconds: float
    block_seconds: dict[int, float] = field(default_factory=dict)  # by the block's line

    @property
    def skipped(self) -> list[str]:
        """The blocks not run for a module that does not import here, with the module."""
        return [f"{b.where} (needs {', '.join(b.missing())})" for b in self.blocks if b.missing()]


def run_file(path: Path, root: Path = ROOT, user: pwd.struct_passwd | None = None) -> FileResult:
    """Every block of one markdown file, in order, in a fresh directory removed afterwards;
    as `user` (a second account, see Workdir) when given, else as this process's account."""
    found = blocks(path, root)
    base = Path(tempfile.mkdtemp(prefix="gpuenv-docs-"))
    start = time.monotonic()
    failures: list[Failure] = []
    took: dict[int, float] = {}
    try:
        work = Workdir.create(base, user)
        for block in found:
            t0 = time.monotonic()
            failures += run_block(block, work)
            took[block.line] = time.monotonic() - t0
        rel = str(path.relative_to(root))
        failures += [
            Failure(rel, f"the examples left a lock on {uuid} (a journal entry)")
            for uuid in left_locks(work)
        ]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return FileResult(str(path.relative_to(root)), found, failures, time.monotonic() - start, took)


def tally(found: list[Block]) -> Counter[str]:
    """Blocks by kind: 'run' for those that run, 'not run: REASON' for marked ones."""
    out: Counter[str] = Counter()
    for b in found:
        kind = b.kind()
        out["not run: " + b.reason() if kind == "not run" else "run" if kind in RUNS else kind] += 1
    return out


def main() -> int:
    """Run every file; print the figures docs/benchmarks/history.md keeps."""
    total: Counter[str] = Counter()
    failed = 0
    start = time.monotonic()
    for path in markdown_files():
        res = run_file(path)
        counts = tally(res.blocks)
        total += counts
        failed += len(res.failures)
        print(
            f"{res.path}: {len(res.blocks)} blocks, {dict(counts)}, "
            f"{len(res.failures)} failures, {res.seconds:.1f} s"
        )
        slow = [f"{line} ({s:.1f} s)" for line, s in res.block_seconds.items() if s >= 1.0]
        if slow:
            print(f"  blocks over 1 s: {', '.join(slow)}")
        for f in res.failures:
            print("  " + str(f).replace("\n", "\n    "))
    print(
        f"total: {sum(total.values())} blocks, {dict(total)}, {failed} failures, "
        f"{time.monotonic() - start:.1f} s"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
