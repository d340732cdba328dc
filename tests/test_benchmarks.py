"""The benchmark suite (benchmarks/): its docs pages are what its results say, the
regression check fails on what it should, and the runner writes what it promises.

No benchmark is timed here: the runner runs a tiny one in-process, the check compares
results made up in a temporary directory.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import math
import re
from pathlib import Path

import pytest

from benchmarks import regress, report, runner
from benchmarks.__main__ import main as suite_main


def test_the_benchmark_pages_are_generated_from_the_kept_results():
    # fails when a results file changed (or was added) without `python -m benchmarks report`:
    # the headline page, each benchmark's page and mkdocs.yml's nav alike
    report.check()
    grouped = report.by_benchmark(report.load_results())
    headline = report.DOC.read_text()
    assert len(headline.splitlines()) <= report.HEADLINE_LIMIT, "the headline page grew long"
    nav = (runner.ROOT / "mkdocs.yml").read_text()
    for name, results in grouped.items():
        assert f"(benchmarks/{name}.md)" in headline, f"the headline page lacks {name}"
        assert f"- {name}: benchmarks/{name}.md" in nav, f"mkdocs.yml's nav lacks {name}"
        page = (report.SITE.pages / f"{name}.md").read_text()
        for result in results:
            assert f"`{result['command']}`" in page


def _site(tmp_path: Path) -> report.Site:
    docs = tmp_path / "docs"
    (docs / "benchmarks").mkdir(parents=True)
    (tmp_path / "benchmarks").mkdir()
    mkdocs = tmp_path / "mkdocs.yml"
    mkdocs.write_text(
        "nav:\n  - Figures:\n      - benchmarks.md\n"
        f"      {report.NAV_BEGIN}\n      {report.NAV_END}\n      - Typed: typed.md\n"
    )
    return report.Site(docs=docs, mkdocs=mkdocs, modules=tmp_path / "benchmarks")


def test_the_report_writes_a_page_per_benchmark_and_keeps_what_follows_it(tmp_path: Path):
    site = _site(tmp_path)
    results = tmp_path / "results"
    results.mkdir()
    assert report.write(site, results)  # no results: a headline page with no benchmark
    assert not report.write(site, results)  # nothing changed: nothing written
    (results / "x.json").write_text(json.dumps(_result("x", {"t": _m(1.0)})))
    with pytest.raises(report.StaleError):
        report.check(site, results)
    written = report.write(site, results)
    assert site.pages / "x.md" in written and site.mkdocs in written
    report.check(site, results)
    page = site.pages / "x.md"
    # notes typed by hand after the generated section stay as they are
    page.write_text(page.read_text() + "## Notes\n\ntyped by hand\n")
    (results / "x-sim.json").write_text(json.dumps({**_result("x", {}), "sim": True}))
    report.write(site, results)
    text = page.read_text()
    assert text.count(report.BEGIN) == 1 and text.endswith("## Notes\n\ntyped by hand\n")
    assert "## x-sim: simulated NVIDIA H100 80GB HBM3, 2026-11-24" in text
    assert "| a | b \\| c |\n| --- | ---: |" in text  # a cell's pipe stays escaped
    assert "```text\n# not a heading\n```" in text  # printed lines are no markdown
    headline = site.headline.read_text()
    assert "- [**x**](benchmarks/x.md): x: a benchmark" in headline
    assert "(benchmarks/x.md#x-nvidia-h100-80gb-hbm3-2026-11-24): t = 1 s" in headline
    assert "(benchmarks/x.md#x-sim-simulated-nvidia-h100-80gb-hbm3-2026-11-24)" in headline
    nav = site.mkdocs.read_text()
    assert f"{report.NAV_BEGIN}\n      - x: benchmarks/x.md\n      {report.NAV_END}" in nav
    assert nav.endswith("- Typed: typed.md\n")
    # a benchmark whose results are all gone loses its generated page and its nav line
    for f in results.glob("*.json"):
        f.unlink()
    report.write(site, results)
    assert not page.exists() and "benchmarks/x.md" not in site.mkdocs.read_text()


def test_a_benchmarks_goal_is_its_modules_title_now(tmp_path: Path):
    site = _site(tmp_path)
    (site.modules / "x.py").write_text('"""What x asks, now.\n\nMore."""\nHEADLINE = "u"\n')
    assert report.goal("x", [_result("x", {})], site) == "What x asks, now."
    assert report.goal("gone", [_result("gone", {})], site) == "gone: a benchmark"
    # the headline page shows the metric the module names, else the first one kept
    assert report.headline_metric("x", site) == "u"
    assert report.headline_metric("gone", site) is None
    two = _result("x", {"t": _m(1.0), "u": _m(2.0)})
    assert report._headline_value(two, "u") == "u = 2 s"
    assert report._headline_value(two, "missing") == "t = 1 s"
    assert report._headline_value(_result("x", {})) == "tables only (no metric kept)"


def test_the_anchor_of_a_section_is_the_one_mkdocs_gives_it():
    assert report._anchor("x-sim: simulated H100, 2026-11-24") == "x-sim-simulated-h100-2026-11-24"
    assert report._anchor("a_b: GPU (x), 1.5") == "a_b-gpu-x-15"


def _m(value: float, better: str = "lower", slack: float = 0.0) -> dict:
    return {"value": value, "unit": "s", "better": better, "slack": slack}


def _result(name: str, metrics: dict, gpu: str = "NVIDIA H100 80GB HBM3") -> dict:
    return {
        "schema": 1,
        "name": name,
        "title": f"{name}: a benchmark",
        "command": f"python -m benchmarks.{name}",
        "date": "2026-11-24T19:00:00+00:00",
        "wall_s": 1.0,
        "machine": {"host": "h", "cpu": "cpu", "cores": 2, "os": "Linux", "python": "3.11"},
        "commit": {"sha": "0" * 40, "dirty": False},
        "gpu": gpu,
        "quick": False,
        "sim": False,
        "exit_code": 0,
        "args": {},
        "metrics": metrics,
        "blocks": [
            {"text": "# not a heading"},
            {
                "table": {
                    "columns": ["a", "b \\| c"],
                    "rows": [["1", "2"]],
                    "align": ["left", "right"],
                }
            },
        ],
    }


@pytest.mark.parametrize(
    ("kept", "new", "status"),
    [
        (_m(1.0), _m(1.09), "ok"),  # 9% slower: within 10%
        (_m(1.0), _m(1.11), "regression"),  # 11% slower
        (_m(1.0), _m(0.85), "better"),
        (_m(100.0, "higher"), _m(89.0, "higher"), "regression"),  # a rate 11% down
        (_m(100.0, "higher"), _m(120.0, "higher"), "better"),
        (_m(0.2, slack=0.5), _m(0.6, slack=0.5), "ok"),  # 3x, but within the slack
        (_m(0.2, slack=0.5), _m(0.8, slack=0.5), "regression"),
    ],
)
def test_a_metric_regresses_past_ten_percent_and_its_slack(kept, new, status):
    assert regress.compare_metric("t", kept, new, regress.TOLERANCE).status == status


def test_the_check_command_fails_on_a_regression_and_on_what_it_cannot_judge(tmp_path, capsys):
    def write(name: str, result: dict) -> str:
        path = tmp_path / name
        path.write_text(json.dumps(result))
        return str(path)

    kept = write("kept.json", _result("b", {"t": _m(1.0), "u": _m(2.0)}))
    same = write("same.json", _result("b", {"t": _m(1.05), "u": _m(1.9)}))
    slower = write("slower.json", _result("b", {"t": _m(1.2), "u": _m(2.0)}))
    lacking = write("lacking.json", _result("b", {"t": _m(1.0)}))
    other_gpu = write("sim.json", _result("b", {"t": _m(1.0), "u": _m(2.0)}, gpu="simulated"))
    assert suite_main(["check", same, kept]) == 0
    assert suite_main(["check", slower, kept]) == 1
    assert "t: 1 -> 1.2 (+20.0%): regression" in capsys.readouterr().out
    assert suite_main(["check", lacking, kept]) == 1  # a kept metric is missing
    assert suite_main(["check", other_gpu, kept]) == 2  # another GPU: not comparable
    assert suite_main(["check", other_gpu, kept, "--any-gpu"]) == 0
    assert suite_main(["check", str(tmp_path / "absent.json"), kept]) == 2


def test_the_runner_writes_the_record_tables_and_metrics(tmp_path: Path, capsys):
    def add(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--n", type=int, default=10)

    def run(args: argparse.Namespace) -> int:
        print(f"n = {args.n}\n\n| what | value |\n| --- | ---: |\n| x | {args.n} |\n\nafter")
        runner.metric("x_s", args.n / 10, "s")
        return 0

    out = tmp_path / "r.json"
    rc = runner.main(
        "tiny",
        "tiny: a test\n\nmore",
        add,
        run,
        quick={"n": 3},
        sim_only=True,
        argv=["--quick", "--out", str(out)],
    )
    assert rc == 0 and "| x | 3 |" in capsys.readouterr().out  # still printed
    record = json.loads(out.read_text())
    assert record["quick"] and record["args"]["n"] == 3
    assert record["gpu"].startswith("simulated ")
    assert record["commit"]["sha"] and len(record["commit"]["sha"]) == 40
    assert record["machine"]["cores"] >= 1 and record["date"].endswith("+00:00")
    assert record["metrics"] == {
        "x_s": {"value": 0.3, "unit": "s", "better": "lower", "slack": 0.0}
    }
    assert record["blocks"] == [
        {"text": "n = 3"},
        {"table": {"columns": ["what", "value"], "rows": [["x", "3"]], "align": ["left", "right"]}},
        {"text": "after"},
    ]


def _calls_with_name_and_doc(source: str, name: str) -> bool:
    """Whether the module calls something with ("NAME", __doc__, ...) as its first arguments."""
    return any(
        isinstance(node, ast.Call)
        and len(node.args) >= 2
        and isinstance(node.args[0], ast.Constant)
        and node.args[0].value == name
        and isinstance(node.args[1], ast.Name)
        and node.args[1].id == "__doc__"
        for node in ast.walk(ast.parse(source))
    )


def test_every_benchmark_module_parses_the_shared_arguments():
    root = Path(runner.__file__).parent
    modules = sorted(
        p.stem
        for p in root.glob("*.py")
        if not p.stem.startswith("_") and p.stem not in ("runner", "report", "regress", "checkout")
    )
    assert len(modules) >= 15
    for name in modules:
        module = importlib.import_module(f"benchmarks.{name}")
        assert callable(module.run), f"benchmarks/{name}.py has no run(args)"
        text = (root / f"{name}.py").read_text()
        # the runner's main, under the module's own name (its results file)
        assert _calls_with_name_and_doc(text, name), f"benchmarks/{name}.py skips the runner"
        assert "scripts/bench_" not in text, f"benchmarks/{name}.py names its old path"


def test_a_transcribed_result_says_when_where_and_from_what():
    # figures measured before the runner, kept from the hand-typed page or docs/'s raw data
    kept = [r for r in report.load_results() if r.get("transcribed")]
    assert kept, "the moved scripts' earlier figures are kept as results"
    for result in kept:
        page = (report.SITE.pages / f"{result['name']}.md").read_text()
        line = report.where(result)
        assert line.startswith(result["date"][:10]) and result["machine"]["text"] in line
        assert f"kept from {result['transcribed']}" in line and line in page
        assert any("table" in b for b in result["blocks"]), result["key"]


def test_perf_report_reads_the_tutorials_table_and_compares_it_side_by_side():
    from benchmarks import perf_report

    bare = perf_report.parse_table((runner.ROOT / "docs/h100/vadd_bare.txt").read_text())
    assert sorted(bare) == [2**i for i in range(12, 28)]
    assert bare[4096] == (11.170909, 10.893617)
    assert perf_report.largest_change(bare, bare) == 0.0
    faster = {s: (t * 1.05, o) for s, (t, o) in bare.items()}
    assert perf_report.largest_change(bare, faster) == pytest.approx(5.0)
    # sizes under 2M elements are left out (do_bench itself moves by more there)
    assert math.isnan(perf_report.largest_change(bare, {4096: (1.0, 1.0)}))
    rows = perf_report.table(bare, faster, {(4096, "triton"): "ok"})
    assert len(rows) == 2 + 16 and "| 4096 | 11.2 | 11.7 | +5.0% |" in rows[2]
    assert rows[2].endswith("| ok / - |")


def test_the_autotune_tutorial_benchmark_reads_the_matmul_tutorials_table():
    from benchmarks import autotune_tutorial

    printed = """matmul-performance-fp16:
        M       N       K      cuBLAS      Triton
