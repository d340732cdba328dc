"""torch.compile max-autotune that chooses right: one GEMM's max-autotune selection
timed by plain Inductor and by Inductor under gpuenv's switch (`patch_inductor(rank=True)`)
in fresh processes with fresh Inductor caches: which choice won, its regret against each
choice's careful time, and the compile wall.

The workload (benchmarks/workloads/inductor_mm.py) compiles one GEMM with
`torch.compile(mode="max-autotune")` on a shape given by `--op`, `--size` and `--dtype`
(default: relu(a @ b + bias), M=2048 N=2048 K=8192 fp16: the bias and relu Inductor's
epilogue, a shape where cuBLAS should not win by the 15% it did at 4096^3). Each process
gets a fresh TORCHINDUCTOR_CACHE_DIR, so every selection autotunes; all share one
TRITON_CACHE_DIR, so compiled Triton kernels are reused and the wall is Inductor's. First
one process times each choice carefully (gpuenv's do_bench, 100 ms of reps from a cool,
uncapped GPU, in 5 interleaved passes: the true ranking, each choice's median pass with
the passes' spread shown; it also fills the Triton cache), then `--processes`
processes of each tuner in each of `--states`, interleaved: rested (the GPU idle while
Inductor compiles) and hot (each selection benchmarked right after `--hot-s` of bf16
8192^3 matmuls: the load runs inside Inductor's benchmark function, after compiling).
Per tuner and state: the distinct winners and the most common one's share, the distinct
decisions (the winner alone, or the tie declared; goal: one in 95%), regret = the
winner's careful time against the best careful time, the compile wall (the first call:
compile, autotune, one run) and the compiled function's own time (gpuenv.bench: the
choice and Inductor's epilogue-fusion decision after it). Read-only: no clock is set,
every child runs with GPUENV_READONLY=1. About 5 minutes on an H200 at the defaults (the
careful process about a minute, compiling every Triton template; each tuning process
20-35 s, a hot one 7 s more). One state in 10 processes a tuner is 20 processes: 7-12
minutes, more than one device call's 10 (it did not finish in 500 s): run fewer a call,
each keeping its rows (`--rows-out`), and join them in the last call's report
(`--rows-in`, repeatable; regret against the first call's careful times; `--processes 0`
reports them alone). `--processes 0` with no `--rows-in` runs the careful process alone:
how far apart a shape's choices are, to find one whose best are close (a minute or two a
shape); `--scan` lines up such calls' careful rows, of any shapes, by how close each best
choice's runner-up is, and runs nothing. Inductor's own
`TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS=TRITON` (passed to every process, kept in each
row) leaves cuBLAS out: a race among the Triton templates alone; its results file is
named for the backends (`...-float16-triton-joined.json`). A call joining an
earlier one's careful row with the `--triton-cache` the earlier one filled runs no
careful process: on the device machine,
a folder outside the checkout (/tmp) is kept between calls while the machine is warm, an
ignored one inside it was not. Each process's time is printed on stderr as it ends.
`--tuners plain,gpuenv,gpuenv-nowait` adds gpuenv's ranking with `condition="none"`: no
wait for a ready GPU, its candidates interleaved in the state they find (hot: capped), a
tuner of its own in the tables (issue 43's hot wall; benchmarks/rank_hot.py simulates it).

    GPUENV_READONLY=1 python -m benchmarks.inductor_rank
    GPUENV_READONLY=1 python -m benchmarks.inductor_rank --op mm_relu --size 1024x1024x1024 \\
        --states hot --processes 5
    GPUENV_READONLY=1 python -m benchmarks.inductor_rank --op mm_relu --size 1024x1024x1024 \\
        --states rested --processes 5 --rows-out $OUT/rows-1.jsonl     # then, a call later:
    ... --processes 5 --rows-in rows-1.jsonl --rows-out $OUT/rows-2.jsonl
    ... --triton-cache /tmp/gpuenv-triton   # in both: the later runs no careful process
    GPUENV_READONLY=1 python -m benchmarks.inductor_rank --processes 0 --size 2048x2048x2048 \\
        --rows-out $OUT/scan.jsonl     # a shape a step; then, anywhere:
    python -m benchmarks.inductor_rank --scan scan.jsonl
    GPUENV_READONLY=1 python -m benchmarks.inductor_rank --op mm_relu --size 1024x1024x1024 \
        --states hot --processes 3 --tuners plain,gpuenv,gpuenv-nowait
    GPUENV_READONLY=1 python -m benchmarks.inductor_rank --op mm_relu --size 4096x4096x4096
    GPUENV_READONLY=1 python -m benchmarks.inductor_rank --op bmm --size 8x2048x2048x2048 \\
        --dtype bfloat16
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks import runner
from benchmarks.autotune_rank import WAIT, choice_cells, choice_metrics, choices, or_dash
from benchmarks.checkout import ROOT, checkout_env

CHILD = ROOT / "benchmarks" / "workloads" / "inductor_mm.py"
DEFAULT_BACKENDS = "ATEN,TRITON,CPP"  # Inductor's max_autotune_gemm_backends (torch 2.11-2.13)
TUNERS = ("plain", "gpuenv", "gpuenv-nowait")  # the last: ranked with condition="none"
RANKERS = TUNERS[1:]  # patch_inductor(rank=True)
STATES = ("rested", "hot")
CHILD_TIMEOUT_S = 300


def child(
    mode: str, args: argparse.Namespace, triton_cache: Path, state: str = "rested"
) -> dict[str, Any]:
    """One fresh process with a fresh Inductor cache, `state` "rested" or "hot"; its JSON
    line."""
    argv = [mode, args.op, args.size, args.dtype, state, str(args.hot_s)]
    return fresh_process(CHILD, argv, triton_cache)


def fresh_process(script: Path, argv: Sequence[str], triton_cache: Path) -> dict[str, Any]:
    """`script argv...` in a fresh Python process, read-only, with a fresh Inductor cache
    (every selection autotunes) and `triton_cache` shared (compiled kernels reused); the
    last JSON line it printed."""
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        env = checkout_env(
            GPUENV_READONLY="1", TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=str(triton_cache)
        )
        cmd = [sys.executable, str(script), *argv]
        proc = subprocess.run(
            cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
        )
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise SystemExit(f"{' '.join(cmd)} printed no result: {proc.stderr[-2000:]}")
    return dict(json.loads(lines[-1]))


def summarize(rows: Sequence[dict[str, Any]], careful: dict[str, float]) -> dict[str, Any]:
    """One tuner's processes: their `choices` (regret against each choice's careful time),
    the compile wall, the compiled function's time."""
    walls = [r["compile_wall_s"] for r in rows]
    compiled = [r["compiled_s"] for r in rows]
    selects = [r["select_wall_s"] for r in rows if "select_wall_s" in r]  # kept since 2026-11
    others = [r["other_bench_s"] for r in rows if "other_bench_s" in r]
    per_call = [r["other_bench_s"] / n for r in rows if (n := r.get("other_bench_calls"))]
    # gpuenv's selection, split (kept since 2026-11-29): its ranking, Inductor's pass that
    # hands over each choice's work, and the rest (the ranking's opening)
    split = [r for r in rows if {"capture_s", "rank_wall_s", "select_wall_s"} <= r.keys()]
    captures = [r["capture_s"] for r in split]
    ranks = [r["rank_wall_s"] for r in split]
    rests = [r["select_wall_s"] - r["rank_wall_s"] - r["capture_s"] for r in split]
    screens = [r["screen_wall_s"] for r in split if "screen_wall_s" in r]  # since 2026-11-29
    # its calls' waits for a ready GPU (after heavy load: for the cap to clear), since 11-29
    waits = [r["rank_parts"][WAIT] for r in split if WAIT in r.get("rank_parts", {})]
    return {
        **choices(rows, careful),
        "wall_median_s": statistics.median(walls) if walls else float("nan"),
        "select_median_s": _median(selects),
        "other_median_s": _median(others),
        "other_call_median_s": _median(per_call),  # a process's calls vary in number
        "capture_median_s": _median(captures),
        "rank_median_s": _median(ranks),
        "rest_median_s": _median(rests),
        "screen_median_s": _median(screens),
        "wait_median_s": _median(waits),
        "compiled_median_s": statistics.median(compiled) if compiled else float("nan"),
        "compiled_spread": (max(compiled) / min(compiled) - 1) if compiled else float("nan"),
    }


