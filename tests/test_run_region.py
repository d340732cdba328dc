"""gpuenv.region: timing alone, and edges over the pipe that `gpuenv run` hands a child."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap

import pytest

import gpuenv
from gpuenv.errors import ConfigError
from gpuenv.run import region as region_mod
from gpuenv.run.region import ENV_FD, ENV_PIPE, parse_line, pipe_identity, region


@pytest.fixture
def channel(monkeypatch: pytest.MonkeyPatch):
    """A pipe set up the way `gpuenv run` sets it up; yields a function reading all lines."""
    r, w = os.pipe()
    monkeypatch.setenv(ENV_FD, str(w))
    monkeypatch.setenv(ENV_PIPE, pipe_identity(w))
    region_mod._CHANNEL.reset()

    def lines() -> list[str]:
        os.close(w)
        with os.fdopen(r) as f:
            return f.read().splitlines()

    yield lines
    region_mod._CHANNEL.reset()
    for fd in (r, w):
        with contextlib.suppress(OSError):
            os.close(fd)


def test_region_without_gpuenv_run_times_itself():
    region_mod._CHANNEL.reset()
    assert not region_mod.active()
    with gpuenv.region("step") as r:
        pass
    assert r.elapsed_s is not None and r.elapsed_s >= 0
    assert r.name == "step"


def test_edges_carry_pid_id_monotonic_time_and_name(channel):
    with region("outer") as outer, region("inner"):
        pass
    edges = [parse_line(line) for line in channel()]
    assert [e.kind for e in edges] == ["b", "b", "e", "e"]
    assert {e.pid for e in edges} == {os.getpid()}
    assert edges[0].name == "outer" and edges[1].name == "inner"
    assert edges[1].id == edges[2].id and edges[0].id == edges[3].id != edges[1].id
    assert edges[0].t == pytest.approx(outer.t0) and edges[3].t == pytest.approx(outer.t1)


def test_decorator_makes_a_region_per_call(channel):
    @region("f")
    def f() -> int:
        return 7

    assert f() == 7 and f() == 7
    edges = [parse_line(line) for line in channel()]
    assert [(e.kind, e.name) for e in edges] == [("b", "f"), ("e", None), ("b", "f"), ("e", None)]
    assert edges[0].id != edges[2].id


def test_newline_in_name_cannot_break_the_protocol(channel):
    with region("a\nb"):
        pass
    lines = channel()
    assert len(lines) == 2 and parse_line(lines[0]).name == "a b"


def test_empty_name_is_a_clear_error():
    with pytest.raises(ConfigError, match="needs a name"):
        region("  ")


def test_fd_reused_for_another_pipe_is_not_written(monkeypatch: pytest.MonkeyPatch):
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    try:
        monkeypatch.setenv(ENV_FD, str(w2))
        monkeypatch.setenv(ENV_PIPE, pipe_identity(w1))  # names another pipe
        region_mod._CHANNEL.reset()
        assert not region_mod.active()
        with region("x"):
            pass
        os.close(w2)
        assert os.read(r2, 100) == b""
    finally:
        region_mod._CHANNEL.reset()
        for fd in (r1, w1, r2):
            os.close(fd)


def test_fd_that_is_a_regular_file_is_not_written(monkeypatch: pytest.MonkeyPatch, tmp_path):
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        monkeypatch.setenv(ENV_FD, str(fd))
        monkeypatch.delenv(ENV_PIPE, raising=False)
        region_mod._CHANNEL.reset()
        with region("x"):
            pass
        assert path.read_bytes() == b""
    finally:
        region_mod._CHANNEL.reset()
        os.close(fd)


def test_closed_reader_does_not_break_the_program(monkeypatch: pytest.MonkeyPatch):
    r, w = os.pipe()
    try:
        monkeypatch.setenv(ENV_FD, str(w))
        monkeypatch.setenv(ENV_PIPE, pipe_identity(w))
        region_mod._CHANNEL.reset()
        os.close(r)  # the parent went away: the next write gets EPIPE
        with region("after the parent died") as reg:
            pass
        assert reg.elapsed_s is not None
        assert not region_mod.active()
    finally:
        region_mod._CHANNEL.reset()
        os.close(w)


def test_forked_child_writes_with_its_own_pid(channel):
    script = textwrap.dedent(
        """
        import os, gpuenv
        with gpuenv.region("in child"):
            pass
        """
    )
    fd = int(os.environ[ENV_FD])
    subprocess.run([sys.executable, "-c", script], check=True, pass_fds=(fd,))
    edges = [parse_line(line) for line in channel()]
    assert [e.kind for e in edges] == ["b", "e"]
    assert edges[0].pid != os.getpid() and edges[0].name == "in child"


def test_parse_line_ignores_garbage():
    assert parse_line("hello") is None
    assert parse_line("b x 1 2.0 n") is None
    assert parse_line("e 1 2") is None
    edge = parse_line("b 10 3 12.5 name with spaces\n")
    assert edge is not None and edge.name == "name with spaces" and edge.t == 12.5


def test_gpuenv_region_callable_whatever_was_imported_first():
    # importing the module that defines it first must not shadow gpuenv.region()
    script = textwrap.dedent(
        """
        import gpuenv.run.region, gpuenv
        with gpuenv.region("a") as r:
            pass
        with gpuenv.region("b"):
            pass
        print(type(r).__name__, r.name)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True)
    assert out.stdout.split() == ["region", "a"]


