"""The wire protocol: validation, size limits, framing, and fuzzing of the parser."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuenv.daemon import protocol
from gpuenv.daemon.protocol import MAX_LINE, LineReader, ProtocolError, parse_request
from gpuenv.errors import LockConflict


def req(**fields: object) -> bytes:
    return json.dumps({"v": 1, "id": 1, **fields}).encode()


def test_a_valid_lock_request_is_cleaned() -> None:
    r = parse_request(req(op="lock", gpus=[0, "1", "GPU-abc"], sm=[1200, 1500], wait=2))
    assert r.op == "lock" and r.id == 1
    assert r.args["gpus"] == [0, 1, "GPU-abc"]
    assert r.args["sm"] == (1200, 1500)
    assert r.args["wait"] == 2.0 and r.args["standing"] is False
    assert r.args["mem"] is None and r.args["power_limit_w"] is None


def test_all_gpus_is_none() -> None:
    assert parse_request(req(op="status", gpus="all")).args["gpus"] is None
    assert parse_request(req(op="status")).args["gpus"] is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"op": "lock", "sm": 0}, "whole number of MHz"),
        ({"op": "lock", "sm": True}, "whole number of MHz"),
        ({"op": "lock", "sm": 1350.5}, "whole number of MHz"),
        ({"op": "lock", "sm": [1500, 1200]}, "min above max"),
        ({"op": "lock", "sm": "turbo"}, "not a clock"),
        ({"op": "lock", "sm": [1, 2, 3]}, "[min_mhz, max_mhz]"),
        ({"op": "lock", "power_limit_w": -5}, "positive number of watts"),
        ({"op": "lock", "wait": 1e9}, "'wait'"),
        ({"op": "lock", "gpus": []}, "'gpus'"),
        ({"op": "lock", "gpus": [None]}, "not a GPU index"),
        ({"op": "lock", "gpus": list(range(100))}, "'gpus'"),
        ({"op": "lock", "standing": "yes"}, "true or false"),
        ({"op": "lock", "label": 5}, "'label'"),
        ({"op": "lock", "turbo": 1}, "no field 'turbo'"),
        ({"op": "release"}, "lease id"),
        ({"op": "window_end", "window": -1}, "window id"),
        ({"op": "subscribe", "period": 0}, "'period'"),
        ({"op": "hello", "versions": "1"}, "'versions'"),
        ({"op": "nope"}, "unknown op"),
        ({"op": None}, "unknown op"),
    ],
)
def test_invalid_fields_say_what_is_wrong(fields: dict, words: str) -> None:
    with pytest.raises(ProtocolError) as err:
        parse_request(req(**fields))
    assert words in str(err.value)


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"{",
        b"[]",
        b"null",
        b'"hello"',
        b"\xff",
        b'{"v": 2, "op": "hello"}',
        b'{"op": "hello"}',
    ],
)
def test_broken_lines_raise_protocol_error(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_request(line)


def test_nan_and_infinity_are_refused() -> None:
    with pytest.raises(ProtocolError, match="not JSON"):
        parse_request(b'{"v": 1, "op": "lock", "power_limit_w": NaN}')
    with pytest.raises(ProtocolError, match="not JSON"):
        parse_request(b'{"v": 1, "op": "lock", "wait": Infinity}')


def test_deep_nesting_does_not_crash() -> None:
    deep = b'{"v": 1, "op": "hello", "client": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    with pytest.raises(ProtocolError):
        parse_request(deep)


def test_labels_are_made_printable_and_short() -> None:
    r = parse_request(req(op="lock", label="a\x1b[31mb\nc" + "x" * 1000))
    label = r.args["label"]
    assert label.startswith("a?[31mb?c") and len(label) == protocol.MAX_TEXT


def test_request_id_is_recovered_from_an_invalid_request() -> None:
    assert protocol.request_id_of(req(op="nope")) == 1
    assert protocol.request_id_of(b"garbage") is None
    assert protocol.request_id_of(b'{"id": {"x": 1}}') is None


def test_error_reply_carries_type_gpu_hint_and_owner() -> None:
    reply = protocol.error_reply(3, LockConflict(0, "pid 42 (alice: bench)"))
    assert reply["ok"] is False and reply["id"] == 3
    err = reply["error"]
    assert err["type"] == "LockConflict" and err["gpu"] == 0
    assert err["owner"] == "pid 42 (alice: bench)" and "force" in err["hint"]
    internal = protocol.error_reply(4, KeyError("x"))["error"]
    assert internal["type"] == "InternalError"


def test_encode_is_one_line() -> None:
    line = protocol.encode(protocol.ok_reply(1, text="a\nb", t=(1, 2)))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == {"v": 1, "id": 1, "ok": True, "text": "a\nb", "t": [1, 2]}


# -- framing --------------------------------------------------------------------------------------


def test_line_reader_splits_across_chunks() -> None:
    r = LineReader()
    assert r.feed(b'{"a"') == []
    assert r.feed(b': 1}\n{"b": 2}\n\n  \n{"c"') == [b'{"a": 1}', b'{"b": 2}']
    assert r.pending == 4


def test_line_reader_reports_an_oversized_line_once_and_resyncs() -> None:
    r = LineReader(limit=10)
    assert r.feed(b"x" * 8) == []
    assert r.feed(b"x" * 8) == [None]
    assert r.feed(b"y" * 100) == []  # still the same long line: dropped quietly
    assert r.feed(b"zz\nok\n") == [b"ok"]
    assert r.feed(b"x" * 30 + b"\nfine\n") == [None, b"fine"]


# -- fuzz ----------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
fields = st.sampled_from(
    [
        "gpus",
        "sm",
        "sm_max",
        "mem",
        "power_limit_w",
        "standing",
        "wait",
        "label",
        "lease",
        "window",
        "period",
        "events",
        "all",
        "versions",
        "client",
        "x",
    ]
)
requests = st.fixed_dictionaries(
    {
        "v": st.sampled_from([1, 1, 1, 0, 2, "1", None]),
        "op": st.sampled_from([*protocol.OPS, "bogus", None, 7]),
    },
    optional={"id": json_values},
).flatmap(
    lambda base: st.dictionaries(fields, json_values, max_size=4).map(
        lambda extra: {**base, **extra}
    )
)


@settings(max_examples=300, deadline=None)
@given(requests)
def test_fuzz_structured_requests_never_escape_as_other_errors(message: dict) -> None:
    line = json.dumps(message).encode()
    try:
        parsed = parse_request(line)
    except ProtocolError:
        return
    assert parsed.op in protocol.OPS
    json.dumps(parsed.args, default=list)  # what validation lets through is plain data


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        parse_request(data)
    reader = LineReader(limit=64)
    for line in reader.feed(data):
        assert line is None or (len(line) < 64 and b"\n" not in line)


def test_a_line_at_the_limit_passes_and_one_byte_more_does_not() -> None:
    head = b'{"v": 1, "id": 1, "op": "hello", "client": "'
    pad = MAX_LINE - len(head) - 3  # closing '"}' and the newline
    ok = head + b"a" * pad + b'"}'
    r = LineReader()
    assert r.feed(ok + b"\n") == [ok]
    assert r.feed(head + b"a" * (pad + 1) + b'"}\n') == [None]