def _median(values: Sequence[float]) -> float | None:
    """The median, or None where no row kept the value."""
    return statistics.median(values) if values else None


def selection(row: dict[str, Any]) -> str:
    """A row's selection in words: op, size, dtype, and Inductor's GEMM backends where not
    its default (`TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS`, passed to every process)."""
    what = f"{row['op']} {row['size']} {row['dtype']}"
    backends = row.get("backends")
    return what if backends in (None, DEFAULT_BACKENDS) else f"{what}, backends {backends}"


def report(rows: Sequence[dict[str, Any]], careful_row: dict[str, Any]) -> None:
    events = {n: ms * 1e-3 for n, ms in careful_row["ms"].items()}
    device = {n: ms * 1e-3 for n, ms in (careful_row.get("device_ms") or {}).items()}
    careful = device or events  # the reference: each choice's device time, where timed
    best = min(careful, key=careful.__getitem__)
    print(
        f"## {selection(careful_row)}: {careful_row['selection']}, {len(careful)} choices "
        f"({careful_row['gpu']}, torch {careful_row['torch']})"
    )
    print()
    passes = careful_row.get("passes_ms") or {}
    extra = " device time (CUPTI) |" if device else ""
    print(f"| choice | careful time | its passes |{extra} against the best |")
    print("| --- | ---: | ---: |" + " ---: |" * (2 if device else 1))
    for n in sorted(careful, key=careful.__getitem__):
        got = passes.get(n)
        span = f"{min(got) * 1e3:.1f}-{max(got) * 1e3:.1f} us" if got else "-"
        cupti = f" {device[n] * 1e6:.2f} us |" if device else ""
        print(
            f"| {n} | {events[n] * 1e6:.1f} us | {span} |{cupti} "
            f"{careful[n] / careful[best] - 1:+.2%} |"
        )
    print()
    if device:
        print(
            "Regret is against each choice's device time from CUPTI: the careful time, by "
            "events, holds their overhead, at one of two levels for a few-us kernel."
        )
        print()
    within = sum(1 for t in careful.values() if t / careful[best] - 1 <= 0.03)
    print(f"{within} choices within 3% of the best ({best}).")
    if passes.get(best):
        top = max(passes[best])
        overlap = [n for n in careful if n != best and passes.get(n) and min(passes[n]) <= top]
        print(
            f"{len(overlap)} other choices had a pass as fast as one of the best's "
            f"({min(passes[best]) * 1e3:.1f}-{top * 1e3:.1f} us): their order is within "
            "the passes' spread."
        )
    print()
    if rows:
        _tuners(rows, careful)


