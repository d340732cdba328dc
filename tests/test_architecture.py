"""The layout's rules, read from the source (AST): no import circles, modules a person
reads in one sitting, and the heavy or dangerous imports in their one place.

- No circles among the imports that run when a module is imported (module level,
  `if`/`try`/`with` blocks and class bodies included), and none either when the
  imports inside functions and under `if TYPE_CHECKING:` are counted too: those run
  later or never, so they cannot make a circle at import time, but a circle through
  them is still two modules that each need the other (a circle in the design).
- No module over MAX_LINES lines (a sanity bound: modules are split by concept, and
  `ruff format` decides how lines look), no function over MAX_FUNCTION_LINES, except
  the ones listed below, which are still to be split: the lists only shrink.
- Imports go down the layers of docs/ARCHITECTURE.md (LAYERS), or sideways within
  one, never up.
- torch is imported only by gpuenv/timing/cuda/ and gpuenv/integrations/;
  pynvml only by gpuenv/backend/nvml*.py.
"""

from __future__ import annotations

import ast
import functools
import tokenize
from collections.abc import Iterator, Mapping
from pathlib import Path

import gpuenv

PACKAGE = Path(gpuenv.__file__).parent
MAX_LINES = 800
MAX_FUNCTION_LINES = 80

# Modules still over MAX_LINES, with who splits them. Empty it; never add to it.
TOO_LONG_MODULES: set[str] = set()
# Functions still over MAX_FUNCTION_LINES ("module.py:function"), with who splits them.
# Empty it; never add to it.
TOO_LONG_FUNCTIONS: set[str] = set()
# docs/ARCHITECTURE.md's layers, top first: a module (or package) of one imports only
# from its own layer or those below. A new module goes into one of them here and there.
LAYERS = (
    # what a person runs and looks at
    (
        "gpuenv.__main__",
        "gpuenv.cli",
        "gpuenv.integrations",
        "gpuenv.monitor",
        "gpuenv.status",
        "gpuenv.doctor",
        "gpuenv.check",
        "gpuenv.compare",
        "gpuenv.plot",
        "gpuenv.demo",
        "gpuenv.ops",
    ),
    # the doors to a measurement; calibration measures a sustained load, so it sits
    # here although it lives in clocks/
    (
        "gpuenv.timing",
        "gpuenv.session",
        "gpuenv.run",
        "gpuenv.clocks.calibration",
        "gpuenv.daemon.jobreport",
    ),
    # the measurement core
    (
        "gpuenv.judge",
        "gpuenv.completion",
        "gpuenv.conditioning",
        "gpuenv.verdict",
        "gpuenv.stats",
        "gpuenv.results",
        "gpuenv.phases",
        "gpuenv.environment",
        "gpuenv.seams",
    ),
    # telemetry and locks
    ("gpuenv.telemetry", "gpuenv.locking", "gpuenv.clocks", "gpuenv.daemon"),
    # the GPU
    ("gpuenv.backend", "gpuenv.devices"),
    # vocabulary
    (
        "gpuenv.reasons",
        "gpuenv.units",
        "gpuenv.table",
        "gpuenv.errors",
        "gpuenv.timebase",
        "gpuenv._records",
        "gpuenv._lazy",
        "gpuenv._files",
        "gpuenv.validate",
        "gpuenv.reader",
        "gpuenv.progress",
    ),
)
TORCH_IMPORTERS = ("timing/cuda/*.py", "integrations/*.py")
PYNVML_IMPORTERS = ("backend/nvml*.py",)


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_nodes(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements that run when the module is imported (not function bodies)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield node
        if isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_time_nodes(node.body)
            yield from _import_time_nodes(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from _import_time_nodes(block)
            for handler in node.handlers:
                yield from _import_time_nodes(handler.body)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _import_time_nodes(node.body)


def _imported(node: ast.stmt, module: str, is_package: bool, known: Mapping[str, Path]) -> set[str]:
    """The modules of `known` that an import statement names (a from-import of a
    submodule names the submodule; of anything else, the module it comes from)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in known}
    if not isinstance(node, ast.ImportFrom):
        return set()
    base = node.module or ""
    if node.level:
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[: len(parts) - node.level + 1]
        base = ".".join([*parts, base] if base else parts)
    out = set()
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        out.add(sub if sub in known else base)
    return {m for m in out if m in known}


def import_graph(*, lazy: bool = False) -> dict[str, set[str]]:
    """Module -> the package's modules it imports at import time (`lazy`: anywhere)."""
    known = _modules()
    graph = {}
    for module, path in known.items():
        tree = _tree(path)
        is_package = path.name == "__init__.py"
        deps: set[str] = set()
        nodes = ast.walk(tree) if lazy else _import_time_nodes(tree.body)
        for node in nodes:
            deps |= _imported(node, module, is_package, known)
        graph[module] = deps - {module}
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _rel(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _imports_anywhere(path: Path, top: str) -> bool:
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == top for a in node.names):
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").split(".")[0] == top
        ):
            return True
    return False


# -- the checks --------------------------------------------------------------------------


def test_the_cycle_finder_finds_circles_and_only_circles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_import_graph_sees_from_imports_of_submodules_and_skips_function_imports():
    graph = import_graph()
    assert "gpuenv.timing.devices" in graph["gpuenv.timing.cuda.events"]  # from ... import Rep
    assert "gpuenv.stats" in graph["gpuenv.timing.cuda.events"]  # from gpuenv import stats
    # gpuenv.run.region imports gpuenv.errors only inside region.__init__
    assert "gpuenv.errors" not in graph["gpuenv.run.region"]
    assert "gpuenv.errors" in import_graph(lazy=True)["gpuenv.run.region"]


def test_no_import_circles_in_gpuenv():
    assert cycles(import_graph()) == []


def test_no_import_circles_through_lazy_imports_either():
    # The backend's factory imports the implementations inside open_backend(); they
    # import the protocol from backend/base.py, not from the package, so no circle.
    assert cycles(import_graph(lazy=True)) == []


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the longest prefix that names the module's package."""
    best: tuple[int, int] | None = None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and (
                best is None or len(name) > best[1]
            ):
                best = (i, len(name))
    return None if best is None else best[0]


def test_imports_never_go_up_the_layers():
    graph = import_graph(lazy=True)
    unplaced = sorted(m for m in graph if m != "gpuenv" and layer_of(m) is None)
    assert not unplaced, f"{unplaced} are in no layer: add them to LAYERS and ARCHITECTURE.md"
    up = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        for d in deps
        if m != "gpuenv" and d != "gpuenv" and (layer_of(d) or 0) < (layer_of(m) or 0)
    )
    assert not up, f"imports that go up the layers: {up}"
    assert layer_of("gpuenv.clocks.calibration") == 1 and layer_of("gpuenv.clocks.plan") == 3


