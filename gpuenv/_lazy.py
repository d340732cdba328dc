"""Public names imported on first use (PEP 562): a package stays cheap to import.

    __getattr__, __dir__ = lazy_exports(__name__, {"stable": "gpuenv.session"}, globals())

`import gpuenv` then imports neither torch nor pynvml; `gpuenv.stable` imports
gpuenv.session when it is first read. Each read asks the module again (nothing is
cached here), so a name patched in its own module is seen through the package.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: Mapping[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A module's `__getattr__` and `__dir__` for `exports` (public name -> the module,
    dotted, that defines it); `namespace` is the module's globals()."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            # a subpackage, as `import gpuenv` then `gpuenv.timing.sim_kernel(...)` reads it
            # (an attribute only once something imported it: an AttributeError before)
            sub = f"{package}.{name}"
            if not name.startswith("_") and importlib.util.find_spec(sub) is not None:
                return importlib.import_module(sub)
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return sorted([*namespace, *exports])

    return __getattr__, __dir__


__all__ = ["lazy_exports"]