0   256.0   256.0   256.0    4.096000    4.096000
1  1024.0  1024.0  1024.0  248.672019  262.144000
"""
    assert autotune_tutorial.parse_table(printed) == {
        256: (4.096, 4.096),
        1024: (248.672019, 262.144),
    }


def test_the_autotune_rank_benchmark_tables_winners_regret_and_wall(capsys):
    from benchmarks import autotune_rank

    cases = autotune_rank._case_configs()  # read from the workload's source
    assert len(cases["matmul8"]) == 8 and len(cases["close"]) == 4
    assert "BM256/BN128/BK64/G8 s3 w8" in cases["matmul8"]
    assert {"BM128/BN128/BK64/G8 s3 w8", "BM128/BN128/BK64/G8 s4 w8"} <= set(cases["matmul8"])
    careful = {n: 200e-6 * (1 + 0.01 * i) for i, n in enumerate(cases["close"])}
    best, second = cases["close"][0], cases["close"][1]
    rows = [
        {"case": "close", "tuner": "plain", "state": "rested", "winner": w, "wall_s": 0.8}
        for w in (second, second, best, cases["close"][3])
    ] + [
        {
            "case": "close",
            "tuner": "gpuenv",
            "state": "rested",
            "winner": best,
            "wall_s": 1.0,
            "tied": [best, second] if k % 2 else [best],
        }
        for k in range(4)
    ]
    s = autotune_rank.summarize(rows[:4], careful)
    assert s["distinct"] == 3 and s["modal"] == second and s["modal_share"] == 0.5
    assert s["regret_max"] == pytest.approx(0.03) and s["regret_median"] == pytest.approx(0.01)
    g = autotune_rank.summarize(rows[4:], careful)
    assert g["distinct"] == 1 and g["modal_share"] == 1.0 and g["regret_max"] == 0.0
    assert g["ties"] == 2
    assert g["decisions"] == 2 and g["decision_share"] == 0.5  # alone, or tied with second
    assert s["decisions"] == 3 and s["decision_share"] == 0.5  # plain: its winners
    autotune_rank.report(rows, careful, {"close": cases["close"]})
    out = capsys.readouterr().out
    assert "| gpuenv | rested | 4 | 1 | " in out and "1.25x plain triton's" in out
    assert f"| {best} (100%) | 2 | 2 (50%) | 0.00% |" in out
    assert "Where gpuenv's tuning wall went" not in out  # no row kept a split


def test_autotune_rank_splits_gpuenv_s_tuning_wall_by_where_it_went(capsys):
    """A ranking's wall: each bench phase summed over its calls, the waits and rests inside
    them, the rest between calls; the first launch's wall outside the ranking."""
    from types import SimpleNamespace

    from benchmarks import autotune_rank as ar
    from gpuenv.phases import WALL_PHASES, Wall

    def call(measure, condition, wait, rests, open_s=0.001, cold=False):
        spans = dict.fromkeys(WALL_PHASES, 0.001)
        spans.update(measure=measure, condition=condition, open=open_s)
        extra = {"burst_first_wait_s": wait, "burst_rest_s": rests, "burst_cold_start": cold}
        return SimpleNamespace(wall=Wall(tuple(spans.items())), extra=extra)

    calls = [
        call(0.02, 0.01, 0.008, 0.0, open_s=0.004),
        call(0.03, 0.002, 0.001, 0.01, cold=True),
    ]
    old = SimpleNamespace(wall=None, extra={})  # a call kept before walls were: nothing
    ranking = SimpleNamespace(
        wall_s=0.2,
        screen_wall_s=0.03,
        candidates=[
            SimpleNamespace(measurements=[]),  # stopped by the screen: no call of its own
            SimpleNamespace(measurements=calls),
            SimpleNamespace(measurements=[old]),
        ],
    )
    parts = ar.ranking_parts(ranking)
    assert parts["measure"] == pytest.approx(0.05) and parts["condition"] == pytest.approx(0.012)
    assert parts["open"] == pytest.approx(0.005)
    assert parts[ar.WAIT] == pytest.approx(0.009) and parts[ar.RESTS] == pytest.approx(0.01)
    assert parts[ar.COLD] == pytest.approx(0.001)  # the wait of the call begun idle
    assert parts[ar.FIRST_OPEN] == pytest.approx(0.004)  # the first call, round 1's first
    phases = sum(parts[p] for p in WALL_PHASES)
    assert parts[ar.SCREEN] == 0.03
    assert parts[ar.BETWEEN] == pytest.approx(0.2 - 0.03 - phases)  # 0.2 - 0.03 - 0.075
    row = {"case": "close", "tuner": "gpuenv", "state": "hot", "winner": "a", "wall_s": 0.5}
    rows = [
        {**row, "rank_wall_s": 0.2, "parts": parts},
        {**row, "rank_wall_s": 0.2, "parts": {**parts, "measure": 0.07}, "wall_s": 0.3},
        {**row, "wall_s": 0.9},  # no split kept: left out of it
    ]
    split = ar.wall_split(rows)
    assert split[ar.OUTSIDE] == pytest.approx(0.2)  # the median of 0.3 and 0.1
    assert split["measure"] == pytest.approx(0.06) and split[ar.BETWEEN] == parts[ar.BETWEEN]
    assert ar.wall_split([row]) == {}
    ar._split_table({("gpuenv", "hot"): {"split": split}})
    out = capsys.readouterr().out
    assert "| part | hot |" in out and f"| {ar.OUTSIDE} | 200 ms |" in out
    assert "| measure | 60 ms |" in out and f"| {ar.WAIT} | 9 ms |" in out


