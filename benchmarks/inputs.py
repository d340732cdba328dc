#!/usr/bin/env python3
"""Bad inputs at every entry point, judged there (goal: 0 tracebacks, internal errors, silent).

Cases tried per class, tracebacks, internal errors and silently accepted bad values.

Classes: the Python API's parameters (bench/BenchConfig, stable, lock, measure/repeat,
the do_bench drop-in), the records of each file format gpuenv reads (results JSONL,
journal, calibration, sim state, daemon config) and special files (FIFO, devices,
directory, binary, deep nesting), the CLI's numeric and name options, and sockets that
are not gpuenvd. Each case has an oracle that does not ask gpuenv.validate:

- a Python value is *bad* by its kind (NaN, inf, wrong type, out of range for what the
  parameter means); a bad one must raise ConfigError naming the parameter (any other
  exception is an *internal error*), a good one must be taken;
- a file is *accepted* when it loads; it then must work downstream (the summary, and a
  compare of it with itself), else it was a *silently accepted bad value*;
- a CLI case must exit with a documented code and no traceback; a bad value must exit 2.

Read-only: the simulated GPU only, in memory or in a temporary directory.

    python -m benchmarks.inputs [--json counts.json] [--source DIR] [--skip CLASS]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import json
import math
import os
import socket
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# --source DIR: count another tree's gpuenv (e.g. `git archive eeaf56e gpuenv`: before)
SOURCE = sys.argv[sys.argv.index("--source") + 1] if "--source" in sys.argv else str(ROOT)
sys.path.insert(0, SOURCE)

from benchmarks import runner  # noqa: E402
from gpuenv.errors import EXIT_CODES, ConfigError, DeviceNotFound  # noqa: E402

NAN, INF = math.nan, math.inf
# (value, what it is) a confused caller passes
VALUES: list[Any] = [
    NAN,
    INF,
    -INF,
    1e309,
    10**400,
    -1,
    0,
    0.5,
    1,
    1.5,
    3,
    50,
    10**9,
    "abc",
    "1",
    "",
    None,
    True,
    [1],
    {"a": 1},
    "auto",
]


def _real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite(v: Any) -> bool:
    try:
        return _real(v) and math.isfinite(v)
    except OverflowError:
        return False


# kind -> is value good for it (the oracle: what the parameter means, not what validate says)
KINDS: dict[str, Callable[[Any], bool]] = {
    "seconds>0": lambda v: _finite(v) and v > 0,
    "seconds>=0": lambda v: _finite(v) and v >= 0,
    "fraction": lambda v: _finite(v) and 0 < v < 1,
    "count>=1": lambda v: _finite(v) and float(v).is_integer() and v >= 1,
    "count>=0": lambda v: _finite(v) and float(v).is_integer() and v >= 0,
    "auto|count>=0": lambda v: v == "auto" or (_finite(v) and float(v).is_integer() and v >= 0),
    "auto|count>=1": lambda v: v == "auto" or (_finite(v) and float(v).is_integer() and v >= 1),
    "bool": lambda v: isinstance(v, bool),
    "period": lambda v: _finite(v) and 0 < v <= 10,
    "watts": lambda v: _finite(v) and v > 0,
    "name": lambda v: isinstance(v, str) and bool(v.strip()),
}
BENCH = {
    "budget_s": "seconds>0",
    "rel_ci": "fraction",
    "confidence": "fraction",
    "reps": "count>=1",
    "min_reps": "count>=1",
    "max_reps": "count>=1",
    "warmup": "auto|count>=0",
    "warmup_max_s": "seconds>=0",
    "warmup_max_reps": "count>=0",
    "calls_per_rep": "auto|count>=1",
    "flush_l2": "bool",
    "saturate": "bool",
    "probe_clock": "bool",
    "keep_trace": "bool",
}


class Tally:
    def __init__(self) -> None:
        self.rows: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self.problems: list[str] = []

    def add(self, cls: str, outcome: str, case: str) -> None:
        self.rows[cls]["tried"] += 1
        self.rows[cls][outcome] += 1
        if outcome in (
            "traceback",
            "internal error",
            "silently accepted",
            "wrong exit code",
            "hang",
        ):
            self.problems.append(f"- {cls}: `{case}`: {outcome}")


def python_case(
    t: Tally, cls: str, case: str, call: Callable[..., Any], good: bool, name: str
) -> None:
    try:
        with warnings.catch_warnings(), _alarm(10):
            warnings.simplefilter("ignore")
            call()
    except TimeoutError:
        t.add(cls, "hang", case)  # before: repeat(reps=10**400) ran for ever
        return
    except ConfigError as err:
        t.add(
            cls, "refused" if name in str(err).split(":")[0] or not good else "internal error", case
        )
        return
    except Exception as err:
        t.add(cls, "internal error", f"{case}: {type(err).__name__}: {err}")
        return
    t.add(cls, "accepted" if good else "silently accepted", case)


def python_api(t: Tally) -> None:
    import gpuenv
    from gpuenv.backend.sim import SimBackend
    from gpuenv.clocks.request import make_request
    from gpuenv.integrations.triton.bench import _check
    from gpuenv.session import Session
    from gpuenv.timebase import VirtualClock
    from gpuenv.timing import BenchConfig

    for field, kind in BENCH.items():
        for v in VALUES:
            good = KINDS[kind](v) or (v is None and field in ("budget_s", "reps"))  # defaults
            python_case(
                t,
                "Python: bench settings",
                f"{field}={v!r:.20}",
                lambda f=field, v=v: BenchConfig(**{f: v}),
                good,
                field,
            )
    python_case(
        t,
        "Python: bench settings",
        "min_reps=50, max_reps=10",
        lambda: BenchConfig(min_reps=50, max_reps=10),
        False,
        "min_reps",
    )
    sim = SimBackend(clock=VirtualClock())
    fns = {
        "None": None,
        "123": 123,
        "'f'": "f",
        "lambda x: x": lambda x: x,
        "lambda: None": lambda: None,
        "time.time": time.time,
    }
    import inspect

    from gpuenv.integrations.triton.bench import do_bench

    takes_fn = "fn" in inspect.signature(_check).parameters  # before: do_bench checked no fn

    old_check: Callable[..., Any] = _check  # a tree before issue 23 took no fn

    def check(q: Any, fn: Any) -> Any:
        return (
            _check("mean", q, fn)
            if takes_fn
            else (old_check("mean", q), do_bench(fn, warmup=1, rep=1, backend=sim))
        )

    for label, fn in fns.items():
        good = label in ("lambda: None", "time.time")
        python_case(
            t,
            "Python: bench/do_bench fn",
            f"bench({label}, reps=1)",
            lambda fn=fn: gpuenv.bench(fn, reps=1, backend=sim),
            good,
            "fn",
        )
        python_case(
            t,
            "Python: bench/do_bench fn",
            f"do_bench({label}) args",
            lambda fn=fn: check(None, fn),
            good,
            "fn",
        )
    for v in ("abc", 1, 2, -0.1, [0.5, 2], [0.2, 0.5], 0.5, [NAN], None, [INF]):
        good = v is None or v in (0.5, 1) or v == [0.2, 0.5]
        python_case(
            t,
            "Python: bench/do_bench fn",
            f"do_bench(quantiles={v!r})",
            lambda v=v: old_check("mean", v) if not takes_fn else check(v, lambda: None),
            good,
            "quantiles",
        )
    for v in ("abc", 5, None):
        python_case(
            t,
            "Python: bench/do_bench fn",
            f"bench(config={v!r})",
            lambda v=v: BenchConfig.of(v, {}),
            v is None,
            "config",
        )
    for v in VALUES:
        python_case(
            t,
            "Python: stable()",
            f"period={v!r:.20}",
            lambda v=v: Session(period=v),
            v is None or KINDS["period"](v),
            "period",
        )
        python_case(
            t, "Python: stable()", f"load={v!r:.20}", lambda v=v: Session(load=v), v is None, "load"
        )
        python_case(
            t,
            "Python: stable()",
            f"config={v!r:.20}",
            lambda v=v: Session(config=v),
            v is None,
            "config",
        )
        python_case(
            t,
            "Python: lock()",
            f"power_limit_w={v!r:.20}",
            lambda v=v: make_request(power_limit_w=v),
            KINDS["watts"](v),
            "power_limit_w",
        )
        good_sm = (
            isinstance(v, int) and not isinstance(v, bool) and _finite(v) and v >= 1
        ) or v == "1"
        python_case(
            t, "Python: lock()", f"sm={v!r:.20}", lambda v=v: make_request(v), good_sm, "sm"
        )
    with tempfile.TemporaryDirectory() as tmp:
        python_case(
            t,
            "Python: stable()",
            "output into a missing directory",
            lambda: Session(output=Path(tmp) / "no" / "r.jsonl"),
            False,
            "output",
        )
        assert not (Path(tmp) / "no").exists(), "a directory was created"
    with gpuenv.stable(backend=sim) as env:
        for v in VALUES:
            python_case(
                t,
                "Python: measure/repeat",
                f"measure({v!r:.20})",
                lambda v=v: env.measure(v),
                KINDS["name"](v),
                "name",
            )
            if KINDS["count>=1"](v) and v > 100:
                continue  # a good count, and 10**9 calls: not what is counted
            python_case(
                t,
                "Python: measure/repeat",
                f"repeat(fn, reps={v!r:.20})",
                lambda v=v: env.repeat(lambda: None, reps=v),
                KINDS["count>=1"](v),
                "reps",
            )
    sim.close()


# -- files ------------------------------------------------------------------------------------

FILE_VALUES = [NAN, INF, -INF, None, "x", "", [], {}, True, -1, 10**400, [None], {"a": None}]


def json_paths(doc: Any, width: int = 2, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON document (the first `width` items of each list), for putting
    an odd value at each (this benchmark and tests/test_fuzz_inputs.py)."""
    out = [prefix] if prefix else []
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += json_paths(v, width, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc[:width]):
            out += json_paths(v, width, (*prefix, i))
    return out


