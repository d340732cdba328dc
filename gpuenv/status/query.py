"""`gpuenv status --query-gpu=FIELDS --format=csv[,noheader][,nounits]`: nvidia-smi's own query.

Field names, aliases, units and value formats are nvidia-smi's (driver 580 on an H100,
tests/data/nvidia_smi): the header names each field by its canonical name with its unit
in brackets (`clocks.sm` -> `clocks.current.sm [MHz]`, with `nounits` too), values carry
the unit ("1980 MHz", "72.45 W", "0 %") unless `nounits`, cells are joined by ", ", a
value the GPU does not offer reads "[N/A]", one this user may not read "[Insufficient
Permissions]", and a field nvidia-smi does not know is refused with its own sentence.
Fields of gpuenv's own are named `gpuenv.*`. `help_text()` is `--help-query-gpu`.

Each GPU is read lazily: a query asks the backend only for what its fields need.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuenv.backend import Backend
from gpuenv.errors import ConfigError, GpuenvError, GpuLost, NotSupported, PermissionDenied
from gpuenv.reasons import Reason, reason_names
from gpuenv.status.nvsmi_fields import DETAIL_SPECS, UNANSWERED, enabled, order_key

NA = "[N/A]"
NO_PERMISSION = "[Insufficient Permissions]"
GPU_LOST = "[GPU is lost]"
UNKNOWN_ERROR = "[Unknown Error]"


class Unavailable(Exception):
    """A value that cannot be shown: `token` is what nvidia-smi prints in its place."""

    def __init__(self, token: str, error: GpuenvError | None = None):
        super().__init__(token)
        self.token = token
        self.error = error  # a failure worth an exit code (not "not supported")


class GpuReads:
    """One GPU's readings for one query, each read at most once and only when asked."""

    def __init__(self, backend: Backend, index: int, wall: float):
        self.backend = backend
        self.index = index
        self.wall = wall
        self.pair: tuple[int, int] = (0, 0)  # (memory, graphics) MHz: --supported-clocks rows
        self._cache: dict[str, Any] = {}

    def with_pair(self, mem_mhz: int, gr_mhz: int) -> GpuReads:
        """The same GPU's readings (shared, read once), for one supported clock pair."""
        other = GpuReads(self.backend, self.index, self.wall)
        other._cache = self._cache
        other.pair = (mem_mhz, gr_mhz)
        return other

    def get(self, what: str) -> Any:
        """The backend's `what` for this GPU (a method name), or Unavailable."""
        if what not in self._cache:
            try:
                if what in ("driver_version", "device_count"):
                    self._cache[what] = getattr(self.backend, what)()
                elif what == "read_slow_cheap":  # no energy counter: it costs ~3 ms
                    self._cache[what] = self.backend.read_slow(self.index, energy=False)
                elif what == "lock":
                    from gpuenv.status import lock_info

                    self._cache[what] = lock_info(self.backend, self.index)
                else:
                    self._cache[what] = getattr(self.backend, what)(self.index)
            except NotSupported:
                self._cache[what] = Unavailable(NA)
            except PermissionDenied:
                self._cache[what] = Unavailable(NO_PERMISSION)
            except GpuLost as err:
                self._cache[what] = Unavailable(GPU_LOST, err)
            except GpuenvError as err:
                self._cache[what] = Unavailable(UNKNOWN_ERROR, err)
        value = self._cache[what]
        if isinstance(value, Unavailable):
            raise value
        if value is None:
            raise Unavailable(NA)
        return value


@dataclass(frozen=True)
class QueryField:
    """One queryable property: its names (canonical first), unit and how to read it."""

    names: tuple[str, ...]
    help: str
    read: Callable[[GpuReads], Any]  # the value, or None / Unavailable when there is none
    unit: str | None = None  # "MHz", "W", "%", "MiB", "us": in the header and after values
    show: Callable[[Any], str] = str

    @property
    def name(self) -> str:
        return self.names[0]


def present(value: Any) -> Any:
    if value is None:
        raise Unavailable(NA)
    return value


def _watts(v: Any) -> str:
    return f"{float(v):.2f}"


def _int(v: Any) -> str:
    return f"{float(v):.0f}"


def _mask(v: Any) -> str:
    return f"0x{int(v):016X}"