def _tuners(rows: Sequence[dict[str, Any]], careful: dict[str, float]) -> None:
    """The tuners' table (winners, regret, walls), the lines under it and the metrics."""
    print(
        "| tuner | state | processes | distinct winners | most common (share) | ties declared | "
        "distinct decisions (most common) | regret median | regret max | compile wall median | "
        "its selection's benchmarking | other benchmarking | compiled fn median (spread) |"
    )
    print("| --- | --- | ---: | ---: | --- |" + " ---: |" * 8)
    summary = {}
    for tuner in TUNERS:
        for state in STATES:
            mine = [r for r in rows if (r["mode"], r.get("state", "rested")) == (tuner, state)]
            if not mine:
                continue
            s = summary[tuner, state] = summarize(mine, careful)
            print(
                f"| {tuner} | {state} | {choice_cells(s)} | {s['wall_median_s']:.1f} s | "
                f"{_seconds(s['select_median_s'])} | {_seconds(s['other_median_s'])} | "
                f"{s['compiled_median_s'] * 1e6:.1f} us ({s['compiled_spread']:.1%}) |"
            )
    print()
    for (tuner, state), s in summary.items():
        if s["unseen"]:
            print(
                f"{tuner}, {state}: {s['unseen']} winners the careful run did not time "
                "(not in regret)."
            )
    _metrics(summary)


