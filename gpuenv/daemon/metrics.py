"""gpuenvd's optional Prometheus endpoint (the `prometheus` extra: prometheus-client).

What DCGM exporter gives (clocks, power, temperatures, energy, time under each
clock-event reason) plus what it cannot: whether the clocks are locked, whether
the lock holds, by whom, and the daemon's lease counts. A cluster's
Prometheus/Grafana then sees which nodes benchmark under locked clocks.

Every per-GPU series carries dcgm-exporter's labels, spelled as it spells them
(`gpu`, `UUID`, `pci_bus_id`, `device` = "nvidia<minor>", `modelName`, and the host
both as `Hostname`, its last release's spelling, and `hostname`, its main branch's), so
the two join: `DCGM_FI_DEV_SM_CLOCK and on(UUID) gpuenv_lock_active == 1` keeps DCGM's
clock of the locked GPUs. The two exporters listen on different ports, so their
`instance` labels differ: the scrape jobs gpuenv ships (`gpuenv ops show scrape`) relabel
both to the host, which makes NVIDIA's dcgm-exporter dashboard (it filters on `instance`)
and gpuenv's dashboard pick the same nodes and `on(instance, UUID)` joins match. Reasons are named
in one vocabulary, NVML's (gpuenv.reasons: `SwPowerCap`, `SwThermalSlowdown`...),
in both the active-reason gauge and the time-under-reason counter. No label names a
process (holders are counted per user and kind), so series do not grow with jobs.

Values come from the daemon's own sampler and journal (a custom collector: no label set
goes stale when a lock ends), rendered at most once a second into a snapshot that every
scrape in between is served; the HTTP side is metrics_http.py (one thread, a bounded
number of connections, each with a deadline). prometheus-client is imported only when
the endpoint starts. Bound to 127.0.0.1 unless the config says
otherwise; `--metrics ADDRESS` serves on DEFAULT_PORT, 19400 (the Prometheus wiki's
exporter range 9100-9999 is fully allocated; 9400 is dcgm-exporter's).
"""

from __future__ import annotations

import contextlib
import platform
import socket
from collections.abc import Iterator
from typing import Any

from gpuenv.daemon.auth import METRICS_PORT, parse_listen
from gpuenv.daemon.serverview import Server
from gpuenv.errors import ConfigError, GpuenvError
from gpuenv.reasons import COUNTERS, REASON_NAMES, info