def _inductor_workload():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "inductor_mm", Path(__file__).parent.parent / "benchmarks/workloads/inductor_mm.py"
    )
    assert spec is not None and spec.loader is not None
    workload = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workload)
    return workload


def test_the_inductor_workload_clocks_a_selection_apart_from_the_benchmarking_after_it(
    monkeypatch,
):
    """benchmarks/workloads/inductor_mm.py's clock_benchmarking, on CPU torch's own classes:
    the benchmarker's calls inside a selection's benchmark function count as the selection's,
    those outside it (pointwise tuning, the fusion check) apart; under a ranking, Inductor's
    pass that hands over the choices' work is clocked too."""
    select = pytest.importorskip("torch._inductor.select_algorithm")
    benchmarking = pytest.importorskip("torch._inductor.runtime.benchmarking")
    workload = _inductor_workload()
    bm = benchmarking.benchmarker
    owner = next(k for k in type(bm).__mro__ if "benchmark" in vars(k))
    asked = []
    monkeypatch.setattr(owner, "benchmark", lambda self, fn, **kw: asked.append(fn) or 1.0)
    S = select.AlgorithmSelectorCache

    def own(cls, choices, *args, **kwargs):
        return lambda cs: {c: bm.benchmark(c) for c in cs}

    monkeypatch.setattr(S, "make_benchmark_fn", classmethod(own))
    monkeypatch.setattr(workload.inductor, "ranking_on", lambda: True)
    monkeypatch.setattr(workload.inductor, "_capture_choices", lambda fn, cs: ("kept", cs))
    spent = workload.clock_benchmarking(select)
    fn = S.make_benchmark_fn(["a", "b"], [], None, None)
    assert fn(["a", "b"]) == {"a": 1.0, "b": 1.0}  # the selection's: not "other"
    assert bm.benchmark("fused") == 1.0  # after it: other
    assert workload.inductor._capture_choices(None, ["a"]) == ("kept", ["a"])
    assert asked == ["a", "b", "fused"] and spent["other_calls"] == 1
    assert set(spent) == {"select_s", "other_s", "other_calls", "capture_s"}


def test_the_inductor_workload_s_hot_state_loads_right_before_each_selection_s_timing(
    monkeypatch,
):
    """benchmarks/workloads/inductor_mm.py's hot state, on CPU torch's own selector class:
    the load runs when Inductor's benchmark function is called (after compiling), each
    time, before the choices are timed; what the function returns is Inductor's."""
    select = pytest.importorskip("torch._inductor.select_algorithm")
    workload = _inductor_workload()
    S = select.AlgorithmSelectorCache
    seen = []

    def own(cls, choices, *args, **kwargs):
        seen.append(("made", len(choices)))
        return lambda cs: seen.append(("timed", len(cs))) or dict.fromkeys(cs, 1.0)

    monkeypatch.setattr(S, "make_benchmark_fn", classmethod(own))
    workload.heat_before_benchmarking(select, lambda s: seen.append(("load", s)), 2.5)
    fn = S.make_benchmark_fn(["a", "b"], [], None, None)
    assert seen == [("made", 2)]  # made: nothing loaded yet
    assert fn(["a", "b"]) == {"a": 1.0, "b": 1.0} and fn(["a"]) == {"a": 1.0}
    assert seen[1:] == [("load", 2.5), ("timed", 2), ("load", 2.5), ("timed", 1)]


