"""`gpuenv run --regions nvtx`: the NVTX ranges a command pushes and pops become regions.

NVTX (the annotation API of NVIDIA's tools: `torch.cuda.nvtx.range_push`, the
`nvtx` package, NCCL, C/C++ code) does nothing by itself: on a process's first
NVTX call it loads the library named in NVTX_INJECTION64_PATH, if any, and lets
it implement the calls. That is how profilers see ranges; no profiler is needed
for it, and no GPU. gpuenv's injection library (nvtx_inject.c) writes each
range's begin and end as region edges (gpuenv/run/region.py).

It is built from source with the C compiler ($CC, else cc) on first use and
cached under $GPUENV_CACHE_DIR (default ~/.cache/gpuenv), keyed by the source's
hash. A command already given an injection library (run under Nsight Systems,
say) keeps it: gpuenv refuses instead of replacing it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from gpuenv.errors import ConfigError

SOURCE = Path(__file__).with_name("nvtx_inject.c")
ENV_INJECT = "NVTX_INJECTION64_PATH"
ENV_CACHE = "GPUENV_CACHE_DIR"


def cache_dir(env: Mapping[str, str]) -> Path:
    if env.get(ENV_CACHE):
        return Path(env[ENV_CACHE])
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpuenv"


def compiler(env: Mapping[str, str]) -> list[str]:
    """The C compiler's command line ($CC, else cc, gcc or clang on PATH)."""
    if env.get("CC"):
        return shlex.split(env["CC"])
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    raise ConfigError(
        "--regions nvtx builds a small NVTX injection library, and there is no C compiler",
        hint="install one (apt-get install gcc) or name it in CC",
    )


def build(env: Mapping[str, str] | None = None) -> Path:
    """The injection library: built once per source version, then reused."""
    env = os.environ if env is None else env
    source = SOURCE.read_bytes()
    cc = compiler(env)
    key = hashlib.sha256(source + " ".join(cc).encode()).hexdigest()[:16]
    directory = cache_dir(env)
    lib = directory / f"nvtx-inject-{key}.so"
    if lib.exists():
        return lib
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".nvtx-inject-", suffix=".so")
    except OSError as err:
        raise ConfigError(
            f"--regions nvtx: cannot write the injection library under {directory}: {err.strerror}",
            hint=f"set {ENV_CACHE} to a directory you may write",
        ) from err
    os.close(fd)
    try:
        cmd = [*cc, "-shared", "-fPIC", "-O2", "-o", tmp, str(SOURCE), "-lpthread"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as err:
            raise ConfigError(
                f"--regions nvtx: cannot run the C compiler {cc[0]}: {err}",
                hint="install one (apt-get install gcc) or name it in CC",
            ) from err
        if done.returncode != 0:
            raise ConfigError(
                f"--regions nvtx: building the injection library failed ({shlex.join(cmd)}): "
                + (done.stderr.strip().splitlines() or ["no output"])[-1],
                hint="check the C compiler (CC), or run without --regions nvtx",
            )
        os.replace(tmp, lib)  # atomic: a concurrent build of the same source is identical
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    return lib


def child_env(env: MutableMapping[str, str], lib: Path) -> None:
    """Name the injection library in the command's environment, in place."""
    theirs = env.get(ENV_INJECT)
    if theirs and os.path.abspath(theirs) != str(lib):
        raise ConfigError(
            f"--regions nvtx: the command already has an NVTX injection library "
            f"({ENV_INJECT}={theirs}, a profiler's?), and a process loads only one",
            hint="run without --regions nvtx under a profiler",
        )
    env[ENV_INJECT] = str(lib)


__all__ = ["ENV_CACHE", "ENV_INJECT", "SOURCE", "build", "cache_dir", "child_env", "compiler"]