DEFAULT_PORT = METRICS_PORT
# dcgm-exporter's per-GPU labels (its render_metrics.go): the join keys. The host twice:
# `Hostname` in its releases up to 4.x, `hostname` on its main branch (renamed May 2026).
GPU_LABELS = ["gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "hostname"]
THRESHOLDS = {
    "slowdown": "slowdown_c",
    "shutdown": "shutdown_c",
    "gpu_max_operating": "gpu_max_c",
    "memory_max_operating": "mem_max_c",
}


def counter_reason(counter: str) -> str | None:
    """The reason label of a time-under-reason counter, in NVML's names: the bits it counts
    ("SwPowerCap"; the thermal counter counts two: "SwThermalSlowdown|HwThermalSlowdown").
    None for the counters that are no reason (time below application or base clocks)."""
    names = [name for bit, name in REASON_NAMES.items() if info(bit).counter == counter]
    return "|".join(names) or None


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError(
            "the metrics endpoint needs prometheus-client",
            hint="pip install prometheus-client, or leave out --metrics / [daemon] metrics",
        ) from None
    return prometheus_client


class GpuenvCollector:
    """Builds every metric family from the server's state at collect() time."""

    def __init__(self, server: Server):
        self.server = server
        self.hostname = socket.gethostname()
        self._static: dict[int, dict[str, Any]] = {}

    def describe(self) -> list[Any]:
        return []  # nothing fixed: registering must not call collect() before the daemon runs

    def static(self, index: int) -> dict[str, Any]:
        """What never changes while the daemon runs: thresholds, driver, device (read once)."""
        if index not in self._static:
            backend = self.server.backend
            # dcgm-exporter's `device`: the /dev/nvidiaN node, N the minor number (not the index)
            out: dict[str, Any] = {"thresholds": {}, "driver": "", "device": f"nvidia{index}"}
            with contextlib.suppress(GpuenvError):
                minor = backend.details(index).minor_number
                if minor is not None:
                    out["device"] = f"nvidia{minor}"
            with contextlib.suppress(GpuenvError):
                th = backend.thresholds(index)
                out["thresholds"] = {
                    k: getattr(th, a) for k, a in THRESHOLDS.items() if getattr(th, a) is not None
                }
            with contextlib.suppress(GpuenvError):
                out["driver"] = str(backend.driver_version())
            self._static[index] = out
        return self._static[index]

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

        build = InfoMetricFamily(
            "gpuenv_build",
            "gpuenv's version (1 while gpuenvd runs)",
            labels=["version", "python_version"],
        )
        from gpuenv import __version__

        build.add_metric([__version__, platform.python_version()], {})
        yield build
        fams = _gpu_families()
        for dev in self.server.infos:
            self._add_gpu(fams, dev)
        yield from fams.values()
        yield from self._daemon_families(GaugeMetricFamily)
        from gpuenv.daemon.jobs import job_metrics

        yield from job_metrics(self.server)
        from gpuenv.daemon.fleet import check_metrics, fleet_metrics

        yield from fleet_metrics(self.server, self.hostname)
        yield from check_metrics(self.server, self.hostname)

    def _add_gpu(self, fams: dict[str, Any], dev: Any) -> None:
        server, index = self.server, dev.index
        static = self.static(index)
        labels = [
            str(index),
            dev.uuid,
            dev.pci_bus_id,
            static["device"],
            dev.name,
            self.hostname,
            self.hostname,
        ]
        fams["info"].add_metric([*labels, static["driver"]], {})
        for kind, value in static["thresholds"].items():
            fams["threshold"].add_metric([*labels, kind], value)
        with contextlib.suppress(GpuenvError):
            fams["power_limit"].add_metric(labels, server.backend.power_limits(index).limit_w)
        sample = server.sampler.latest(index)
        if sample is not None:
            fams["sm"].add_metric(labels, sample.sm_mhz)
            fams["mem"].add_metric(labels, sample.mem_mhz)
            fams["power"].add_metric(labels, sample.power_w)
            fams["temp"].add_metric(labels, sample.temp_c)
            for bit, name in REASON_NAMES.items():
                fams["reason"].add_metric([*labels, name], 1.0 if sample.reasons & bit else 0.0)
        slow = server.sampler.slow_samples(t0=server.clock.now() - 10.0, gpu=index)
        counted = [s for s in slow if s.reason_ns]
        for counter in COUNTERS if counted else ():
            if counter.name not in counted[-1].reason_ns:
                continue
            seconds = counted[-1].reason_ns[counter.name] / 1e9
            reason = counter_reason(counter.name)
            if reason is not None:
                fams["reason_s"].add_metric([*labels, reason], seconds)
            else:
                fams["below_s"].add_metric([*labels, counter.name.split("_")[1]], seconds)
        energies = [s.energy_mj for s in slow if s.energy_mj is not None]
        if energies:
            fams["energy"].add_metric(labels, energies[-1] / 1000.0)
        temps = [s.mem_temp_c for s in slow if s.mem_temp_c is not None]
        if temps:
            fams["mem_temp"].add_metric(labels, temps[-1])
        self._add_lock(fams, labels, index, sample)

    def _add_lock(self, fams: dict[str, Any], labels: list[str], index: int, sample: Any) -> None:
        status = self.server.leases.gpu_status(index)
        fams["locked"].add_metric(labels, 1.0 if status["locked"] else 0.0)
        live = [o for o in status["owners"] if o.get("alive", True)]
        stale = bool(status["locked"]) and not live
        fams["stale"].add_metric(labels, 1.0 if stale else 0.0)
        rng = self.server.leases.lock_range(index)
        if rng is not None:
            fams["lock_sm"].add_metric([*labels, "min"], rng[0])
            fams["lock_sm"].add_metric([*labels, "max"], rng[1])
            if sample is not None:
                from gpuenv.clocks.status import lock_holds

                fams["holds"].add_metric(labels, 1.0 if lock_holds(sample.sm_mhz, rng) else 0.0)
        holders: dict[tuple[str, str], int] = {}
        for owner in live:
            key = (str(owner["user"]), str(owner["kind"]))
            holders[key] = holders.get(key, 0) + 1
        for (user, kind), n in sorted(holders.items()):
            fams["holders"].add_metric([*labels, user, kind], n)

    def _daemon_families(self, gauge: Any) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        server = self.server
        counts = server.leases.counters()
        leases = gauge("gpuenv_leases", "Leases held through gpuenvd", labels=["kind"])
        leases.add_metric(["connection"], counts["leases_connection"])
        leases.add_metric(["standing"], counts["leases_standing"])
        yield leases
        for name in ("grants", "releases", "refusals"):
            c = CounterMetricFamily(
                f"gpuenv_lease_{name}", f"Lease {name} since the daemon started"
            )
            c.add_metric([], counts[name])
            yield c
        conns = gauge("gpuenv_daemon_connections", "Open client connections")
        conns.add_metric([], server.connections())
        yield conns
        dropped = CounterMetricFamily(
            "gpuenv_daemon_subscribers_dropped",
            "Subscribers dropped for not reading what they were streamed",
        )
        dropped.add_metric([], server.subscribers_dropped())
        yield dropped
        endpoint = getattr(server, "_metrics", None)
        if endpoint is not None:
            refused = CounterMetricFamily(
                "gpuenv_metrics_connections_refused",
                "Metrics connections closed early: the endpoint's limit was open",
            )
            refused.add_metric([], endpoint.http.refused)
            yield refused
        up = gauge("gpuenv_daemon_start_time_seconds", "When gpuenvd started (epoch)")
        up.add_metric([], server.started_at)
        yield up
        scraped = gauge("gpuenv_scrape_time_seconds", "When this scrape was built (epoch)")
        scraped.add_metric([], server.clock.wall())
        yield scraped


def _gpu_families() -> dict[str, Any]:
    """The per-GPU metric families, empty, each with dcgm-exporter's labels first."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

    gl = GPU_LABELS

    def gauge(name: str, doc: str, *extra: str) -> Any:
        return GaugeMetricFamily(name, doc, labels=[*gl, *extra])

    return {
        "info": InfoMetricFamily(
            "gpuenv_gpu", "GPUs gpuenvd watches", labels=[*gl, "driver_version"]
        ),
        "sm": gauge("gpuenv_sm_clock_mhz", "SM clock (nvidia-smi clocks.sm)"),
        "mem": gauge("gpuenv_mem_clock_mhz", "Memory clock (nvidia-smi clocks.mem)"),
        "power": gauge("gpuenv_power_watts", "Power draw, the driver's 1 s average"),
        "power_limit": gauge(
            "gpuenv_power_limit_watts", "Enforced power limit (nvidia-smi power.limit)"
        ),
        "temp": gauge("gpuenv_temperature_celsius", "GPU temperature"),
        "mem_temp": gauge(
            "gpuenv_memory_temperature_celsius",
            "HBM temperature (NVML field 82; absent without a sensor)",
        ),
        "threshold": gauge(
            "gpuenv_temperature_threshold_celsius",
            "Temperature thresholds: slowdown, shutdown, GPU and memory max "
            "operating (nvidia-smi -q -d TEMPERATURE)",
            "threshold",
        ),
        "reason": gauge(
            "gpuenv_clock_event_reason_active",
            "1 while a clock-event (throttle) reason is active (NVML's names)",
            "reason",
        ),
        "reason_s": CounterMetricFamily(
            "gpuenv_clock_event_reason_seconds",
            "Time under each clock-event reason since driver load (NVML violation counters; "
            "NVML's names, '|' where one counter counts two reasons)",
            labels=[*gl, "reason"],
        ),
        "below_s": CounterMetricFamily(
            "gpuenv_clocks_below_seconds",
            "Time below the application or base clocks since driver load (NVML counters)",
            labels=[*gl, "clocks"],
        ),
        "energy": CounterMetricFamily(
            "gpuenv_energy_joules", "Energy since driver load", labels=gl
        ),
        "locked": gauge("gpuenv_lock_active", "1 while gpuenv holds a lock on the GPU"),
        "stale": gauge(
            "gpuenv_lock_stale",
            "1 while a lock stays whose every owner has ended ('gpuenv restore')",
        ),
        "holds": gauge(
            "gpuenv_lock_holds",
            "1 while the SM clock is inside the locked range (0: pulled out of it)",
        ),
        "lock_sm": gauge("gpuenv_lock_sm_mhz", "Locked SM clock range", "bound"),
        "holders": gauge(
            "gpuenv_lock_holders", "Live owners of the lock, per user and kind", "user", "kind"
        ),
    }


def registry_for(server: Server) -> Any:
    """A fresh CollectorRegistry holding only gpuenvd's collector."""
    prom = _prometheus()
    registry = prom.CollectorRegistry(auto_describe=False)
    registry.register(GpuenvCollector(server))
    return registry


def render(server: Server) -> bytes:
    """The exposition text a scrape would get (for tests and `gpuenv daemon metrics`)."""
    return bytes(_prometheus().generate_latest(registry_for(server)))


class MetricsEndpoint:
    """The HTTP endpoint's handle: `stop()` shuts it down."""

    def __init__(self, http: Any, host: str, port: int):
        self.http = http
        self.host = host
        self.port = port

    def stop(self) -> None:
        self.http.stop()


def _bind_hint(err: OSError, host: str, port: int) -> str:
    """What to do about a failed bind: the port is taken or privileged, or the host is
    not this machine's (only then is another port no help)."""
    import errno
    import socket

    if err.errno == errno.EADDRINUSE:
        return (
            f"choose another port (--metrics {host}:{port + 1}), or stop what listens "
            f"on {port} (ss -ltnp 'sport = :{port}')"
        )
    if err.errno == errno.EACCES:
        return (
            f"ports below 1024 need root: choose one above 1023 (--metrics {host}:{METRICS_PORT})"
        )
    if isinstance(err, socket.gaierror) or err.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
        return (
            f"{host} is not an address of this machine: listen on 127.0.0.1, 0.0.0.0 "
            f"or one of its own addresses (ip -brief addr)"
        )
    return f"check the address, or choose another port (--metrics 127.0.0.1:{METRICS_PORT})"


def start_metrics(server: Server, listen: str) -> MetricsEndpoint:
    """Serve /metrics on `listen` ("127.0.0.1:19400"; port 0 picks a free one)."""
    import logging

    from gpuenv.daemon.metrics_http import MetricsHTTP

    host, port = parse_listen(listen)
    prom = _prometheus()
    registry = registry_for(server)
    try:
        http = MetricsHTTP(
            host, port, lambda: bytes(prom.generate_latest(registry)), clock=server.clock.now
        )
    except OSError as err:
        raise ConfigError(
            f"cannot serve metrics on {host}:{port}: {err.strerror or err}",
            hint=_bind_hint(err, host, port),
        ) from None
    logging.getLogger("gpuenv.daemon").info(
        "Prometheus metrics on http://%s:%d/metrics", host, http.port
    )
    return MetricsEndpoint(http, host, http.port)