def test_the_inductor_rank_benchmark_tables_winners_regret_and_walls(capsys):
    from benchmarks import inductor_rank

    careful_ms = {"mm": 0.200, "triton_mm_1 BLOCK_M=128": 0.201, "triton_mm_2 BLOCK_M=64": 0.230}
    careful = {"mode": "careful", "op": "addmm_relu", "size": "2048x2048x8192"}
    careful.update(dtype="float16", selection="addmm", gpu="H200", torch="2.9", ms=careful_ms)
    careful["passes_ms"] = {  # each choice's median is careful_ms's
        "mm": [0.199, 0.200, 0.205],
        "triton_mm_1 BLOCK_M=128": [0.2005, 0.201, 0.210],
        "triton_mm_2 BLOCK_M=64": [0.229, 0.230, 0.231],
    }

    def row(mode, winner, wall, compiled, tied=()):
        return {
            "mode": mode,
            "winner": winner,
            "compile_wall_s": wall,
            "compiled_s": compiled,
            "tied": list(tied),
        }

    rows = [
        row("plain", "triton_mm_2 BLOCK_M=64", 20.0, 230e-6),
        row("plain", "mm", 22.0, 200e-6),
        row("plain", "triton_mm_9", 21.0, 210e-6),  # a winner the careful run never timed
        row("gpuenv", "mm", 24.0, 200e-6, tied=("mm", "triton_mm_1 BLOCK_M=128")),
        row("gpuenv", "mm", 26.0, 202e-6),
    ]
    seconds = {n: ms * 1e-3 for n, ms in careful_ms.items()}
    p = inductor_rank.summarize(rows[:3], seconds)
    assert p["distinct"] == 3 and p["unseen"] == 1
    assert p["regret_max"] == pytest.approx(0.15) and p["regret_median"] == pytest.approx(0.075)
    g = inductor_rank.summarize(rows[3:], seconds)
    assert g["distinct"] == 1 and g["modal_share"] == 1.0 and g["regret_max"] == 0.0
    assert g["ties"] == 1 and g["compiled_spread"] == pytest.approx(0.01)
    assert g["decisions"] == 2 and g["decision_share"] == 0.5  # the tie, and mm alone
    hot = [  # rows of the hot state: tabled and measured apart from the rested ones
        {**row("plain", "triton_mm_1 BLOCK_M=128", 30.0, 201e-6), "state": "hot"},
        {**row("gpuenv", "mm", 33.0, 200e-6), "state": "hot"},
    ]
    spent = ((0.4, 0.2), (0.6, 0.9))  # plain's and gpuenv's selection, other benchmarking
    for r, (select_s, other_s), calls in zip(hot, spent, (2, 3), strict=True):  # since 2026-11
        r.update(select_wall_s=select_s, other_bench_s=other_s, other_bench_calls=calls)
    hot[1].update(capture_s=0.1, rank_wall_s=0.35)  # gpuenv's selection, split
    inductor_rank.report(rows + hot, careful)
    out = capsys.readouterr().out
    assert "| gpuenv | rested | 2 | 1 | mm (100%) | 1 | 2 (50%) | 0.00% | 0.00% | 25.0 s |" in out
    assert "| gpuenv | hot | 1 | 1 | mm (100%) | 0 | 1 (100%) | 0.00% | 0.00% | 33.0 s |" in out
    assert "| plain | hot | 1 | 1 | triton_mm_1 BLOCK_M=128 (100%) | 0 | 1 (100%) | 0.50% |" in out
    assert "Hot, gpuenv's compile wall is 1.10x plain Inductor's." in out
    assert "| 0.00% | 33.0 s | 0.60 s | 0.90 s | 200.0 us (0.0%) |" in out
    assert "| 0.00% | 25.0 s | - | - | 201.0 us (1.0%) |" in out  # rows kept before
    assert (
        "Its selection's benchmarking (Inductor's own, or gpuenv's ranking) took 1.50x "
        "plain's; the benchmarking after it, which the choice made brings, 0.90 s against "
        "0.20 s (300.0 ms a call against 100.0)." in out
    )
    assert (
        "gpuenv's selection (hot), medians: the ranking 0.35 s, Inductor's pass handing over each "
        "choice's work 0.10 s, the rest (the ranking's opening) 0.15 s." in out
    )
    assert out.count("gpuenv's selection (") == 1  # rested rows do not split it
    assert "2 choices within 3% of the best (mm)." in out
    assert "| mm | 200.0 us | 199.0-205.0 us | +0.00% |" in out
    assert inductor_rank._timed("gpuenv hot 2/10", lambda: {"winner": "mm"}) == {"winner": "mm"}
    assert "inductor_rank: gpuenv hot 2/10: " in capsys.readouterr().err  # how far it got
    parts = {"parts_s": {"start": 7.04, "compile": 4.5, "bench": 1.26}}
    assert inductor_rank._timed("plain rested 1/5", lambda: parts) == parts
    err = capsys.readouterr().err  # and where a process's time went
    assert err.endswith(" s, start 7.0 s, compile 4.5 s, bench 1.3 s\n"), err
    assert "1 other choices had a pass as fast as one of the best's (199.0-205.0 us)" in out
    assert "plain, rested: 1 winners the careful run did not time" in out
    assert "Rested, gpuenv's compile wall is 1.19x plain Inductor's." in out
    # rows kept since the screen, and since the ranking's wall was split: its calls' waits
    # for a ready GPU (hot: for the cap to clear) said beside the screen
    from benchmarks.autotune_rank import WAIT

    hot[1].update(screen_wall_s=0.03, rank_parts={WAIT: 0.3, "measure": 0.02})
    inductor_rank.report(rows + hot, careful)
    out = capsys.readouterr().out
    assert "the ranking 0.35 s (its screen 30 ms, waiting for a ready GPU 300 ms), " in out
    inductor_rank.report([hot[1]], careful)  # gpuenv's rows alone: split, no ratio
    out = capsys.readouterr().out
    assert "gpuenv's selection (hot), medians: the ranking 0.35 s (its screen" in out
    assert "plain Inductor's" not in out


def test_a_report_that_prints_a_fence_stays_inside_its_own():
    result = {
        "name": "t",
        "title": "t",
        "command": "python -m benchmarks.t",
        "date": "2026-11-24",
        "machine": {"text": "a machine"},
        "gpu": "none",
        "transcribed": "a test",
        "blocks": [{"text": "before\n```\ninner\n```\nafter"}],
    }
    lines = report.section(result)
    start = lines.index("````text")
    assert lines[start + 1] == "before\n```\ninner\n```\nafter" and lines[start + 2] == "````"


@pytest.mark.parametrize(
    ("key", "data", "tabled"),
    [
        ("dropin", "bench_dropin-2026-11-24b.json", "dropin"),
        ("tiny-cupti", "probe_tiny_cupti-2026-11-24.json", "tiny"),
        ("hot_wait", "hot_wait-2026-11-24.json", "hot_wait"),
    ],
)
def test_a_result_tabled_from_kept_data_is_what_its_benchmark_tables_from_it(key, data, tabled):
    # the H100 runs of the moved scripts are kept as raw data in docs/h100/; the results
    # say "tabled by benchmarks.<name>": the benchmark's own table of that data, cell for cell
    module = importlib.import_module(f"benchmarks.{tabled}")
    raw = json.loads((runner.ROOT / "docs" / "h100" / data).read_text())
    if key == "dropin":
        rows = {"kernels": raw["kernels"], "skipped": raw["skipped"]}
        text = module.table(rows, raw["summary"], "t")
    elif key == "tiny-cupti":
        rows = [{**r, "way": r["method"], "per_call_s": r["median_us"] / 1e6} for r in raw["rows"]]
        text = "\n".join(module.cupti_table(rows))
    else:
        text = "\n".join(module.table(raw["rows"]))
    kept = json.loads((runner.RESULTS / f"{key}.json").read_text())
    assert f"tabled by benchmarks.{tabled}" in kept["transcribed"]
    tables = [b["table"] for b in runner.parse_blocks(text) if "table" in b]
    assert tables and tables[0] == next(b["table"] for b in kept["blocks"] if "table" in b)