def test_a_region_that_discards_on_error_ends_with_x(channel):
    with contextlib.suppress(ValueError), region("f", discard_on_error=True):
        raise ValueError("boom")
    with region("g", discard_on_error=True):
        pass
    with contextlib.suppress(ValueError), region("h"):
        raise ValueError("kept: a user's region that raised is still measured")
    kinds = [(e.kind, e.name) for e in map(parse_line, channel())]
    assert kinds == [("b", "f"), ("x", None), ("b", "g"), ("e", None), ("b", "h"), ("e", None)]


def test_facts_ride_with_the_begin_and_end_edges_in_one_write_each(channel):
    with region("vadd size=4096", meta={"site": "do_bench b.py:3", "labels": {"size": 4096}}) as r:
        r.end_meta = {"returned_s": 1.5e-3}
    lines = channel()
    assert [line.split(" ", 1)[0] for line in lines] == ["b", "l", "l", "e"]
    edges = [parse_line(line) for line in lines]
    assert edges[1].meta == {"site": "do_bench b.py:3", "labels": {"size": 4096}}
    assert edges[2].meta == {"returned_s": 1.5e-3}
    assert {e.id for e in edges} == {edges[0].id} and edges[0].name == "vadd size=4096"


def test_facts_too_long_for_one_atomic_write_keep_the_site():
    meta = {"site": "do_bench b.py:3", "kind": "do_bench", "labels": {"x": "y" * 5000}}
    line = region_mod.meta_line(1, 2, meta)
    assert parse_line(line).meta == {"site": "do_bench b.py:3", "kind": "do_bench"}
    assert parse_line("l 1 2 [1, 2]") is None and parse_line("l 1 2 {not json") is None
    assert parse_line('l 1 2 {"a b": "c d"}').meta == {"a b": "c d"}  # spaces inside are fine


def test_the_cheap_paths_of_facts_send_what_the_encoder_would():
    plain = {"kind": "do_bench", "site": "do_bench b.py:3"}
    first, again = region_mod.meta_line(1, 2, plain), region_mod.meta_line(1, 3, dict(plain))
    assert parse_line(first).meta == parse_line(again).meta == plain
    for value in (1.5e-3, 2.0, float("inf")):
        assert parse_line(region_mod.meta_line(1, 2, {"returned_s": value})).meta == {
            "returned_s": value
        }
