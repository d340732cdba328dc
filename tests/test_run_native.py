"""Regions from programs in other languages: the docs' C example (docs/how-to/run.md), and
NVTX ranges (`gpuenv run --regions nvtx`, gpuenv/run/nvtx.py and nvtx_inject.c).

Built with the machine's C compiler (skipped without one); the NVTX client is
built against the real NVTX 3 headers of the nvidia-nvtx-cu12 package (the test
extra), the header-only NVTX that PyTorch and NCCL compile in.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from docs_harness import find_block

from gpuenv.results import load_run
from gpuenv.run.report import RUN_NAME

ROOT = Path(__file__).resolve().parent.parent
GPUENV = [sys.executable, "-c", "from gpuenv.cli import main; main()"]
CC = shutil.which("cc") or shutil.which("gcc")
needs_cc = pytest.mark.skipif(CC is None, reason="needs a C compiler (cc)")


def gpuenv_run(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHONPATH=str(ROOT), GPUENV_CACHE_DIR=str(tmp_path / "cache"))
    full.update(env)
    return subprocess.run(
        [*GPUENV, "--sim", "run", *args], capture_output=True, text=True, timeout=120, env=full
    )


def compile_c(tmp_path: Path, source: str, *flags: str) -> str:
    src, exe = tmp_path / "prog.c", tmp_path / "prog"
    src.write_text(source)
    subprocess.run(
        [str(CC), "-Wall", "-o", str(exe), str(src), *flags],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return str(exe)


def readme_c_example() -> str:
    return find_block("c").text  # the docs have one C example


@needs_cc
def test_the_readmes_c_example_marks_a_region(tmp_path):
    exe = compile_c(tmp_path, readme_c_example())
    out = tmp_path / "run.jsonl"
    result = gpuenv_run(tmp_path, "-o", str(out), "--", exe)
    assert result.returncode == 0, result.stderr
    by_name = {m.name: m for m in load_run(out).measurements}
    assert list(by_name) == [RUN_NAME, "gemm"]
    assert 0.2 <= by_name["gemm"].times_s[0] < by_name[RUN_NAME].times_s[0]
    # and without gpuenv run it runs as a plain program
    assert subprocess.run([exe], timeout=30).returncode == 0


NVTX_CLIENT = """
#include <nvtx3/nvToolsExt.h>
#include <unistd.h>
int main(void) {
    nvtxRangePushA("outer");
    for (int i = 0; i < 3; ++i) { nvtxRangePushA("step"); usleep(30000); nvtxRangePop(); }
    nvtxDomainHandle_t d = nvtxDomainCreateA("mine");
    nvtxEventAttributes_t a = {0};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_REGISTERED;
    a.message.registered = nvtxDomainRegisterStringA(d, "registered");
    nvtxDomainRangePushEx(d, &a); usleep(20000); nvtxDomainRangePop(d);
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = "started";
    nvtxRangeId_t id = nvtxRangeStartEx(&a); usleep(20000); nvtxRangeEnd(id);
    nvtxRangePushW(L"wide"); nvtxRangePop();
    nvtxRangePop();
    return 0;
}
"""


def nvtx_include() -> Path:
    spec = importlib.util.find_spec("nvidia.nvtx")
    for base in list(spec.submodule_search_locations or []) if spec else []:
        if (Path(base) / "include" / "nvtx3" / "nvToolsExt.h").exists():
            return Path(base) / "include"
    pytest.skip("needs the NVTX 3 headers (pip install nvidia-nvtx-cu12)")


@needs_cc
def test_nvtx_ranges_become_regions_without_a_profiler(tmp_path):
    exe = compile_c(tmp_path, textwrap.dedent(NVTX_CLIENT), f"-I{nvtx_include()}", "-ldl")
    out = tmp_path / "run.jsonl"
    result = gpuenv_run(tmp_path, "--regions", "nvtx", "-o", str(out), "--", exe)
    assert result.returncode == 0, result.stderr
    by_name = {m.name: m for m in load_run(out).measurements}
    assert list(by_name) == [RUN_NAME, "outer", "step", "registered", "started", "wide"]
    assert len(by_name["step"].times_s) == 3 and min(by_name["step"].times_s) >= 0.03
    assert by_name["outer"].times_s[0] > sum(by_name["step"].times_s)
    assert list((tmp_path / "cache").glob("nvtx-inject-*.so"))  # built once, cached
    # without --regions nvtx the same program marks nothing (NVTX calls are no-ops)
    plain = gpuenv_run(tmp_path, "-o", str(tmp_path / "plain.jsonl"), "--", exe)
    assert plain.returncode == 0, plain.stderr
    assert [m.name for m in load_run(tmp_path / "plain.jsonl").measurements] == [RUN_NAME]


def test_nvtx_refuses_to_replace_a_profilers_injection(tmp_path):
    if CC is None:
        pytest.skip("needs a C compiler (cc)")
    result = gpuenv_run(
        tmp_path,
        "--regions",
        "nvtx",
        "--",
        "true",
        NVTX_INJECTION64_PATH="/opt/nsight/libToolsInjection64.so",
    )
    assert result.returncode == 2
    assert "already has an NVTX injection library" in result.stderr


def test_nvtx_without_a_compiler_says_so_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"
    result = gpuenv_run(
        tmp_path, "--regions", "nvtx", "--", "touch", str(marker), CC=str(tmp_path / "no-such-cc")
    )
    assert result.returncode == 2
    assert "cannot run the C compiler" in result.stderr and not marker.exists()


@pytest.mark.gpu
@needs_cc
def test_torch_nvtx_ranges_become_regions(tmp_path):
    """PyTorch's NVTX (torch.cuda.nvtx) loads gpuenv's injection like any NVTX client."""
    pytest.importorskip("torch")
    child = tmp_path / "child.py"
    child.write_text(
        textwrap.dedent("""
        import time, torch
        x = torch.ones(1024, 1024, device="cuda")
        for _ in range(3):
            torch.cuda.nvtx.range_push("step")
            y = x @ x
            torch.cuda.synchronize()
            time.sleep(0.05)
            torch.cuda.nvtx.range_pop()
    """)
    )
    out = tmp_path / "run.jsonl"
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = gpuenv_run(
        tmp_path,
        "--regions",
        "nvtx",
        "-o",
        str(out),
        "--",
        sys.executable,
        str(child),
        PYTHONPATH=path,
    )
    assert result.returncode == 0, result.stderr
    by_name = {m.name: m for m in load_run(out).measurements}
    assert len(by_name["step"].times_s) == 3 and min(by_name["step"].times_s) >= 0.05