def test_tiny_and_dropin_judge_what_they_measured():
    from benchmarks import dropin, tiny

    rows = [
        {"kernel": "k", "way": w, "state": s, "per_call_s": v, "wall_s": 0.5}
        for w, base in (("cupti", 2e-6), ("default", 2.2e-6), ("burst", 2.2e-6), ("graph", 2.4e-6))
        for s, v in (("cold", base), ("hot", base * 1.02))
    ]
    line = tiny.cupti_table(rows)[2]
    assert line.startswith("| k | 2.02 | 2.22 (+10.0%) | 2.22 (+0.0%) | 2.42 | +2.00% | 0.50 |")
    calls = {
        "cold": [{"ms": 1.0, "wall_s": 0.1, "verdict": "ok", "findings": []}],
        "hot": [{"ms": 1.05, "wall_s": 0.4, "verdict": "ok", "findings": []}],
    }
    triton = {"cold": [{"ms": 1.0, "wall_s": 0.1}], "hot": [{"ms": 1.2, "wall_s": 0.1}]}
    summary = dropin.summarize({"kernels": {"k": {"what": "", "gpuenv": calls, "triton": triton}}})
    g = summary["k"]["gpuenv"]
    assert g["gap"] == pytest.approx(0.05 / 1.025) and not g["gap_met"]  # 4.9% > 1%
    assert g["wall_ratio_hot"] == pytest.approx(4.0) and not g["wall_met"]  # over 3x


def test_the_sampler_benchmark_s_hodges_lehmann_and_its_interval():
    from benchmarks.sampler_overhead import hodges_lehmann

    # one wild value moves the mean by 19 and the estimate not at all (the median of the 15
    # pairwise means stays 3: only the 5 means with the wild value grow)
    assert hodges_lehmann([1.0, 2.0, 3.0, 4.0, 5.0])[0] == 3.0
    assert hodges_lehmann([1.0, 2.0, 3.0, 4.0, 100.0])[0] == 3.0
    # symmetric values about 0.01: the estimate is the centre, and the interval holds it and
    # narrows as the values grow in number
    values = [0.01 + d for d in (-0.03, -0.02, -0.01, 0.0, 0.01, 0.02, 0.03)] * 4
    est, lo, hi = hodges_lehmann(values)
    assert est == pytest.approx(0.01) and lo < 0.01 < hi
    _, lo4, hi4 = hodges_lehmann(values * 4)
    assert lo < lo4 < 0.01 < hi4 < hi


def test_models_side_names_its_results_by_the_gpu_model_and_judges_each_tool(
    tmp_path: Path, monkeypatch
):
    from benchmarks import models_side

    assert models_side.model_key("NVIDIA H200") == "h200"
    assert models_side.model_key("NVIDIA H100 80GB HBM3") == "h100"
    assert models_side.model_key("NVIDIA A100-SXM4-80GB") == "a100"
    assert models_side.model_key("NVIDIA L40S") == "l40s"
    assert models_side.model_key("NVIDIA GeForce RTX 4090") == "4090"
    # gap and wall ratios per kernel and tool, then the worst and median per tool
    calls = {
        "do_bench": ([(1.0, 0.1), (1.0, 0.1)], [(1.2, 0.1), (1.2, 0.1)]),
        "bench": ([(1.0, 0.1), (1.0, 0.3)], [(1.01, 0.4), (1.01, 0.4)]),
        "dropin": ([(1.0, 0.2)], [(1.0, 0.2)]),
        "stable": ([(1.0, 0.1)], [(1.05, 0.6)]),
    }
    runs = {
        k: {
            tool: {
                state: [
                    {"s": s * scale, "wall_s": w, "verdict": "ok", "findings": []} for s, w in got
                ]
                for state, got in zip(("cold", "hot"), both, strict=True)
            }
            for tool, both in calls.items()
        }
        for k, scale in (("a", 1.0), ("b", 2.0))
    }
    runs["b"]["stable"]["hot"][0]["s"] = 2.0  # b's session: no gap at all
    summary = models_side.summarize(runs)
    assert summary["a"]["do_bench"]["gap"] == pytest.approx(0.2 / 1.1)
    assert summary["a"]["bench"]["wall_cold_s"] == pytest.approx(0.2)  # the median of two
    assert summary["a"]["bench"]["ratio_hot"] == pytest.approx(4.0)
    tools = models_side.per_tool(summary)
    assert tools["stable"]["worst_kernel"] == "a" and tools["stable"]["worst_gap"] == (
        pytest.approx(0.05 / 1.025)
    )
    assert tools["stable"]["median_gap"] == pytest.approx(0.05 / 1.025 / 2)
    assert tools["stable"]["median_ratio_hot"] == pytest.approx(6.0)
    assert tools["dropin"]["worst_gap"] == 0.0 and tools["do_bench"]["median_ratio_cold"] == 1
    # a run on a simulated H200: its results file is the H200's, and says so
    monkeypatch.setenv("GPUENV_BACKEND", "sim")  # restored after (the runner sets it)
    monkeypatch.setenv("GPUENV_SIM_PROFILE", "h100")  # the run sets the one it measured
    out = tmp_path / "r.json"
    argv = ["--sim", "--sim-profile", "h200", "--quick", "--kernels", "cumsum_16m"]
    rc = runner.main(
        "models_side",
        models_side.__doc__,
        models_side.add_arguments,
        models_side.run,
        variant=lambda args: args.model,
        argv=[*argv, "--out", str(out)],
    )
    record = json.loads(out.read_text())
    assert rc == 0 and record["key"] == "models_side-h200-sim"
    assert record["gpu"] == "simulated NVIDIA H200" and record["args"]["model"] == "h200"
    rows = next(b["table"]["rows"] for b in record["blocks"] if "table" in b)
    assert [r[1] for r in rows] == list(models_side.TOOLS)
    assert set(record["metrics"]) >= {"bench/worst_gap_pct", "stable/wall_ratio_hot"}
    with pytest.raises(SystemExit, match="add --sim"):
        models_side.run(
            argparse.Namespace(sim=False, sim_profile="h200", kernels="cumsum_16m", repeats=1)
        )


def test_call_levels_tables_each_kernel_s_calls_and_their_upper_level():
    from benchmarks import call_levels

    low, high = 8.38e-6, 9.18e-6  # the H200's two levels of the 1024^3 mm (issue 43)
    s = call_levels.summarize([low, high, low, low])
    assert s["min_s"] == low and s["max_s"] == high and s["median_s"] == low
    assert s["spread"] == pytest.approx(high / low - 1) and s["upper_share"] == 0.25
    steady = call_levels.summarize([6.0e-6, 6.1e-6, 6.05e-6])  # within 3%: no upper level
    assert steady["upper_share"] == 0.0
    lines = call_levels.table({("mm", "events"): [low, high], ("mm", "profiler"): [6e-6] * 2})
    assert lines[2] == "| mm | events | 2 | 8.38 us | 8.78 us | 9.18 us | 9.5% | 50% |"
    assert lines[3].endswith("| 0.0% | 0% |")


def inductor_rank_main(argv: list[str]) -> int:
    """`python -m benchmarks.inductor_rank ARGV` as its __main__ runs it, in this process."""
    from benchmarks import inductor_rank, runner

    return runner.main(
        "inductor_rank",
        inductor_rank.__doc__,
        inductor_rank.add_arguments,
        inductor_rank.run,
        variant=inductor_rank._variant,
        gpu=inductor_rank._rows_gpu,
        argv=argv,
    )