def timestamp_text(r: GpuReads) -> str:
    t = datetime.datetime.fromtimestamp(r.wall)
    return t.strftime("%Y/%m/%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}"


def _reason(bit: Reason) -> Callable[[GpuReads], str]:
    def read(r: GpuReads) -> str:
        return "Active" if r.get("read_fast").reasons & int(bit) else "Not Active"

    return read


def _lock_range(r: GpuReads) -> str:
    lock = r.get("lock")
    if lock["state"] == "unknown":
        raise Unavailable(UNKNOWN_ERROR)
    if lock["state"] != "locked" or not lock["sm_mhz"]:
        raise Unavailable(NA)  # nvidia-smi's word for "no value", as a script expects
    lo, hi = lock["sm_mhz"]
    return f"{lo}" if lo == hi else f"{lo}-{hi}"


def _lock_state(r: GpuReads) -> str:
    lock = r.get("lock")
    if lock["state"] != "locked":
        return str(lock["state"])
    if lock.get("stale"):
        return "stale"
    return {True: "held", False: "not held"}.get(lock.get("holds"), "locked")


_REASON_FIELDS = (
    (
        "gpu_idle",
        Reason.GPU_IDLE,
        "Nothing is running on the GPU and the clocks are dropping to Idle state.",
    ),
    (
        "applications_clocks_setting",
        Reason.APP_CLOCKS,
        "GPU clocks are limited by the applications clocks setting.",
    ),
    (
        "sw_power_cap",
        Reason.SW_POWER_CAP,
        "SW Power Scaling algorithm is reducing the clocks "
        "below requested clocks because the GPU is consuming too much power.",
    ),
    (
        "hw_slowdown",
        Reason.HW_SLOWDOWN,
        "HW Slowdown (reducing the core clocks by a factor of "
        "2 or more) is engaged (thermal or power brake).",
    ),
    (
        "hw_thermal_slowdown",
        Reason.HW_THERMAL,
        "HW Thermal Slowdown is engaged: the temperature is too high.",
    ),
    (
        "hw_power_brake_slowdown",
        Reason.HW_POWER_BRAKE,
        "HW Power Brake Slowdown is engaged "
        "(External Power Brake Assertion, e.g. by the power supply).",
    ),
    (
        "sw_thermal_slowdown",
        Reason.SW_THERMAL,
        "SW Thermal capping is reducing clocks: the GPU is hotter than its Max Operating Temp.",
    ),
    (
        "sync_boost",
        Reason.SYNC_BOOST,
        "This GPU is in a Sync Boost group and runs at the group's lowest possible clock.",
    ),
)


def _reason_fields() -> list[QueryField]:
    out = [
        QueryField(
            ("clocks_event_reasons.supported", "clocks_throttle_reasons.supported"),
            "Bitmask of supported clock event reasons (nvml.h).",
            lambda r: r.get("supported_reasons"),
            show=_mask,
        ),
        QueryField(
            ("clocks_event_reasons.active", "clocks_throttle_reasons.active"),
            "Bitmask of active clock event reasons (nvml.h).",
            lambda r: r.get("read_fast").reasons,
            show=_mask,
        ),
    ]
    for name, bit, text in _REASON_FIELDS:
        out.append(
            QueryField(
                (f"clocks_event_reasons.{name}", f"clocks_throttle_reasons.{name}"),
                text,
                _reason(bit),
            )
        )
    return out


_CLOCK: dict[str, Any] = {"unit": "MHz", "show": _int}
_WATT: dict[str, Any] = {"unit": "W", "show": _watts}


def _lim(r: GpuReads) -> Any:
    return r.get("clock_limits")


def _power(r: GpuReads) -> Any:
    return r.get("power_limits")


def _app(r: GpuReads) -> Any:
    return r.get("app_clocks")


# nvidia-smi's fields that gpuenv reads itself, then gpuenv's own; FIELDS adds nvsmi_fields'.
_OWN_FIELDS: tuple[QueryField, ...] = (
    QueryField(
        ("timestamp",), 'When the query was made, as "YYYY/MM/DD HH:MM:SS.msec".', timestamp_text
    ),
    QueryField(
        ("driver_version",),
        "The version of the installed NVIDIA display driver.",
        lambda r: r.get("driver_version"),
    ),
    QueryField(
        ("count",), "The number of NVIDIA GPUs in the system.", lambda r: r.get("device_count")
    ),
    QueryField(
        ("name", "gpu_name"),
        "The official product name of the GPU.",
        lambda r: r.get("device_info").name,
    ),
    QueryField(
        ("serial", "gpu_serial"),
        "The serial number printed on the board.",
        lambda r: present(r.get("device_info").serial),
    ),
    QueryField(
        ("uuid", "gpu_uuid"),
        "The globally unique immutable identifier of the GPU.",
        lambda r: r.get("device_info").uuid,
    ),
    QueryField(
        ("pci.bus_id", "gpu_bus_id"),
        'PCI bus id as "domain:bus:device.function".',
        lambda r: r.get("device_info").pci_bus_id,
    ),
    QueryField(
        ("index",), "Zero based NVML index of the GPU (nvidia-smi's order).", lambda r: r.index
    ),
    QueryField(
        ("persistence_mode",),
        'Whether persistence mode is on: "Enabled" or "Disabled".',
        lambda r: r.get("persistence_mode"),
        show=enabled,
    ),
    QueryField(
        ("pstate",),
        "The performance state, P0 (maximum performance) to P12.",
        lambda r: r.get("performance_state"),
        show=lambda v: f"P{v}",
    ),
    *_reason_fields(),
    QueryField(
        ("memory.total",),
        "Total installed GPU memory.",
        lambda r: r.get("memory").total_mib,
        unit="MiB",
    ),
    QueryField(
        ("memory.used",),
        "Total memory allocated by active contexts.",
        lambda r: r.get("memory").used_mib,
        unit="MiB",
    ),
    QueryField(
        ("compute_cap",),
        "The CUDA Compute Capability, as major.minor.",
        lambda r: ".".join(map(str, present(r.get("device_info").compute_capability))),
    ),
    QueryField(
        ("utilization.gpu",),
        "Percent of time over the past sample period during "
        "which one or more kernels was executing on the GPU.",
        lambda r: r.get("utilization")[0],
        unit="%",
    ),
    QueryField(
        ("utilization.memory",),
        "Percent of time over the past sample period during "
        "which device memory was being read or written.",
        lambda r: r.get("utilization")[1],
        unit="%",
    ),
    QueryField(
        ("temperature.gpu",),
        "Core GPU temperature, in degrees C.",
        lambda r: r.get("read_fast").temp_c,
        show=_int,
    ),
    QueryField(
        ("temperature.memory",),
        "HBM memory temperature, in degrees C.",
        lambda r: present(r.get("read_slow_cheap").mem_temp_c),
        show=_int,
    ),
    QueryField(
        ("power.draw",),
        "The last measured power draw of the board, in watts (a 1 s average on Ampere and newer).",
        lambda r: r.get("read_fast").power_w,
        **_WATT,
    ),
    QueryField(
        ("power.draw.instant", "gpu.power.draw.instant"),
        "The last measured instant power draw of the board, in watts.",
        lambda r: present(r.get("read_fast").power_instant_w),
        **_WATT,
    ),
    QueryField(
        ("power.limit", "gpu.power.requested_limit"),
        "The software power limit, in watts (nvidia-smi -pl).",
        lambda r: _power(r).limit_w,
        **_WATT,
    ),
    QueryField(
        ("enforced.power.limit", "gpu.power.current_limit"),
        "The power ceiling the "
        "power management algorithm enforces, in watts (gpuenv reads the limit set: "
        "they differ only when another limiter is lower).",
        lambda r: _power(r).limit_w,
        **_WATT,
    ),
    QueryField(
        ("power.default_limit", "gpu.power.default_limit"),
        "The default power limit, in watts.",
        lambda r: _power(r).default_w,
        **_WATT,
    ),
    QueryField(
        ("power.min_limit", "gpu.power.min_limit"),
        "The lowest power limit that can be set, in watts.",
        lambda r: _power(r).min_w,
        **_WATT,
    ),
    QueryField(
        ("power.max_limit", "gpu.power.max_limit"),
        "The highest power limit that can be set, in watts.",
        lambda r: _power(r).max_w,
        **_WATT,
    ),
    QueryField(
        ("clocks.current.graphics", "clocks.gr"),
        "Current frequency of the graphics (shader) clock.",
        lambda r: r.get("read_fast").sm_mhz,
        **_CLOCK,
    ),
    QueryField(
        ("clocks.current.sm", "clocks.sm"),
        "Current frequency of the SM (Streaming Multiprocessor) clock.",
        lambda r: r.get("read_fast").sm_mhz,
        **_CLOCK,
    ),
    QueryField(
        ("clocks.current.memory", "clocks.mem"),
        "Current frequency of the memory clock.",
        lambda r: r.get("read_fast").mem_mhz,
        **_CLOCK,
    ),
    QueryField(
        ("clocks.applications.graphics", "clocks.applications.gr"),
        "Applications clock of graphics (nvidia-smi -ac).",
        lambda r: _app(r).sm_mhz,
        **_CLOCK,
    ),
    QueryField(
        ("clocks.applications.memory", "clocks.applications.mem"),
        "Applications clock of memory (nvidia-smi -ac).",
        lambda r: _app(r).mem_mhz,
        **_CLOCK,
    ),
    QueryField(
        ("clocks.default_applications.graphics", "clocks.default_applications.gr"),
        "Default applications clock of graphics.",
        lambda r: _lim(r).default_app_sm_mhz,
        **_CLOCK,
    ),
    QueryField(
        ("clocks.default_applications.memory", "clocks.default_applications.mem"),
        "Default applications clock of memory.",
        lambda r: _lim(r).default_app_mem_mhz,
        **_CLOCK,
    ),
    QueryField(
        ("clocks.max.graphics", "clocks.max.gr"),
        "Maximum frequency of the graphics clock.",
        lambda r: _lim(r).max_sm_mhz,
        **_CLOCK,
    ),
    QueryField(
        ("clocks.max.sm",),
        "Maximum frequency of the SM clock.",
        lambda r: _lim(r).max_sm_mhz,
        **_CLOCK,
    ),
    QueryField(
        ("clocks.max.memory", "clocks.max.mem"),
        "Maximum frequency of the memory clock.",
        lambda r: _lim(r).max_mem_mhz,
        **_CLOCK,
    ),
    QueryField(
        ("mig.mode.current",),
        'Whether MIG mode is on: "Enabled" or "Disabled".',
        lambda r: present(r.get("device_info").mig_mode),
        show=enabled,
    ),
    # gpuenv's own: what nvidia-smi cannot say (NVML has no getter for locked clocks)
    QueryField(
        ("gpuenv.lock",),
        "gpuenv's clock lock on the GPU: none, held, not held "
        "(the SM clock is outside the locked range now), stale or unknown.",
        _lock_state,
    ),
    QueryField(
        ("gpuenv.lock.sm",),
        'The SM clock range gpuenv locked, in MHz ("1350" or '
        '"1200-1350"), or [N/A] when gpuenv holds no lock.',
        _lock_range,
    ),
    QueryField(
        ("gpuenv.reasons",),
        "The active clock event reasons in words, joined by "
        "'|' (GpuIdle, SwPowerCap, ...), or None.",
        lambda r: "|".join(reason_names(r.get("read_fast").reasons)) or "None",
    ),
    QueryField(
        ("gpuenv.slowdown_temp",),
        "The temperature at which the GPU slows down (HW slowdown threshold), in degrees C.",
        lambda r: present(r.get("thresholds").slowdown_c),
        show=_int,
    ),
)


def _unanswered(line: str) -> QueryField:
    """ "names [unit]" of a field gpuenv does not read: [N/A] on every GPU."""
    names, _, unit = line.partition(" [")
    return QueryField(
        tuple(names.split()),
        "Not read by gpuenv: always [N/A].",
        lambda r: None,
        unit=unit.rstrip("]") or None,
    )


# Every field, in --help-query-gpu's order (nvidia-smi's), gpuenv's own last.
FIELDS: tuple[QueryField, ...] = tuple(
    sorted(
        (
            *_OWN_FIELDS,
            *(
                QueryField(names, help_, read, unit, show)
                for names, help_, read, unit, show in DETAIL_SPECS
            ),
            *(_unanswered(line) for line in UNANSWERED),
        ),
        key=lambda f: order_key(f.name),
    )
)


def field(name: str) -> QueryField:
    """The --query-gpu field called `name` (or an alias of it)."""
    return parse_fields(name)[0]


@dataclass(frozen=True)
class CsvFormat:
    """`--format=csv[,noheader][,nounits]`."""

    header: bool = True
    units: bool = True


def parse_format(text: str) -> CsvFormat:
    """`--format`'s value, as nvidia-smi reads it: csv is mandatory, options in any order."""
    opts = [p.strip().lower() for p in text.split(",") if p.strip()]
    unknown = [o for o in opts if o not in ("csv", "noheader", "nounits")]
    if unknown or "csv" not in opts:
        what = f"'{unknown[0]}' is not a format option" if unknown else "csv is missing"
        raise ConfigError(
            f"--format={text}: {what}",
            hint="use --format=csv, optionally with noheader and nounits: "
            "--format=csv,noheader,nounits",
        )
    return CsvFormat(header="noheader" not in opts, units="nounits" not in opts)


def parse_fields(
    text: str, table: Sequence[QueryField] = FIELDS, switch: str = "--query-gpu"
) -> list[QueryField]:
    """`--query-gpu`'s value: comma-separated names or aliases of `table`, in the order given."""
    by_name = {n.lower(): f for f in table for n in f.names}
    names = [p.strip() for p in text.split(",")]
    helper = f"'gpuenv status --help-{switch[2:]}'"
    if not any(names):
        raise ConfigError(f"{switch} needs at least one field", hint=f"{helper} lists them")
    out = []
    for name in names:
        found = by_name.get(name.lower())
        if found is None:
            raise ConfigError(  # nvidia-smi's own sentence, then where to look
                f'Field "{name}" is not a valid field to query. {helper} lists the valid ones.'
            )
        out.append(found)
    return out


def header_line(fields: Sequence[QueryField], fmt: CsvFormat) -> str:
    """`index, name, clocks.current.sm [MHz]`: canonical names with their units. nvidia-smi
    580 keeps the units in the header under `nounits` too (recorded on an H100): only the
    values lose them."""
    del fmt  # the header is the same for every format: nvidia-smi's
    return ", ".join(f"{f.name} [{f.unit}]" if f.unit else f.name for f in fields)


def query_rows(
    backend: Backend, gpus: Sequence[int], fields: Sequence[QueryField], fmt: CsvFormat
) -> tuple[list[str], list[str]]:
    """One CSV line per GPU, and the errors (lost GPU, timeout) that made a cell unreadable."""
    wall = backend.clock.wall()
    return csv_rows([GpuReads(backend, index, wall) for index in gpus], fields, fmt)


def csv_rows(
    rows: Sequence[GpuReads], fields: Sequence[QueryField], fmt: CsvFormat
) -> tuple[list[str], list[str]]:
    """One CSV line per reading, and the errors that made a cell unreadable."""
    lines: list[str] = []
    errors: list[str] = []
    for reads in rows:
        cells = []
        for f in fields:
            try:
                value = f.read(reads)
                if value is None:
                    raise Unavailable(NA)
                text = f.show(value)
                if f.unit and fmt.units:
                    text += f" {f.unit}"
            except Unavailable as gap:
                text = gap.token
                error = f"GPU {reads.index}: {gap.error}"
                if gap.error is not None and error not in errors:
                    errors.append(error)
            cells.append(text)
        lines.append(", ".join(cells))
    return lines, errors


def help_text(table: Sequence[QueryField] = FIELDS, switch: str = "--query-gpu") -> str:
    """`gpuenv status --help-query-gpu`, in nvidia-smi's layout: each field's names
    (canonical first, then aliases, joined by " or "), one line about it, a blank line."""
    out = [f'List of valid properties to query for the switch "{switch}":', ""]
    for f in table:
        out.append(" or ".join(f'"{n}"' for n in f.names))
        out.append(f.help)
        out.append("")
    return "\n".join(out)


__all__ = [
    "FIELDS",
    "CsvFormat",
    "GpuReads",
    "QueryField",
    "csv_rows",
    "field",
    "header_line",
    "help_text",
    "parse_fields",
    "parse_format",
    "present",
    "query_rows",
    "timestamp_text",
]
