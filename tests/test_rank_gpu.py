"""gpuenv.rank on a real GPU (read-only: GPUENV_READONLY=1 is fine): the screen stops
candidates far behind before a bench call of their own, by CUDA events on the candidates'
GPU, and a few-us ranking is timed by CUPTI from its first call. Choices, not timings,
are asserted: the candidates differ by 2x or more, or are the same work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # pragma: no cover - NVML sees a GPU but torch does not
    pytest.skip("torch sees no CUDA GPU", allow_module_level=True)

import gpuenv  # noqa: E402
from gpuenv.timing import harness  # noqa: E402


def mms(n: int) -> dict[str, Callable[[], Any]]:
    """The same n^3 fp16 mm through two callables (a tie), and mms of 2x and 4x the work
    (K doubled, quadrupled): far behind."""
    a, b = (torch.randn(n, n, device="cuda", dtype=torch.float16) for _ in range(2))
    a2, b2 = (
        torch.randn(n, 2 * n, device="cuda", dtype=torch.float16),
        torch.randn(2 * n, n, device="cuda", dtype=torch.float16),
    )
    a4, b4 = (
        torch.randn(n, 4 * n, device="cuda", dtype=torch.float16),
        torch.randn(4 * n, n, device="cuda", dtype=torch.float16),
    )
    return {
        "mm": lambda: a @ b,
        "mm again": lambda: torch.mm(a, b),
        "K x2": lambda: a2 @ b2,
        "K x4": lambda: a4 @ b4,
    }


def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    real = harness.bench

    def spy(fn: Any, cfg: Any, **kw: Any) -> Any:
        seen.append((kw["name"], cfg.mode))
        return real(fn, cfg, **kw)

    monkeypatch.setattr(harness, "bench", spy)
    return seen


def test_the_screen_stops_mms_of_twice_the_work_before_a_call_of_their_own(monkeypatch):
    seen = calls(monkeypatch)
    r = gpuenv.rank(mms(4096))  # ~0.1-0.3 ms a call: by events
    assert r.winner in ("mm", "mm again") and set(r.tied) <= {"mm", "mm again"}
    for far in ("K x2", "K x4"):
        assert r[far].outcome == "far" and r[far].rounds == 0 and len(r[far].screen_s) == 5
        assert r[far].margin > 1.5
    assert {name for name, _ in seen} == {"mm", "mm again"}
    assert {mode for _, mode in seen} == {"events"} and 0 < r.screen_wall_s < r.wall_s
    assert r.state.gpu is not None and "in the screen" in str(r)


def test_a_few_us_ranking_is_timed_by_cupti_from_its_first_call(monkeypatch):
    seen = calls(monkeypatch)
    r = gpuenv.rank(mms(512))  # a few us a call: the screen's events read under 20 us
    assert {mode for _, mode in seen} == {"auto"} and "CUPTI" in r.method
    assert r.winner in ("mm", "mm again") and r["K x4"].outcome == "far"
    assert r.events_offset_s >= 0
    assert min(r.times_s, key=r.times_s.__getitem__) == r.winner