def test_inductor_rank_joins_the_rows_of_earlier_calls_and_refuses_another_selections(
    tmp_path, capsys
):
    # 20 processes a tuner take more than one device call: each call keeps its rows
    # (--rows-out) and a later one reports them together (--rows-in; --processes 0: only)
    import argparse
    import json

    from benchmarks import inductor_rank

    sel = {"op": "mm_relu", "size": "1024x1024x1024", "dtype": "float16"}
    careful = {"mode": "careful", **sel, "selection": "mm", "gpu": "H200", "torch": "2.9"}

    def rows(first_ms: float, winners: list[str]) -> list[dict]:
        out = [{**careful, "ms": {"mm": first_ms, "triton_mm_12": 0.0086}}]
        for w in winners:
            out.append(
                {"mode": "gpuenv", "state": "rested", **sel, "winner": w, "tied": []}
                | {"compile_wall_s": 30.0, "compiled_s": 9e-6}
            )
        return out

    keep = inductor_rank._keeper(str(tmp_path / "one.jsonl"))
    for r in rows(0.0085, ["mm", "mm"]):
        assert keep(r) == r
    (tmp_path / "two.jsonl").write_text(
        "\n".join(json.dumps(r) for r in rows(0.0087, ["triton_mm_12"])) + "\n\n"
    )
    args = argparse.Namespace(sim=False, processes=0, rows_out=None, scan=None, **sel)
    args.rows_in = [str(tmp_path / "one.jsonl"), str(tmp_path / "two.jsonl")]
    assert inductor_rank.run(args) == 0
    out = capsys.readouterr().out
    assert "Rows of 2 earlier call(s) joined; regret against the first's" in out
    # the first call's careful times: mm 8.5 us the best; the second call's (8.7) unused
    assert "| mm | 8.5 us | - | +0.00% |" in out
    assert "| gpuenv | rested | 3 | 2 | mm (67%) | 0 | 2 (67%) | 0.00% | 1.18% |" in out
    # the results name the GPU the rows were measured on, not the machine joining them
    want = "H200 (rows of earlier calls; the machine is where they were joined)"
    assert inductor_rank._rows_gpu(args) == want
    assert inductor_rank._rows_gpu(argparse.Namespace(**{**vars(args), "processes": 2})) is None

    joined = tmp_path / "joined.json"
    argv = ["--processes", "0", "--op", "mm_relu", "--size", "1024x1024x1024"]
    argv += ["--rows-in", args.rows_in[0], "--out", str(joined)]
    rc = inductor_rank_main(argv)
    record = json.loads(joined.read_text())
    assert rc == 0 and record["gpu"] == want
    assert record["key"] == "inductor_rank-mm_relu-1024x1024x1024-float16-joined"
    with pytest.raises(SystemExit, match="hold no careful row"):
        (tmp_path / "none.jsonl").write_text(json.dumps(rows(0.0085, ["mm"])[1]) + "\n")
        inductor_rank.run(
            argparse.Namespace(**{**vars(args), "rows_in": [str(tmp_path / "none.jsonl")]})
        )

    capsys.readouterr()

    (tmp_path / "other.jsonl").write_text(json.dumps({**rows(0.0085, [])[0], "size": "2048"}))
    args.rows_in = [str(tmp_path / "other.jsonl")]
    with pytest.raises(SystemExit, match=r"rows of mm_relu 2048 float16, not mm_relu 1024x"):
        inductor_rank.run(args)
    # Inductor's GEMM backends are part of the selection: rows of two are not joined
    (tmp_path / "triton.jsonl").write_text(
        json.dumps({**rows(0.0085, [])[0], "backends": "TRITON"})
    )
    args.rows_in = [str(tmp_path / "one.jsonl"), str(tmp_path / "triton.jsonl")]
    with pytest.raises(SystemExit, match=r"GEMM backends ATEN,TRITON,CPP and TRITON: join"):
        inductor_rank.run(args)
    args.rows_in = [str(tmp_path / "missing.jsonl")]
    with pytest.raises(SystemExit, match=r"--rows-in .*missing.jsonl: No such file"):
        inductor_rank.run(args)
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    args.rows_in = [str(tmp_path / "bad.jsonl")]
    with pytest.raises(SystemExit, match=r"bad.jsonl:1: not a row"):
        inductor_rank.run(args)
    full = inductor_rank._keeper("/dev/full")  # a write that fails: said once, row returned
    assert full({"a": 1}) == {"a": 1} and full({"b": 2}) == {"b": 2}
    assert capsys.readouterr().err.count("--rows-out /dev/full: ") == 1


def test_inductor_rank_with_no_processes_and_no_rows_times_a_shapes_choices_alone(
    tmp_path, capsys, monkeypatch
):
    """`--processes 0` without `--rows-in`: the careful process alone, to find a shape whose
    best choices are close; no tuner runs, and no tuners' table is printed."""
    import argparse

    from benchmarks import inductor_rank

    sel = {"op": "mm_relu", "size": "2048x2048x2048", "dtype": "float16"}
    ran: list[str] = []

    def child(mode, args, cache, state="rested"):
        ran.append(mode)
        ms = {"mm": 0.0500, "triton_mm_3": 0.0507, "triton_mm_1": 0.0700}
        return {"mode": mode, **sel, "selection": "mm", "gpu": "H200", "torch": "2.9", "ms": ms}

    monkeypatch.setattr(inductor_rank, "child", child)
    args = argparse.Namespace(
        sim=False,
        processes=0,
        scan=None,
        rows_in=None,
        rows_out=None,
        triton_cache=str(tmp_path / "t"),
        states="rested,hot",
        hot_s=7.0,
        **sel,
    )
    assert inductor_rank.run(args) == 0 and ran == ["careful"]
    out = capsys.readouterr().out
    assert "| triton_mm_3 | 50.7 us | - | +1.40% |" in out
    assert "2 choices within 3% of the best (mm)." in out and "| tuner |" not in out