def _seconds(s: float | None) -> str:
    return or_dash(s, "{:.2f} s")


def _metrics(summary: dict[tuple[str, str], dict[str, Any]]) -> None:
    for state in STATES:
        for tuner in RANKERS:  # gpuenv's metrics keep their names; gpuenv-nowait's say it
            g, p = summary.get((tuner, state)), summary.get(("plain", state))
            if g is not None:
                _against_plain(state, tuner, g, p)


def _against_plain(state: str, tuner: str, g: dict[str, Any], p: dict[str, Any] | None) -> None:
    """A ranking tuner's choices, and its walls against plain Inductor's in one state."""
    key = state if tuner == "gpuenv" else f"{state}, {tuner}"
    choice_metrics(key, g)
    if p is not None and p["wall_median_s"] > 0:
        ratio = g["wall_median_s"] / p["wall_median_s"]
        print(f"{state.capitalize()}, {tuner}'s compile wall is {ratio:.2f}x plain Inductor's.")
        runner.metric(f"{key}: compile wall {tuner} / plain", ratio, "x", slack=0.1)
        # the benchmarking after the selection, a call (the median of each process's
        # mean): processes differ in how many calls they make; rows kept it since 11-29
        gc, pc = g["other_call_median_s"], p["other_call_median_s"]
        both = gc is not None and pc is not None
        per_call = f" ({gc * 1e3:.1f} ms a call against {pc * 1e3:.1f})" if both else ""
        gs, ps = g["select_median_s"], p["select_median_s"]
        if gs is not None and ps:
            print(
                f"Its selection's benchmarking (Inductor's own, or gpuenv's ranking) took "
                f"{gs / ps:.2f}x plain's; the benchmarking after it, which the choice made "
                f"brings, {_seconds(g['other_median_s'])} against "
                f"{_seconds(p['other_median_s'])}{per_call}."
            )
            runner.metric(f"{key}: selection wall {tuner} / plain", gs / ps, "x", slack=0.2)
        if gc is not None and pc:
            name = f"{key}: later benchmarking a call {tuner} / plain"
            runner.metric(name, gc / pc, "x", slack=0.3)
    if g["rank_median_s"] is not None:
        _split_line(state, g, tuner, key)
    print()


def _split_line(state: str, g: dict[str, Any], tuner: str, key: str) -> None:
    """A ranking tuner's selection, split: the ranking (its screen, its calls' waits for a
    ready GPU), Inductor's pass handing over each choice's work, and the rest (the
    ranking's opening). `key`: its metrics' prefix (`_against_plain`'s)."""
    screen, wait = g["screen_median_s"], g["wait_median_s"]
    parts = [f"its screen {screen * 1e3:.0f} ms"] if screen is not None else []
    if wait is not None:
        parts.append(f"waiting for a ready GPU {wait * 1e3:.0f} ms")
        runner.metric(f"{key}: gpuenv's ranking waiting for a ready GPU", wait, "s", slack=0.1)
    of = f" ({', '.join(parts)})" if parts else ""
    print(
        f"{tuner}'s selection ({state}), medians: the ranking {_seconds(g['rank_median_s'])}"
        f"{of}, Inductor's pass handing over each choice's work "
        f"{_seconds(g['capture_median_s'])}, the rest (the ranking's opening) "
        f"{_seconds(g['rest_median_s'])}."
    )