def json_set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    """A copy of `doc` with `value` at `path`."""
    doc = json.loads(json.dumps(doc))
    target = doc
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return doc


def file_case(
    t: Tally, cls: str, case: str, load: Callable[..., Any], use: Callable[[Any], Any]
) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loaded = load()
    except ConfigError:
        t.add(cls, "refused", case)
        return
    except Exception as err:
        t.add(cls, "internal error", f"{case}: {type(err).__name__}: {err}")
        return
    try:
        use(loaded)
    except Exception as err:
        t.add(cls, "silently accepted", f"{case}: {type(err).__name__}: {err}")
        return
    t.add(cls, "accepted", case)


def files(t: Tally, tmp: Path) -> None:
    import gpuenv
    from gpuenv.backend.sim import SimBackend
    from gpuenv.clocks.calibration_store import load_calibration
    from gpuenv.clocks.journal import JournalDamaged, decode
    from gpuenv.clocks.records import Applied, ClockState, JournalEntry
    from gpuenv.compare import compare_files
    from gpuenv.results import load_runs
    from gpuenv.timebase import VirtualClock

    good = tmp / "good.jsonl"
    sim = SimBackend(clock=VirtualClock())
    with gpuenv.stable(backend=sim, output=good) as env:
        sim.open_context(0)
        env.repeat(lambda: sim.run_work(0, 1e8), reps=3)
    sim.close()
    header, line = good.read_text().splitlines()[:2]
    record = json.loads(line)

    def use_results(runs: Any) -> None:
        for m in runs[-1].measurements:
            m.summary()
            assert all(math.isfinite(x) for x in m.times_s), "non-finite time"
        compare_files([str(bad)], [str(bad)])

    bad = tmp / "bad.jsonl"
    for where in json_paths(record):
        for v in FILE_VALUES:
            bad.write_text(header + "\n" + json.dumps(json_set(record, where, v)) + "\n")
            file_case(
                t,
                "files: results records",
                f"{'.'.join(map(str, where))}={v!r:.12}",
                lambda: load_runs(bad),
                use_results,
            )
    specials = {"/dev/zero": "/dev/zero", "/dev/urandom": "/dev/urandom", "a directory": str(tmp)}
    fifo = tmp / "fifo"
    os.mkfifo(fifo)
    specials["a FIFO"] = str(fifo)
    (tmp / "deep.jsonl").write_text("[" * 200_000)
    specials["200,000 nested ["] = str(tmp / "deep.jsonl")
    (tmp / "bin.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    specials["binary"] = str(tmp / "bin.jsonl")
    if str(ROOT) != SOURCE:
        specials = {k: v for k, v in specials.items() if not k.startswith("/dev/")}
    for label, path in specials.items():
        with _alarm(15):
            file_case(t, "files: special files", label, lambda p=path: load_runs(p), use_results)

    state = ClockState("GPU-1", None, None, True, 1980, 2619, 700.0, True)
    body = {
        **JournalEntry(
            "GPU-1", 0, "GPU 0", "sim", state, Applied(locked_sm=(1350, 1350))
        ).to_dict(),
        "version": 1,
    }
    for where in json_paths(body):
        for v in FILE_VALUES:
            doc = json.dumps(json_set(body, where, v)).encode()

            def load_journal(doc: bytes = doc) -> Any:
                try:
                    return decode(tmp / "GPU-1.json", doc, "GPU-1")
                except JournalDamaged as err:  # the journal's own refusal (a ConfigError)
                    raise ConfigError(str(err)) from err

            def use_journal(e: Any) -> None:
                assert math.isfinite(e.original.power_limit_w)
                assert e.applied.locked_sm is None or e.applied.locked_sm[0] <= 10**6

            file_case(
                t,
                "files: journal records",
                f"{'.'.join(map(str, where))}={v!r:.12}",
                load_journal,
                use_journal,
            )
    (tmp / "calibration").mkdir()
    cal = {"uuid": "GPU-1", "sustained_mhz": 1500, "measured_at": 1.0, "power_limit_w": 700.0}
    for key in cal:
        for v in FILE_VALUES:
            (tmp / "calibration" / "GPU-1.json").write_text(json.dumps({**cal, key: v}))
            file_case(
                t,
                "files: calibration",
                f"{key}={v!r:.12}",
                lambda: load_calibration("GPU-1", state_dir=tmp),
                lambda c: (int(c.sustained_mhz), f"{c.measured_at:.0f}"),
            )
    state_path = tmp / "sim.json"
    s = SimBackend(state_file=str(state_path))
    s.set_locked_sm_clocks(0, 1350, 1350)
    s.close()
    doc = json.loads(state_path.read_text())
    for where in json_paths(doc):
        for v in FILE_VALUES:
            state_path.write_text(json.dumps(json_set(doc, where, v)))

            def use_sim(b: Any) -> None:
                try:
                    b.read_fast(0)
                    b.power_limits(0)
                finally:
                    b.close()

            file_case(
                t,
                "files: sim state",
                f"{'.'.join(map(str, where))}={v!r:.12}",
                lambda: SimBackend(state_file=str(state_path)),
                use_sim,
            )
    from gpuenv.daemon.auth import parse_config

    for key in (
        "socket_group",
        "max_connections_per_user",
        "idle_timeout",
        "sample_period",
        "metrics",
        "socket",
        "mode",
    ):
        for v in ("nan", "inf", "-1", "0", "1e309", "", "abc", "9" * 30):
            file_case(
                t,
                "files: daemon config",
                f"{key} = {v}",
                lambda k=key, v=v: parse_config(f"[daemon]\n{k} = {v}\n"),
                _assert_fields_finite,
            )


def _assert_fields_finite(config: Any) -> None:
    for name in vars(config):
        _assert_finite(getattr(config, name))


def _assert_finite(x: Any) -> None:
    if isinstance(x, float):
        assert math.isfinite(x), x


@contextlib.contextmanager
def _alarm(seconds: int) -> Iterator[None]:
    import signal

    def hung(*_: object) -> None:
        raise TimeoutError("hang")

    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# -- the CLI ----------------------------------------------------------------------------------

CLI_VALUES = ["nan", "-nan", "inf", "-inf", "1e309", "-1", "0", "abc", "", "9" * 40]


def cli(t: Tally, tmp: Path) -> None:
    from click.testing import CliRunner

    from gpuenv.cli import cli as main

    good = tmp / "good.jsonl"
    for_good = {
        "--alpha": lambda v: 0 < float(v) < 1,
        "--fail-above": lambda v: float(v) >= 0,
        "--min-change": lambda v: float(v) >= 0,
    }
    cases: list[tuple[list[str], bool, tuple[int, ...]]] = []
    for flag, ok in for_good.items():
        for v in CLI_VALUES:
            cases.append((["compare", flag, v, str(good), str(good)], _ok(ok, v), (2,)))

    def num(
        lo: float, hi: float = math.inf, lo_open: bool = True, whole: bool = False
    ) -> Callable[[str], bool]:
        def ok(v: str) -> bool:
            try:
                x = float(v)
            except ValueError:
                return False
            inside = (x > lo if lo_open else x >= lo) and x <= hi
            return math.isfinite(x) and inside and (not whole or x.is_integer())

        return ok

    # prefix -> (good value?, whether a good value may be run: it ends soon, changes nothing)
    flags: list[tuple[list[str], Callable[[str], bool], bool]] = [
        (["status", "-l"], num(0, 86400), False),
        (["status", "-lms"], num(1, 86400000, lo_open=False, whole=True), False),
        (["monitor", "--json", "-n", "1", "-d"], num(0, 86400), False),
        (["monitor", "--json", "-n", "1", "--duration"], num(0), True),
        (["run", "--interval"], num(0, 10), True),
        (["calibrate", "--no-save", "--duration"], num(1, 86400, lo_open=False), False),
        (["demo", "--fast", "--load-seconds"], num(1, 300, lo_open=False), False),
        (["--dry-run", "lock", "--sm", "1350", "--power-limit"], num(0), False),
        (
            ["--dry-run", "lock", "--sm", "1350", "--sm-max"],
            num(1, lo_open=False, whole=True),
            False,
        ),
        (["--dry-run", "lock", "--sm"], num(1, lo_open=False, whole=True), False),
        (["run", "-o"], lambda v: bool(v.strip()), True),
        (["plot", str(good), "-o"], lambda v: v.endswith(".png"), True),
        (["demo", "--fast", "-i"], lambda v: v in ("0", "all"), False),
        (["daemon", "--socket"], lambda v: bool(v.strip()), False),
    ]
    for prefix, is_good, runnable in flags:
        for v in [*CLI_VALUES, "9", "x.png"]:
            good_value = is_good(v)
            if good_value and not runnable:
                continue  # a good value that would loop, wait or lock: not what is counted
            args = [*prefix, v, "--", "true"] if prefix[0] == "run" else [*prefix, v]
            # a GPU selector that matches no GPU is nvidia-smi's "not found" (6) or usage (2)
            refusal: tuple[int, ...] = (2, DeviceNotFound.exit_code) if prefix[-1] == "-i" else (2,)
            cases.append((args, good_value, refusal))
    os.chdir(tmp)
    for args, good_value, refusal in cases:
        with _alarm(30):
            try:
                result = CliRunner().invoke(main, ["--sim", *args])
            except TimeoutError:
                t.add("CLI options", "hang", " ".join(args))
                continue
        case = " ".join(a if len(a) < 30 else "..." for a in args)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            t.add("CLI options", "traceback", f"{case}: {result.exception!r}")
        elif result.exit_code not in EXIT_CODES:
            t.add("CLI options", "wrong exit code", f"{case}: {result.exit_code}")
        elif not good_value and result.exit_code == 0:
            t.add("CLI options", "silently accepted", case)
        elif not good_value and result.exit_code not in refusal:
            t.add("CLI options", "wrong exit code", f"{case}: {result.exit_code}")
        else:
            t.add("CLI options", "refused" if result.exit_code in refusal else "accepted", case)


def _ok(rule: Callable[[str], bool], v: str) -> bool:
    try:
        return math.isfinite(float(v)) and rule(v)
    except ValueError:
        return False


def sockets(t: Tally, tmp: Path) -> None:
    from gpuenv.daemon.client import Client, DaemonUnavailable

    for mode in ("junk", "silent", "closes"):
        path = tmp / f"{mode}.sock"
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        server.listen(4)
        conns: list[socket.socket] = []

        def serve(
            server: socket.socket = server, mode: str = mode, conns: list[socket.socket] = conns
        ) -> None:
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                conns.append(conn)
                conn.recv(4096)
                if mode == "junk":
                    conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
                elif mode == "closes":
                    conn.close()

        threading.Thread(target=serve, daemon=True).start()
        started = time.monotonic()
        try:
            Client(str(path))
            t.add("sockets", "silently accepted", mode)
        except DaemonUnavailable as err:
            waited = time.monotonic() - started
            said = (
                "not gpuenvd" in str(err)
                or "did not answer in 3 s" in str(err)
                or "closed the connection" in str(err)
                or "lost the connection" in str(err)
            )
            t.add("sockets", "refused" if said and waited < 10 else "hang", f"{mode}: {err}")
        except Exception as err:
            t.add("sockets", "internal error", f"{mode}: {type(err).__name__}: {err}")
        for c in conns:
            c.close()
        server.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", metavar="PATH", help="also write the counts as JSON")
    parser.add_argument(
        "--source",
        metavar="DIR",
        help="the gpuenv tree to count (default: "
        "this one); /dev/zero and /dev/urandom are skipped there, as an old "
        "reader fills memory with them",
    )
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=("api", "files", "cli", "sockets"),
        help="leave a class out (the old CLI's `run` with a bad "
        "value runs its command in this process)",
    )