def test_inductor_rank_scan_lines_up_shapes_by_how_close_their_best_choices_are(tmp_path, capsys):
    """`--scan`: the careful rows of `--processes 0` calls on several selections, one line
    each, the closest runner-up first, by device time where the row has it; tuner rows are
    passed over, a file with no careful row refused."""
    import argparse
    import json

    from benchmarks import inductor_rank

    def careful(size: str, ms: dict, device_ms: dict | None = None) -> dict:
        row = {"mode": "careful", "op": "mm_relu", "size": size, "dtype": "float16"}
        return (
            row
            | {"selection": "mm", "gpu": "H200", "torch": "2.9", "ms": ms}
            | ({"device_ms": device_ms} if device_ms else {})
        )

    far = careful("2048", {"mm": 0.050, "triton_mm_1": 0.060, "triton_mm_2": 0.0612})
    # events read t1 1% behind, CUPTI 8%: the device time decides
    close = careful("1024", {"mm": 0.0100, "t1": 0.0101}, {"mm": 0.0060, "t1": 0.00648})
    near = careful("512", {"mm": 0.0040, "t1": 0.00402, "t2": 0.00405})
    near["backends"] = "TRITON"  # TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS: cuBLAS left out
    far["backends"] = inductor_rank.DEFAULT_BACKENDS  # said only where not the default
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    one.write_text(json.dumps(far) + "\n" + json.dumps({"mode": "plain", "winner": "t1"}) + "\n")
    two.write_text(json.dumps(close) + "\n\n" + json.dumps(near) + "\n")
    out_json = tmp_path / "scan.json"
    argv = ["--scan", str(one), "--scan", str(two), "--out", str(out_json)]
    rc = inductor_rank_main(argv)
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| mm_relu")]
    assert lines == [  # the last column: among the Triton templates (triton_*) alone
        "| mm_relu 512 float16, backends TRITON | 3 | mm | t1 | +0.50% | 3 | - |",
        "| mm_relu 1024 float16 | 2 | mm | t1 | +8.00% | 1 | - |",
        "| mm_relu 2048 float16 | 3 | mm | triton_mm_1 | +20.00% | 1 | +2.00% |",
    ]
    assert "Among the Triton templates alone, the closest is mm_relu 2048 float16: its " in out
    assert "3 selections scanned (H200, torch 2.9;" in out
    assert "the closest, mm_relu 512 float16, backends TRITON, has its runner-up 0.50%" in out
    assert "1 of 3 have a second choice within 3%." in out
    record = json.loads(out_json.read_text())
    assert rc == 0 and record["key"] == "inductor_rank-scan"
    assert record["gpu"].startswith("H200 (rows of earlier calls")
    assert record["metrics"]["closest runner-up behind the best"]["value"] == pytest.approx(0.5)
    (tmp_path / "none.jsonl").write_text(json.dumps({"mode": "plain"}) + "\n")
    with pytest.raises(SystemExit, match="hold no careful row"):
        inductor_rank.scan([str(tmp_path / "none.jsonl")])
    with pytest.raises(SystemExit, match=r"--scan .*missing.jsonl: No such file"):
        inductor_rank.scan([str(tmp_path / "missing.jsonl")])
    with pytest.raises(SystemExit, match="leave out --rows-in/--rows-out"):
        inductor_rank.run(argparse.Namespace(sim=False, scan=[str(one)], rows_in=[str(one)]))


def test_inductor_rank_runs_no_careful_process_when_a_kept_triton_cache_is_filled(
    tmp_path, monkeypatch, capsys
):
    # a later device call joins the first's careful row; with the Triton cache the first
    # filled (--triton-cache, kept on the warm machine) it spends no minute on its own
    import argparse
    import json

    from benchmarks import inductor_rank

    sel = {"op": "mm_relu", "size": "1024x1024x1024", "dtype": "float16"}
    careful = {"mode": "careful", **sel, "selection": "mm", "gpu": "H200", "torch": "2.9"}
    careful["ms"] = {"mm": 0.0085, "triton_mm_12": 0.0086}
    ran: list[tuple[str, Path]] = []

    def child(mode, args, cache, state="rested"):
        ran.append((mode, cache))
        (cache / f"{mode}.so").write_text("kernel")  # what a process leaves in the cache
        if mode == "careful":
            return careful
        return {"mode": mode, "state": state, **sel, "winner": "mm", "tied": []} | {
            "compile_wall_s": 30.0,
            "compiled_s": 9e-6,
        }

    monkeypatch.setattr(inductor_rank, "child", child)
    kept = tmp_path / "triton"
    first = tmp_path / "one.jsonl"
    args = argparse.Namespace(
        sim=False, processes=1, states="rested", rows_in=None, scan=None, **sel
    )
    args.rows_out, args.triton_cache, args.tuners = str(first), str(kept), "plain,gpuenv"
    assert inductor_rank.run(args) == 0
    assert [m for m, _ in ran] == ["careful", "plain", "gpuenv"]
    assert {c for _, c in ran} == {kept} and (kept / "careful.so").exists()  # left after

    ran.clear()
    args.rows_in, args.rows_out = [str(first)], None
    assert inductor_rank.run(args) == 0
    assert [m for m, _ in ran] == ["plain", "gpuenv"]  # no careful process of its own
    assert "| gpuenv | rested | 2 |" in capsys.readouterr().out

    # gpuenv's ranking without the wait for a ready GPU: a tuner of its own, said apart
    ran.clear()
    args.tuners = "plain,gpuenv,gpuenv-nowait"
    assert inductor_rank.run(args) == 0
    assert [m for m, _ in ran] == ["plain", "gpuenv", "gpuenv-nowait"]
    out = capsys.readouterr().out
    assert "| gpuenv | rested | 2 |" in out and "| gpuenv-nowait | rested | 1 |" in out
    assert "Rested, gpuenv-nowait's compile wall is 1.00x plain Inductor's." in out
    with pytest.raises(argparse.ArgumentTypeError, match="unknown tuners"):
        inductor_rank._tuner_list("plain,fast")
    args.tuners = "plain,gpuenv"

    ran.clear()  # an empty cache: the careful process fills it, its row not the reference
    args.triton_cache = str(tmp_path / "empty")
    assert inductor_rank.run(args) == 0
    assert [m for m, _ in ran] == ["careful", "plain", "gpuenv"]
    ran.clear()  # no kept cache: a temporary one, a careful process to fill it
    args.triton_cache = None
    assert inductor_rank.run(args) == 0
    assert ran[0][0] == "careful" and ran[0][1] != kept
    assert json.loads(first.read_text().splitlines()[0])["mode"] == "careful"

    (tmp_path / "file").write_text("")
    args.triton_cache = str(tmp_path / "file" / "triton")
    with pytest.raises(SystemExit, match=r"--triton-cache .*file/triton: Not a directory"):
        inductor_rank.run(args)


def test_inductor_rank_names_a_joined_report_for_what_it_holds(tmp_path, monkeypatch):
    from benchmarks import inductor_rank

    monkeypatch.delenv("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS", raising=False)
    args = argparse.Namespace(op="mm_relu", size="1024x1024x1024", dtype="float16", scan=None)
    args.states, args.rows_in, args.processes = "rested,hot", None, 2
    assert inductor_rank._variant(args) == "mm_relu-1024x1024x1024-float16"
    args.states = "hot"
    assert inductor_rank._variant(args) == "mm_relu-1024x1024x1024-float16-hot"
    row = {"mode": "careful", "op": "mm_relu", "size": "1024x1024x1024", "dtype": "float16"}
    rows = tmp_path / "rows-r.jsonl"
    rows.write_text(json.dumps({**row, "backends": "ATEN,TRITON,CPP"}) + "\n")
    args.rows_in = [str(rows)]  # its rows may be rested: not "-hot"
    assert inductor_rank._variant(args) == "mm_relu-1024x1024x1024-float16-joined"
    args.processes, args.rows_in = 0, None  # the careful process alone
    assert inductor_rank._variant(args) == "mm_relu-1024x1024x1024-float16-careful"
    # Inductor's GEMM backends other than its default: another selection, a file of its own
    monkeypatch.setenv("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS", "triton")
    assert inductor_rank._variant(args) == "mm_relu-1024x1024x1024-float16-triton-careful"
    monkeypatch.delenv("TORCHINDUCTOR_MAX_AUTOTUNE_GEMM_BACKENDS")
    rows.write_text(json.dumps({**row, "backends": "ATEN,TRITON"}) + "\n")
    args.rows_in, args.processes = [str(rows)], 0  # the rows' backends, not this shell's
    assert inductor_rank._variant(args) == "mm_relu-1024x1024x1024-float16-aten+triton-joined"