def test_no_module_over_800_lines():
    long = {
        _rel(path): n
        for path in _modules().values()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    new = {name: n for name, n in long.items() if name not in TOO_LONG_MODULES}
    assert not new, f"modules over {MAX_LINES} lines: {new} (split them)"
    done = TOO_LONG_MODULES - set(long)
    assert not done, f"{sorted(done)} are no longer too long: take them off TOO_LONG_MODULES"


def test_no_function_over_80_lines():
    long = {}
    for path in _modules().values():
        for node in ast.walk(_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{_rel(path)}:{node.name}"] = n
    new = {name: n for name, n in long.items() if name not in TOO_LONG_FUNCTIONS}
    assert not new, f"functions over {MAX_FUNCTION_LINES} lines: {new} (split them)"
    done = TOO_LONG_FUNCTIONS - set(long)
    assert not done, f"{sorted(done)} are no longer too long: take them off TOO_LONG_FUNCTIONS"


def test_torch_and_pynvml_are_imported_in_their_one_place():
    for top, allowed in (("torch", TORCH_IMPORTERS), ("pynvml", PYNVML_IMPORTERS)):
        importers = {_rel(p) for p in _modules().values() if _imports_anywhere(p, top)}
        stray = {m for m in importers if not any(Path(m).match(a) for a in allowed)}
        assert importers, f"nothing imports {top}: is the check reading the package?"
        assert not stray, f"{sorted(stray)} import {top}: only {', '.join(allowed)} may"


# Modules that look torch up in sys.modules without importing it, and why each may.
# Times nothing: the environment record names the torch a process already loaded.
TORCH_LOOKUPS_ALLOWED = ("environment.py",)


def _looks_up_torch(path: Path) -> bool:
    """`sys.modules.get("torch")` / `sys.modules["torch"]`: torch reached without an import."""
    for node in ast.walk(_tree(path)):
        args: list[ast.expr] = []
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and owner.attr == "modules":
                args = list(node.args[:1])
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "modules"
        ):
            args = [node.slice]
        if any(isinstance(a, ast.Constant) and a.value == "torch" for a in args):
            return True
    return False


def test_one_cuda_timer_in_torchs_home():
    # env.measure timed regions with CUDA events of a torch found in sys.modules: a second
    # CUDA timer outside timing/cuda/ (issue 30); every CUDA event is made there now
    homes = (*TORCH_IMPORTERS, *TORCH_LOOKUPS_ALLOWED)
    lookups = {_rel(p) for p in _modules().values() if _looks_up_torch(p)}
    stray = {m for m in lookups if not any(Path(m).match(a) for a in homes)}
    assert lookups, "nothing looks torch up: is the check reading the package?"
    assert not stray, f"{sorted(stray)} reach torch through sys.modules: go through timing/cuda/"


# `# fmt: skip` is for data tables whose columns the formatter would break up: each one
# stays here as "path:line text", with why. None today: the 661 hand-packed lines went.
FORMAT_SKIPS_ALLOWED: set[str] = set()


def _format_skips(path: Path) -> list[str]:
    """The lines of a module with a `# fmt: skip` or `# fmt: off` comment."""
    with path.open("rb") as f:
        comments = [t for t in tokenize.tokenize(f.readline) if t.type == tokenize.COMMENT]
    return [
        f"{t.start[0]} {t.line.strip()}"
        for t in comments
        if t.string.lstrip("# ").startswith(("fmt: skip", "fmt: off"))
    ]


def test_the_formatter_decides_how_code_looks():
    root = PACKAGE.parent
    marks = {
        f"{path.relative_to(root)}:{mark}"
        for top in ("gpuenv", "tests", "scripts", "benchmarks")
        for path in sorted((root / top).rglob("*.py"))
        for mark in _format_skips(path)
    }
    assert not marks - FORMAT_SKIPS_ALLOWED, (
        f"{sorted(marks - FORMAT_SKIPS_ALLOWED)}: let `ruff format` decide how these lines look"
    )