def run(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="gpuenv-inputs-") as tmp_s:
        tmp = Path(tmp_s)
        os.environ.update(
            GPUENV_STATE_DIR=str(tmp / "state"),
            GPUENV_SIM_STATE=str(tmp / "s.json"),
            GPUENV_SOCKET=str(tmp / "no.sock"),
            GPUENV_BACKEND="sim",
        )
        with contextlib.redirect_stderr(io.StringIO()):
            parts: dict[str, Callable[[], None]] = {
                "api": lambda: python_api(tally),
                "files": lambda: files(tally, tmp),
                "cli": lambda: cli(tally, tmp),
                "sockets": lambda: sockets(tally, tmp),
            }
            for name, part in parts.items():
                if name not in args.skip:
                    part()
        os.chdir(ROOT)
    wall = time.monotonic() - t0
    cols = (
        "tried",
        "refused",
        "accepted",
        "traceback",
        "internal error",
        "silently accepted",
        "wrong exit code",
        "hang",
    )
    print("| class | " + " | ".join(cols) + " |")
    print("| --- | " + " | ".join("---:" for _ in cols) + " |")
    total: collections.Counter[str] = collections.Counter()
    for cls, row in tally.rows.items():
        total.update(row)
        print(f"| {cls} | " + " | ".join(str(row[c]) for c in cols) + " |")
    print("| **all** | " + " | ".join(f"**{total[c]}**" for c in cols) + " |")
    print(f"\n{wall:.0f} s wall")
    for c in ("traceback", "internal error", "silently accepted"):
        runner.metric(c.replace(" ", "_"), total[c], "cases")
    for line in tally.problems:
        print(line)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": tally.rows, "problems": tally.problems, "wall_s": wall}, indent=1)
        )
    return 1 if tally.problems else 0


if __name__ == "__main__":
    sys.exit(runner.main("inputs", __doc__, add_arguments, run, sim_only=True))