def run(args: argparse.Namespace) -> int:
    if args.sim:
        print("max-autotune needs a GPU (CUDA torch): --sim has nothing to run", file=sys.stderr)
        return 2
    if args.scan:
        if args.rows_in or args.rows_out:
            raise SystemExit("--scan runs and joins nothing: leave out --rows-in/--rows-out")
        return scan(args.scan)
    earlier = read_rows(args.rows_in or [], args)
    keep = _keeper(args.rows_out)
    rows = [r for r in earlier if r.get("mode") != "careful"]
    careful = next((r for r in earlier if r.get("mode") == "careful"), None)
    if args.processes > 0 or not earlier:  # none and no rows: the careful process alone
        with _triton_cache(args.triton_cache) as shared:
            # a careful run fills the Triton cache; the first call's stays the reference, and
            # a call that joins it with a cache an earlier call filled needs none of its own
            if careful is None or not _filled(shared):
                mine = keep(_timed("careful", functools.partial(child, "careful", args, shared)))
                careful = careful or mine
            for i in range(args.processes):  # interleaved: the tuners meet the same machine
                for state in args.states.split(","):
                    for tuner in args.tuners.split(","):
                        what = f"{tuner} {state} {i + 1}/{args.processes}"
                        part = functools.partial(child, tuner, args, shared, state)
                        rows.append(keep(_timed(what, part)))
    if careful is None:
        raise SystemExit("nothing to report: the --rows-in files hold no careful row")
    if earlier:
        print(f"Rows of {len(args.rows_in)} earlier call(s) joined; regret against the first's")
        print("careful times.")
        print()
    report(rows, careful)
    return 0


@contextlib.contextmanager
def _triton_cache(kept: str | None) -> Iterator[Path]:
    """The Triton cache this call's processes share: `kept` (made if missing, left after
    the call), or a temporary one."""
    if kept is not None:
        try:
            Path(kept).mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise SystemExit(f"--triton-cache {kept}: {err.strerror or err}") from err
        yield Path(kept)
        return
    with tempfile.TemporaryDirectory(prefix="triton-") as tmp:
        yield Path(tmp)


def _filled(cache: Path) -> bool:
    return any(cache.iterdir())


