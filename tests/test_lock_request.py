"""One LockRequest from the door to the GPU (gpuenv/clocks/request.py): every field of the
request reaches the simulated GPU's writes, through a local lock and through gpuenvd, and
crosses gpuenvd's wire as the request writes and reads it.

A new lockable setting is a field of `LockRequest` and a step where it is applied: these
tests enumerate the request's fields, so a field with no value below, or one that does not
reach the GPU, fails them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path

import pytest
from server_harness import ALICE, Harness, serving

import gpuenv
from gpuenv.backend.sim import SimBackend, SimTruth
from gpuenv.clocks import LockRequest, make_request
from gpuenv.clocks.journal import Journal
from gpuenv.daemon import protocol
from gpuenv.errors import ConfigError

# One value per lockable setting on the simulated RTX 4090 (it locks memory clocks now, where
# an H100 cannot), and what the simulated GPU shows once it is applied.
SETTINGS: dict[str, tuple[object, Callable[[SimTruth], bool]]] = {
    "sm": (1500, lambda t: t.locked_sm == (1500, 1500)),
    "mem": (5001, lambda t: t.locked_mem == (5001, 5001)),
    "power_limit_w": (300.0, lambda t: t.power_limit_w == 300.0),
}
FIELDS = [f.name for f in fields(LockRequest)]


def state(t: SimTruth) -> tuple[object, ...]:
    return (t.locked_sm, t.locked_mem, t.app_sm_mhz, t.app_mem_mhz, t.power_limit_w)


def test_every_field_of_the_request_has_a_value_here() -> None:
    assert set(SETTINGS) == set(FIELDS), "give each new LockRequest field a value and a check"


def one(name: str) -> LockRequest:
    return LockRequest(**{name: SETTINGS[name][0]})  # type: ignore[arg-type]


@pytest.mark.parametrize("name", FIELDS)
def test_each_field_reaches_the_gpu_through_a_local_lock(name: str, tmp_path: Path) -> None:
    sim = SimBackend("rtx4090", n_gpus=1)
    try:
        before = state(sim.truth(0))
        request = one(name)
        with gpuenv.lock(
            request=request, backend=sim, journal=Journal(tmp_path), supervise=False
        ) as lk:
            assert SETTINGS[name][1](sim.truth(0)), f"{name} did not reach the GPU"
            assert lk.request == request
        assert state(sim.truth(0)) == before
    finally:
        sim.close()


@pytest.fixture
def rtx(tmp_path: Path) -> Iterator[Harness]:
    with serving(tmp_path, profile="rtx4090") as harness:
        yield harness


@pytest.mark.parametrize("name", FIELDS)
def test_each_field_reaches_the_gpu_through_gpuenvd(name: str, rtx: Harness) -> None:
    user_view = SimBackend("rtx4090", n_gpus=2, state_file=rtx.tmp / "sim.json", root=False)
    try:
        rtx.queue.append(ALICE)
        with gpuenv.lock(request=one(name), gpus="0", backend=user_view, socket=rtx.sock) as lk:
            assert "gpuenvd" in " ".join(lk.notes)  # a lease, not a local lock
            assert lk.request == one(name)  # as a local lock says it
            assert SETTINGS[name][1](rtx.backend.truth(0)), f"{name} did not cross gpuenvd"
        assert rtx.truth(0) == rtx.original[0]
    finally:
        user_view.close()


# -- the wire ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_",
    [
        *(one(name) for name in FIELDS),
        LockRequest(sm=(1200, 1500), mem=(405, 5001), power_limit_w=450.5),
        LockRequest(sm="sustained"),
        LockRequest(sm="base", power_limit_w=300.0),
    ],
)
def test_a_request_crosses_the_wire_unchanged(request_: LockRequest) -> None:
    line = protocol.encode(protocol.request("lock", 1, gpus=[0], **request_.to_wire()))
    parsed = protocol.parse_request(line.rstrip(b"\n"))
    wire = {k: parsed.args[k] for k in LockRequest.wire_fields()}
    assert LockRequest.from_wire(wire) == request_
    assert LockRequest.from_wire(json.loads(json.dumps(request_.to_wire()))) == request_


def test_the_lock_op_takes_every_field_of_the_request() -> None:
    assert set(LockRequest.wire_fields()) <= set(protocol.OPS["lock"])


def test_an_older_clients_lock_line_still_reads() -> None:
    """Clients before the one request sent a range's top apart (`sm_max`): the same wire."""
    old = b'{"v": 1, "id": 3, "op": "lock", "gpus": [0], "sm": 1200, "sm_max": 1500, "mem": 405}'
    parsed = protocol.parse_request(old)
    wire = {k: parsed.args[k] for k in LockRequest.wire_fields()}
    assert LockRequest.from_wire(wire) == LockRequest(sm=(1200, 1500), mem=405)


# -- the doors -----------------------------------------------------------------------------------


def test_keywords_and_a_request_are_the_same_lock() -> None:
    from gpuenv.clocks.request import requested

    assert requested(None, 1350, {"power_limit_w": 500}) == make_request(1350, power_limit_w=500)
    assert requested(None, None, {"sm": 1200, "sm_max": 1500}) == LockRequest(sm=(1200, 1500))
    with pytest.raises(ConfigError, match="not both"):
        requested(LockRequest(sm=1350), None, {"mem": 405})
    with pytest.raises(ConfigError, match="twice"):
        requested(None, 1350, {"sm": 1500})
    with pytest.raises(TypeError, match="'turbo'"):
        requested(None, 1350, {"turbo": 1})  # type: ignore[typeddict-unknown-key]


def test_the_python_door_keeps_its_keywords_and_their_errors(tmp_path: Path) -> None:
    sim = SimBackend("rtx4090", n_gpus=1)
    try:
        with pytest.raises(ConfigError, match="sm True is not a clock"):
            gpuenv.lock(sm=True, backend=sim, journal=Journal(tmp_path))  # type: ignore[typeddict-item]
        with gpuenv.lock(
            sm=1500, power_limit_w=300, backend=sim, journal=Journal(tmp_path), supervise=False
        ) as lk:
            assert lk.plan.request == LockRequest(sm=1500, power_limit_w=300.0)
    finally:
        sim.close()
