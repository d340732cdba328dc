"""gpuenvd's wire protocol: versioned, line-delimited JSON over a Unix socket.

One request per line, one JSON object each, UTF-8, at most `MAX_LINE` bytes
including the newline:

    {"v": 1, "id": 7, "op": "lock", "gpus": [0], "sm": 1350}

Every request gets exactly one reply line carrying the same `id`:

    {"v": 1, "id": 7, "ok": true, "lease": {...}}
    {"v": 1, "id": 7, "ok": false, "error": {"type": "LockConflict", "message": "...",
                                               "hint": "...", "gpu": 0}}

A subscription also streams event lines, which carry `"event"` and no `"ok"`:

    {"v": 1, "event": "samples", "sub": 3, "samples": [...]}

Operations (the fields each takes are in `OPS`):

    hello         version handshake; who the daemon thinks you are, what you may lock
    status        GPUs, their clock state, and every lease
    lock          take a lease: GPUs, and the lock request as `LockRequest.to_wire` writes
                  it (SM clock: value, [min, max], "max", "base"; memory clock; power
                  limit); `standing` outlives the connection; `wait` seconds
    release       end one lease (yours, or any if you are an admin)
    restore       end your standing leases on some GPUs (an admin: everyone's, and
                  put back what any other gpuenv lock changed)
    window_start  mark the start of a timed region; returns a window id
    window_end    mark its end; returns one telemetry Window per GPU from the
                  daemon's continuous sampler
    subscribe     stream samples (and lease events) every `period` seconds
    unsubscribe   stop the stream
    job_begin     (admin: the Slurm prolog) a job's GPUs are its from now: record them
    job_end       (admin: the epilog) close the job's record; returns its report
    job_report    a job's report, running or finished (daemon/jobs.py)

Anything malformed gets an error reply (type "ProtocolError") and the daemon
carries on; a line longer than MAX_LINE is discarded up to its newline.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuenv.clocks.request import LockRequest
from gpuenv.errors import GpuenvError
from gpuenv.errors import ProtocolError as ProtocolError  # defined in gpuenv.errors

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (1,)
MAX_LINE = 64 * 1024  # bytes, newline included
MAX_GPUS = 64  # entries in a "gpus" list
MAX_TEXT = 256  # characters in a free-text field (label)
MAX_WAIT_S = 3600.0
MIN_PERIOD_S = 0.05  # a stream faster than the sampler's own period repeats itself
MAX_PERIOD_S = 60.0
MAX_NUMBER = 10**15  # any integer field; far beyond every sane value, exact as a float


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    """A JSON number a float can hold: an integer past 1e300 would raise OverflowError."""
    if _is_int(value):
        return abs(value) < MAX_NUMBER
    return isinstance(value, float) and math.isfinite(value)


# -- field validators: each returns the cleaned value or raises ProtocolError ------------------


def _req_id(value: Any) -> Any:
    if value is None or (_is_int(value) and abs(value) < 2**53):
        return value
    if isinstance(value, str) and len(value) <= 64:
        return value
    raise ProtocolError("'id' must be an integer or a string of at most 64 characters")


def _gpus(value: Any) -> list[int | str] | None:
    if value is None or value == "all":
        return None
    if _is_int(value) or isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or len(value) > MAX_GPUS:
        raise ProtocolError(f"'gpus' must be 'all' or a list of 1 to {MAX_GPUS} indices or UUIDs")
    out: list[int | str] = []
    for item in value:
        if _is_int(item) and 0 <= item < 1024:
            out.append(item)
        elif isinstance(item, str) and 0 < len(item) <= 128:
            out.append(int(item) if item.isdigit() and len(item) < 5 else item)
        else:
            raise ProtocolError(f"'gpus' entry {item!r:.40} is not a GPU index or UUID")
    return out


def _mhz(value: Any) -> int:
    if not _is_int(value) or not 0 < value < 100_000:
        raise ProtocolError(f"a clock must be a whole number of MHz, not {value!r:.40}")
    return int(value)


def _sm(value: Any) -> int | tuple[int, int] | str | None:
    if value is None:
        return None
    if isinstance(value, str):
        if value in ("max", "base", "sustained"):
            return value
        raise ProtocolError(
            f"'sm' {value!r:.40} is not a clock: use MHz, [min, max], 'max' or 'base'"
        )
    if isinstance(value, list):
        if len(value) != 2:
            raise ProtocolError("'sm' as a range is [min_mhz, max_mhz]")
        lo, hi = _mhz(value[0]), _mhz(value[1])
        if lo > hi:
            raise ProtocolError(f"'sm' range [{lo}, {hi}] has min above max")
        return (lo, hi)
    return _mhz(value)


def _mem(value: Any) -> int | tuple[int, int] | None:
    if value is None:
        return None
    if isinstance(value, list):
        if len(value) != 2:
            raise ProtocolError("'mem' as a range is [min_mhz, max_mhz]")
        lo, hi = _mhz(value[0]), _mhz(value[1])
        if lo > hi:
            raise ProtocolError(f"'mem' range [{lo}, {hi}] has min above max")
        return (lo, hi)
    return _mhz(value)


def _opt_mhz(value: Any) -> int | None:
    return None if value is None else _mhz(value)


def _watts(value: Any) -> float | None:
    if value is None:
        return None
    if not _is_number(value) or not 0 < value < 100_000:
        raise ProtocolError(
            f"'power_limit_w' must be a positive number of watts, not {value!r:.40}"
        )
    return float(value)


def _bool(value: Any) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ProtocolError(f"expected true or false, not {value!r:.40}")
    return value


def _wait(value: Any) -> float:
    if value is None:
        return 0.0
    if not _is_number(value) or not 0 <= value <= MAX_WAIT_S:
        raise ProtocolError(f"'wait' must be 0 to {MAX_WAIT_S:.0f} seconds")
    return float(value)


def _period(value: Any) -> float:
    if value is None:
        return 1.0
    if not _is_number(value) or not MIN_PERIOD_S <= value <= MAX_PERIOD_S:
        raise ProtocolError(f"'period' must be {MIN_PERIOD_S} to {MAX_PERIOD_S:.0f} seconds")
    return float(value)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ProtocolError("'label' must be a string")
    # printable only: it ends up in logs and in other users' status output
    return "".join(ch if ch.isprintable() else "?" for ch in value[:MAX_TEXT])


def _lease_id(value: Any) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        raise ProtocolError("'lease' must be a lease id string (from the lock reply)")
    return value


def _window_id(value: Any) -> int:
    if not _is_int(value) or not 0 <= value < MAX_NUMBER:
        raise ProtocolError("'window' must be a window id (from the window_start reply)")
    return int(value)


def _job(value: Any) -> str:
    from gpuenv.daemon.jobs import check_job_id
    from gpuenv.errors import ConfigError

    try:
        return check_job_id(value)
    except ConfigError as err:
        raise ProtocolError(f"'job': {err.message}") from None


def _versions(value: Any) -> list[int]:
    if value is None:
        return [PROTOCOL_VERSION]
    if (
        not isinstance(value, list)
        or not value
        or len(value) > 16
        or not all(_is_int(v) and abs(v) < MAX_NUMBER for v in value)
    ):
        raise ProtocolError("'versions' must be a list of protocol version numbers")
    return list(value)


def _plain(value: Any) -> Any:
    """A lock request's field with no check of its own here: plain JSON (a number, a string,
    a short list of them), judged by the request itself when the daemon reads it
    (`LockRequest.from_wire`, the validation every door shares)."""
    if value is None or isinstance(value, (str, bool)) or _is_number(value):
        return value
    if isinstance(value, list) and len(value) <= 16 and all(_is_number(v) for v in value):
        return value
    raise ProtocolError(f"a lock setting must be a number, a string or a list, not {value!r:.40}")


Validator = Callable[[Any], Any]

# The lock op's request fields are the request's own (`LockRequest.wire_fields`, written by
# `LockRequest.to_wire`); those below are judged at the door in the protocol's words.
_REQUEST_CHECKS: dict[str, Validator] = {
    "sm": _sm,
    "sm_max": _opt_mhz,
    "mem": _mem,
    "power_limit_w": _watts,
}

# op -> {field: validator}. Fields not listed are an error (a typo must not pass silently).
OPS: dict[str, dict[str, Validator]] = {
    "hello": {"versions": _versions, "client": _text},
    "status": {"gpus": _gpus},
    "lock": {
        "gpus": _gpus,
        **{name: _REQUEST_CHECKS.get(name, _plain) for name in LockRequest.wire_fields()},
        "standing": _bool,
        "wait": _wait,
        "label": _text,
    },
    "release": {"lease": _lease_id},
    "restore": {"gpus": _gpus, "all": _bool},
    "window_start": {"gpus": _gpus},
    "window_end": {"window": _window_id},
    "subscribe": {"gpus": _gpus, "period": _period, "events": _bool},
    "unsubscribe": {},
    "job_begin": {"job": _job, "user": _text, "gpus": _gpus, "asked": _text, "lock": _text},
    "job_end": {"job": _job},
    "job_report": {"job": _job},
}

# every field a request of each op may carry
_ALLOWED = {op: frozenset(fields) | {"v", "id", "op"} for op, fields in OPS.items()}


@dataclass(frozen=True)
class Request:
    op: str
    id: Any
    args: dict[str, Any]


def parse_request(line: bytes) -> Request:
    """Decode and validate one request line; raise ProtocolError saying what is wrong.

    The id is recovered, where it can be, even from an invalid request, so the
    error reply can carry it: see `request_id_of`.
    """
    if len(line) > MAX_LINE:
        raise ProtocolError(
            f"request longer than {MAX_LINE} bytes", hint="send one short JSON object per line"
        )
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("request is not UTF-8", hint="send one JSON object per line") from None
    try:
        data = _DECODER.decode(text)
    except (ValueError, RecursionError) as err:
        raise ProtocolError(
            f"request is not JSON ({str(err)[:80]})", hint="send one JSON object per line"
        ) from None
    if not isinstance(data, dict):
        raise ProtocolError(
            "request must be a JSON object", hint='e.g. {"v": 1, "id": 1, "op": "hello"}'
        )
    req_id = _req_id(data.get("id"))
    version = data.get("v")
    if version not in SUPPORTED_VERSIONS or not _is_int(version):
        raise ProtocolError(
            f"protocol version {version!r:.20} is not supported",
            hint=f"this daemon speaks versions {list(SUPPORTED_VERSIONS)}; "
            f'put "v": {PROTOCOL_VERSION} in every request',
        )
    op = data.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise ProtocolError(f"unknown op {op!r:.40}", hint="one of " + ", ".join(OPS))
    fields = OPS[op]
    if not _ALLOWED[op].issuperset(data):
        unknown = sorted(k for k in data if k not in _ALLOWED[op])
        raise ProtocolError(
            f"op {op!r} takes no field {unknown[0]!r:.40}",
            hint="fields: " + (", ".join(fields) or "none"),
        )
    args = {name: check(data.get(name)) for name, check in fields.items()}
    return Request(op=op, id=req_id, args=args)


def request_id_of(line: bytes) -> Any:
    """The id of a request line, or None when the line is too broken to tell."""
    if len(line) > MAX_LINE:
        return None
    try:
        data = _DECODER.decode(line.decode("utf-8"))
        return _req_id(data.get("id")) if isinstance(data, dict) else None
    except (ValueError, RecursionError, ProtocolError):
        return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def encode(message: dict[str, Any]) -> bytes:
    """One message as a line: compact JSON, no NaN, newline-terminated."""
    return (_ENCODER.encode(message) + "\n").encode()


def _default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "to_dict"):
        return value.to_dict()
    raise TypeError(f"cannot encode {type(value).__name__}")


# Made once: json.loads/json.dumps with any option build a new decoder/encoder on every call,
# a share of what each request cost gpuenvd (docs/operations/scale.md).
_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, default=_default)


def ok_reply(req_id: Any, **fields: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "id": req_id, "ok": True, **fields}


def error_reply(req_id: Any, err: BaseException) -> dict[str, Any]:
    """An error reply; a GpuenvError keeps its type name, gpu, hint (and owner for conflicts)."""
    if isinstance(err, GpuenvError):
        body: dict[str, Any] = {"type": type(err).__name__, "message": err.message}
        if err.hint:
            body["hint"] = err.hint
        if err.gpu is not None:
            body["gpu"] = err.gpu if isinstance(err.gpu, (int, str)) else str(err.gpu)
        owner = getattr(err, "owner", None)
        if isinstance(owner, str):
            body["owner"] = owner
    else:
        body = {
            "type": "InternalError",
            "message": f"the daemon failed: {type(err).__name__}: {err}"[:500],
        }
    return {"v": PROTOCOL_VERSION, "id": req_id, "ok": False, "error": body}


def event(name: str, **fields: Any) -> dict[str, Any]:
    return {"v": PROTOCOL_VERSION, "event": name, **fields}


def request(op: str, req_id: Any = None, **fields: Any) -> dict[str, Any]:
    """A request message (for clients): None-valued fields are left out."""
    msg: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": req_id, "op": op}
    msg.update({k: v for k, v in fields.items() if v is not None})
    return msg


class LineReader:
    """Split a byte stream into lines of at most MAX_LINE bytes.

    `feed(data)` returns the complete lines it finished; a line that grows past
    the limit is reported once as `None` (so the caller can answer with an
    error) and the rest of it, up to its newline, is dropped.
    """

    def __init__(self, limit: int = MAX_LINE):
        self.limit = limit
        self._buf = bytearray()
        self._discarding = False

    def feed(self, data: bytes) -> list[bytes | None]:
        out: list[bytes | None] = []
        start = 0
        while start < len(data):
            nl = data.find(b"\n", start)
            chunk = data[start:] if nl < 0 else data[start:nl]
            if self._discarding:
                if nl >= 0:
                    self._discarding = False
            else:
                self._buf += chunk
                if len(self._buf) + 1 > self.limit:
                    self._buf.clear()
                    out.append(None)
                    if nl < 0:
                        self._discarding = True
                elif nl >= 0:
                    line = bytes(self._buf)
                    self._buf.clear()
                    if line.strip():
                        out.append(line)
            if nl < 0:
                break
            start = nl + 1
        return out

    @property
    def pending(self) -> int:
        return len(self._buf)