def test_inductor_rank_judges_regret_by_device_time_where_the_careful_run_has_it(capsys):
    # a few-us kernel's events time sits at one of two levels: where the careful row has
    # each choice's device time from CUPTI, the table shows it and regret is against it
    from benchmarks import inductor_rank

    careful = {"mode": "careful", "op": "mm_relu", "size": "1024x1024x1024"}
    careful.update(dtype="float16", selection="mm", gpu="H200", torch="2.11")
    careful["ms"] = {"mm": 0.0093, "triton_mm_12": 0.0090}  # by events: mm at its high level
    careful["passes_ms"] = {"mm": [0.0085, 0.0093, 0.0093], "triton_mm_12": [0.0090] * 3}
    careful["device_ms"] = {"mm": 0.00605, "triton_mm_12": 0.0065}
    rows = [
        {"mode": m, "winner": w, "tied": [], "compile_wall_s": 5.0, "compiled_s": 2e-5}
        for m, w in (("plain", "triton_mm_12"), ("gpuenv", "mm"))
    ]
    inductor_rank.report(rows, careful)
    out = capsys.readouterr().out
    assert "| choice | careful time | its passes | device time (CUPTI) | against the best |" in out
    assert "| mm | 9.3 us | 8.5-9.3 us | 6.05 us | +0.00% |" in out
    assert "| triton_mm_12 | 9.0 us | 9.0-9.0 us | 6.50 us | +7.44% |" in out
    assert "Regret is against each choice's device time from CUPTI" in out
    assert "| plain | rested | 1 | 1 | triton_mm_12 (100%) | 0 | 1 (100%) | 7.44% | 7.44% |" in out
    assert "| gpuenv | rested | 1 | 1 | mm (100%) | 0 | 1 (100%) | 0.00% | 0.00% |" in out


def test_rank_tiny_tables_each_methods_decisions_regret_and_wall(capsys):
    # few-us candidates ranked by events (the ranking before) and by CUPTI (the default
    # under TINY_REP_S), against each candidate's device time
    from benchmarks import rank_tiny

    device = {"mm K=1024": 6.05e-6, "mm K=1024, another callable": 6.06e-6}
    device |= {"mm K=1056": 6.3e-6, "mm K=1088": 6.5e-6}
    tie = ["mm K=1024", "mm K=1024, another callable"]

    def ranking(how, winner, tied, wall_s, calls=10):
        return {"how": how, "winner": winner, "tied": tied, "rounds": 6, "calls": calls} | {
            "wall_s": wall_s,
            "method": "CUPTI device time" if how == "cupti" else "events",
        }

    rows = [
        ranking("events", "mm K=1024", ["mm K=1024"], 0.40),
        ranking("events", "mm K=1056", ["mm K=1056"], 0.50),  # the mm met its high level
        ranking("cupti", "mm K=1024", tie, 0.60) | {"events_offset_s": 2.5e-6},
        ranking("cupti", "mm K=1024", tie, 0.70) | {"events_offset_s": 3.5e-6},
    ]
    rank_tiny.report(rows, device)
    out = capsys.readouterr().out
    assert "| mm K=1056 | 6.30 us | +4.13% |" in out
    assert "| events | 2 | 2 | mm K=1024 (50%) | 0 | 2 (50%) | 2.07% | 4.13% | 0.45 s |" in out
    assert "| cupti | 2 | 1 | mm K=1024 (100%) | 2 | 1 (100%) | 0.00% | 0.00% | 0.65 s |" in out
    assert "65.0 ms | 6 | 3.00 us |" in out  # a call: 0.65 s / 10; the offsets' median
    assert "| 45.0 ms | 6 | 0.00 us |" in out  # by events: nothing added
    assert "By the default, the calls timed: CUPTI device time." in out
    assert "A ranking by CUPTI took 1.44x one by events." in out


def test_inductor_waits_reports_each_selections_wait_in_the_order_ranked(capsys):
    from benchmarks import inductor_waits

    def row(state, waits):
        sels = [
            {
                "key": ["1024x1024 float16", "1024x1024 float16"],
                "choices": 20,
                "wall_s": 0.2 + w,
                "waited_s": w,
                "winner": "mm",
                "rounds": 2,
                "ranking_s": 0.1 + w,
            }
            for w in waits
        ]
        return {"state": state, "selections": sels, "torch": "2.11", "gpu": "NVIDIA H200"}

    rows = [
        row("rested", [0.001, 0.001, 0.0]),
        row("hot", [0.27, 0.008, 0.005]),
        row("rested", [0.002, 0.0, 0.0]),
        row("hot", [0.41, 0.004, 0.006]),
    ]
    inductor_waits.report(rows, 7.0)
    out = capsys.readouterr().out
    assert (
        "| hot | 1: 1024x1024 float16 x 1024x1024 float16 | 20 | 2 | 0.54 s | 340 ms, 410 ms" in out
    )
    assert (
        "the first ranking waited 340 ms (median) for a ready GPU, the later ones 6 ms, 6 ms" in out
    )
    assert inductor_waits.run(argparse.Namespace(sim=True, processes=1, hot_s=7.0)) == 2


def test_inductor_calls_times_the_switch_s_call_and_the_waiting_one_alike(capsys, monkeypatch):
    from benchmarks import inductor_calls

    monkeypatch.setenv("GPUENV_BACKEND", "sim")
    monkeypatch.setenv("GPUENV_SAMPLER", "process")  # run() sets these: put back after
    monkeypatch.setenv("GPUENV_SIM_PROFILE", "h200")
    assert inductor_calls.run(argparse.Namespace(calls=2, sim=True)) == 0
    out = capsys.readouterr().out
    assert "10 calls a variant in blocks of 10" in out  # whole blocks
    assert "| the switch's call (no wait for the counter read) |" in out
    assert "| the same call, waiting for the counter read |" in out
    assert "| the switch's call, its check as before (samples since bench opened) |" in out
    assert re.search(r"The switch's call took \d+\.\d\dx the waiting one's wall, \d", out)
    from gpuenv.integrations.triton import bench as dropin
    from gpuenv.timing import harness

    own, interval = dropin._bench, harness.READY_LOOKBACK_S
    with inductor_calls._old_check():  # the old check: bench opened with no lead, no lookback
        assert dropin._bench is not own
        assert harness.READY_LOOKBACK_S == 0.0
    assert dropin._bench is own  # put back
    assert interval == harness.READY_LOOKBACK_S
    with pytest.raises(SystemExit, match="at least 1"):
        inductor_calls.run(argparse.Namespace(calls=0, sim=True))


def test_rank_hot_ranks_each_case_rested_hot_and_hot_without_the_wait(capsys):
    from benchmarks import rank_hot

    args = argparse.Namespace(rankings=1, cases="inductor", hot_s=7.0, noise=0.01)
    args.gpu_profile = "h200"
    assert rank_hot.run(args) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()]
    got = {r[1]: r for r in rows if len(r) > 6 and r[0] == "| inductor"}
    assert list(got)[:3] == list(rank_hot.VARIANTS)
    waited = {v: got[v][6] for v in rank_hot.VARIANTS}  # the default waits hot, only it
    assert waited[rank_hot.VARIANTS[0]] == "0 ms |" and waited[rank_hot.VARIANTS[2]] == "0 ms |"
    assert waited[rank_hot.VARIANTS[1]] != "0 ms |"
    assert rank_hot.run(argparse.Namespace(**{**vars(args), "cases": "nope"})) == 2