def read_rows(paths: Sequence[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows (JSON lines, `--rows-out`) of earlier calls on the same selection, in the
    order given; a file of another op, size or dtype is refused."""
    rows = _lines(paths, "--rows-in")
    for path, row in rows:
        got = (row.get("op"), row.get("size"), row.get("dtype"))
        if got != (args.op, args.size, args.dtype):
            raise SystemExit(
                f"--rows-in {path}: rows of {' '.join(map(str, got))}, not "
                f"{args.op} {args.size} {args.dtype}: join calls of one selection"
            )
    backends = {row.get("backends") or DEFAULT_BACKENDS for _, row in rows}
    if len(backends) > 1:
        raise SystemExit(
            f"--rows-in: rows of Inductor's GEMM backends {' and '.join(sorted(backends))}: "
            "join calls of one selection (TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS the same)"
        )
    return [row for _, row in rows]


def _lines(paths: Sequence[str], flag: str) -> list[tuple[str, dict[str, Any]]]:
    """Each file's rows (JSON lines), with the file they came from, in the order given."""
    rows = []
    for path in paths:
        try:
            text = Path(path).read_text()
        except OSError as err:
            raise SystemExit(f"{flag} {path}: {err.strerror or err}") from err
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append((path, json.loads(line)))
            except json.JSONDecodeError as err:
                raise SystemExit(f"{flag} {path}:{n}: not a row ({err.msg})") from err
    return rows


def scan(paths: Sequence[str]) -> int:
    """The careful rows of `--processes 0` calls on any selections (`--scan`), a line each:
    how far the best choice's runner-up is, by device time where timed; the closest first;
    and among the Triton templates alone (`triton_*`: what
    TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS=TRITON leaves to rank). The search for a
    selection whose best choices are within 3% (the figure issue 43 asks for), on the
    record."""
    careful = [row for _, row in _lines(paths, "--scan") if row.get("mode") == "careful"]
    if not careful:
        raise SystemExit("--scan: the files hold no careful row (`--processes 0 --rows-out`)")
    lines = []
    for row in careful:
        times = row.get("device_ms") or row["ms"]
        ranked = sorted(times, key=times.__getitem__)
        within = sum(1 for t in times.values() if t / times[ranked[0]] - 1 <= 0.03)
        templates = {n: t for n, t in times.items() if n.startswith("triton_")}
        lines.append((_behind(times), selection(row), ranked, within, _behind(templates)))
    lines.sort(key=lambda x: x[0])
    print(
        "| selection | choices | best | runner-up | runner-up behind | within 3% of the best "
        "| Triton templates alone: runner-up behind |"
    )
    print("| --- | ---: | --- | --- | ---: | ---: | ---: |")
    for gap, what, ranked, within, alone in lines:
        second = ranked[1] if len(ranked) > 1 else "-"
        print(
            f"| {what} | {len(ranked)} | {ranked[0]} | {second} | {gap:+.2%} | {within} "
            f"| {or_dash(alone if math.isfinite(alone) else None, '{:+.2%}')} |"
        )
    print()
    gpus = ", ".join(sorted({str(r.get("gpu")) for r in careful}))
    torches = ", ".join(sorted({str(r.get("torch")) for r in careful}))
    closest = lines[0]
    print(
        f"{len(lines)} selections scanned ({gpus}, torch {torches}; by device time from CUPTI "
        f"where timed): the closest, {closest[1]}, has its runner-up {closest[0]:.2%} behind "
        f"the best. {sum(1 for x in lines if x[3] > 1)} of {len(lines)} have a second choice "
        "within 3%."
    )
    nearest = min(lines, key=lambda x: x[4])
    if math.isfinite(nearest[4]):
        print(
            f"Among the Triton templates alone, the closest is {nearest[1]}: its runner-up "
            f"{nearest[4]:.2%} behind."
        )
    runner.metric("selections scanned", len(lines), better="higher")
    runner.metric("closest runner-up behind the best", closest[0] * 100, "%", slack=1.0)
    return 0


def _behind(times: dict[str, float]) -> float:
    """How far the second fastest is behind the fastest (inf with fewer than two)."""
    if len(times) < 2:
        return math.inf
    first, second = sorted(times.values())[:2]
    return second / first - 1


def _keeper(path: str | None) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A function that appends a row to `path` (JSON lines, closed each time: a call cut
    short by its time limit keeps the rows it had) and returns it; without a path, or once
    a write failed (said on stderr, once), only returns it."""

    failed: list[str] = []

    def keep(row: dict[str, Any]) -> dict[str, Any]:
        if path is not None and not failed:
            try:
                with open(path, "a") as f:
                    f.write(json.dumps(row) + "\n")
            except OSError as err:  # the report still comes: only the rows are not kept
                failed.append(str(err))
                print(f"inductor_rank: --rows-out {path}: {err}", file=sys.stderr)
        return row

    return keep


def _timed(what: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`run()`, saying on stderr how long it took and, where the process said, its parts
    (its start: the interpreter and torch; the compile, with the autotuning; the compiled
    function's bench): a run cut short by its time limit still shows how far it got (10
    rested processes a tuner did not finish in 500 s on an H200), and where a process's
    27-34 s went beyond its 3-13 s of compiling."""
    t0 = time.monotonic()
    got = run()
    took = time.monotonic() - t0
    parts = got.get("parts_s") or {}
    said = "".join(f", {k} {v:.1f} s" for k, v in parts.items())
    print(f"inductor_rank: {what}: {took:.1f} s{said}", file=sys.stderr, flush=True)
    return got


def _rows_gpu(args: argparse.Namespace) -> str | None:
    """A report of earlier calls' rows alone (`--processes 0`): the GPU they were measured
    on, not the machine that joined them (None: this machine's, as any run's)."""
    if args.scan:
        rows = [row for _, row in _lines(args.scan, "--scan")]
    elif args.processes > 0 or not args.rows_in:
        return None
    else:
        rows = read_rows(args.rows_in, args)
    names = sorted({str(r["gpu"]) for r in rows if r.get("gpu")})
    if not names:
        return None
    return ", ".join(names) + " (rows of earlier calls; the machine is where they were joined)"


def _variant(args: argparse.Namespace) -> str:
    """The selection (with Inductor's GEMM backends where not its default), and the state
    when one alone ran; a report joining earlier calls' rows (which may hold either state)
    is "-joined"."""
    if args.scan:
        return "scan"
    part = f"{args.op}-{args.size}-{args.dtype}"
    backends = os.environ.get("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS", DEFAULT_BACKENDS)
    rows = read_rows(args.rows_in, args) if args.rows_in else []
    if rows:  # the rows' own (read_rows refuses rows of two)
        backends = rows[0].get("backends") or DEFAULT_BACKENDS
    backends = backends.upper().replace(" ", "")
    if backends != DEFAULT_BACKENDS:  # a file of its own: not the default selection
        part += "-" + backends.lower().replace(",", "+")
    if args.rows_in:
        return f"{part}-joined"
    if args.processes == 0:
        return f"{part}-careful"
    return part if args.states == "rested,hot" else f"{part}-{args.states}"


def _tuner_list(text: str) -> str:
    unknown = sorted(set(text.split(",")) - set(TUNERS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown tuners {unknown}: use some of {TUNERS}")
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--processes",
        type=int,
        default=2,
        help="fresh processes per tuner and state (2; 0: the careful process alone, or with "
        "--rows-in their rows alone)",
    )
    parser.add_argument(
        "--op",
        choices=("mm_relu", "addmm_relu", "bmm"),
        default="addmm_relu",
        help="relu(a @ b), relu(a @ b + bias) or a batched a @ b (addmm_relu)",
    )
    parser.add_argument(
        "--size", default="2048x2048x8192", help="MxNxK, or BxMxNxK for bmm (2048x2048x8192)"
    )
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    parser.add_argument(
        "--states",
        choices=("rested,hot", "rested", "hot"),
        default="rested,hot",
        help="rested (the GPU idle while Inductor compiles), hot (each selection benchmarked "
        "right after --hot-s of heavy load), or both (rested,hot)",
    )
    parser.add_argument(
        "--hot-s", type=float, default=7.0, help="heavy load before a hot selection (7)"
    )
    parser.add_argument(
        "--tuners",
        default="plain,gpuenv",
        type=_tuner_list,
        help="the tuners a process each (plain,gpuenv); gpuenv-nowait: gpuenv's ranking with "
        'condition="none", no wait for a ready GPU (its candidates interleaved in the state '
        "they find: capped, hot)",
    )
    parser.add_argument(
        "--rows-out",
        help="append each process's row to this file (JSON lines) as it ends, the careful "
        "one first: for --rows-in of a later call",
    )
    parser.add_argument(
        "--triton-cache",
        help="a Triton cache folder kept after the call (made if missing; default: a "
        "temporary one). A later call given it filled, and --rows-in with the careful row, "
        "runs no careful process of its own (a minute saved)",
    )
    parser.add_argument(
        "--rows-in",
        action="append",
        help="an earlier call's --rows-out (repeatable): its processes join this call's in "
        "the report, regret against the first file's careful times; with --processes 0, "
        "report them alone",
    )
    parser.add_argument(
        "--scan",
        action="append",
        help="careful rows (--rows-out of --processes 0 calls) of any selections "
        "(repeatable): a line each, how far its best choice's runner-up is; runs nothing",
    )


if __name__ == "__main__":
    sys.exit(
        runner.main(
            "inductor_rank",
            __doc__,
            add_arguments,
            run,
            quick={"processes": 1},
            variant=_variant,
            gpu=_rows_gpu,
        )
    )
