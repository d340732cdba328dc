"""gpuenv run's import hook, loaded at the start of each Python process of the command.

`gpuenv run` puts this directory first on the command's PYTHONPATH and names, in
GPUENV_AUTO_MODULES, the modules whose measuring functions become regions
(gpuenv/run/autoregions.py). This file only puts a finder in front of
sys.meta_path, using modules Python has already loaded at start-up, and then
runs the sitecustomize this one shadows, if there is one. When the command
imports a watched module, the module is loaded as usual and then handed to
gpuenv.run.autoregions.patch: the first import of anything of gpuenv's.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# gpuenv's own source tree, for a Python that does not have gpuenv installed
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))


def _patch(module):
    try:
        try:
            from gpuenv.run import autoregions
        except ImportError:
            sys.path.append(_ROOT)
            try:
                from gpuenv.run import autoregions
            finally:
                sys.path.remove(_ROOT)
        autoregions.patch(module)
    except Exception as err:  # never break the command's import
        sys.stderr.write(f"gpuenv: no automatic regions for {module.__name__}: {err}\n")


def _after_rewriter(module):
    """pytest puts its assertion rewriter in front of sys.meta_path, and it loads the modules
    of pytest plugins (pytest_benchmark.fixture among them) itself: patch those after it."""
    hook = getattr(module, "AssertionRewritingHook", None)
    orig = getattr(hook, "exec_module", None)
    if orig is None:
        return

    def exec_module(self, mod):
        orig(self, mod)
        if mod.__name__ in _NAMES:
            _patch(mod)

    hook.exec_module = exec_module  # type: ignore[union-attr]


_NAMES: set = set()  # the watched modules, patched after they load
_SPECIAL = {"_pytest.assertion.rewrite": _after_rewriter}


class _Loader:
    """Runs the real loader, then patches the module."""

    def __init__(self, loader, after):
        self.loader = loader
        self.after = after

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.after(module)

    def __getattr__(self, name):  # get_source, is_package, ...: the real loader's
        return getattr(self.loader, name)


class GpuenvAutoRegionFinder:
    """Finds nothing itself: asks the finders after it, and wraps the loader of a watched
    module."""

    def find_spec(self, fullname, path=None, target=None):
        after = _patch if fullname in _NAMES else _SPECIAL.get(fullname)
        if after is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, after)  # type: ignore[assignment]
                return spec
        return None

    def invalidate_caches(self):
        pass


def _install():
    names = [n for n in os.environ.get("GPUENV_AUTO_MODULES", "").split(",") if n]
    if not names or not os.environ.get("GPUENV_REGION_FD"):
        return
    if any(type(f).__name__ == "GpuenvAutoRegionFinder" for f in sys.meta_path):
        return
    _NAMES.update(names)
    if "pytest_benchmark.fixture" not in _NAMES:
        _SPECIAL.clear()
    sys.meta_path.insert(0, GpuenvAutoRegionFinder())
    for name in names:  # imported before this ran (unusual): patch it now
        if name in sys.modules:
            _patch(sys.modules[name])


def _chain():
    """Run the sitecustomize that this one shadows (site.py imports only the first found)."""
    from importlib.machinery import PathFinder

    paths = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None:
        return
    from importlib.util import module_from_spec

    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)  # its errors are site.py's to report, as without gpuenv


_install()
_chain()
