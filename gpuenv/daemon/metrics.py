"""gpuenvd's optional Prometheus endpoint (`pip install 'gpuenv[prometheus]'`).

What DCGM exporter gives (clocks, power, temperature, energy, time under each
clock-event reason) plus what it cannot: whether the clocks are locked, by
whom, and the daemon's lease counts. A cluster's Prometheus/Grafana then sees
which nodes benchmark under locked clocks.

Values come from the daemon's own sampler and journal at scrape time (a custom
collector: no label set goes stale when a lock ends). prometheus-client is
imported only when the endpoint starts. Bound to 127.0.0.1 unless the config
says otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Protocol

from gpuenv.backend import REASON_NAMES, DeviceInfo
from gpuenv.daemon.auth import parse_listen
from gpuenv.daemon.leases import LeaseManager
from gpuenv.errors import ConfigError
from gpuenv.telemetry import Sampler
from gpuenv.timebase import Clock


class Server(Protocol):
    """What the endpoint reads of the daemon (gpuenv.daemon.server.Server is one)."""

    infos: list[DeviceInfo]
    sampler: Sampler
    clock: Clock
    leases: LeaseManager
    started_at: float
    requests: int
    protocol_errors: int

    def connections(self) -> int: ...


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError(
            "the metrics endpoint needs prometheus-client",
            hint="pip install 'gpuenv[prometheus]', or leave out --metrics / [daemon] metrics",
        ) from None
    return prometheus_client


class GpuenvCollector:
    """Builds every metric family from the server's state at collect() time."""

    def __init__(self, server: Server):
        self.server = server

    def describe(self) -> list[Any]:
        return []  # nothing fixed: registering must not call collect() before the daemon runs

    def collect(self) -> Iterator[Any]:
        families = _gpu_families()
        for index in range(len(self.server.infos)):
            self._add_gpu(families, index)
        yield from families.values()
        yield from self._daemon_families()

    def _add_gpu(self, f: dict[str, Any], index: int) -> None:
        """One GPU's values into the families of `_gpu_families()`."""
        server = self.server
        dev = server.infos[index]
        labels = [str(index), dev.uuid]
        f["info"].add_metric([str(index), dev.uuid, dev.name], {})
        sample = server.sampler.latest(index)
        if sample is not None:
            f["sm"].add_metric(labels, sample.sm_mhz)
            f["mem"].add_metric(labels, sample.mem_mhz)
            f["power"].add_metric(labels, sample.power_w)
            f["temp"].add_metric(labels, sample.temp_c)
            for bit, name in REASON_NAMES.items():
                f["reasons"].add_metric([*labels, name], 1.0 if sample.reasons & bit else 0.0)
        slow = server.sampler.slow_samples(t0=server.clock.now() - 10.0, gpu=index)
        if slow:
            last = slow[-1]
            for name, ns in sorted(last.reason_ns.items()):
                f["reason_s"].add_metric([*labels, name], ns / 1e9)
            if last.energy_mj is not None:
                f["energy"].add_metric(labels, last.energy_mj / 1000.0)
        status = server.leases.gpu_status(index)
        f["locked"].add_metric(labels, 1.0 if status["locked"] else 0.0)
        rng = server.leases.lock_range(index)
        if rng is not None:
            f["lock_sm"].add_metric([*labels, "min"], rng[0])
            f["lock_sm"].add_metric([*labels, "max"], rng[1])
            if sample is not None:
                f["holds"].add_metric(labels, 1.0 if rng[0] <= sample.sm_mhz <= rng[1] else 0.0)
        for owner in status["owners"]:
            f["holder"].add_metric(
                [*labels, str(owner["user"]), str(owner["kind"]), str(owner["pid"])], 1.0
            )

    def _daemon_families(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        server = self.server
        counts = server.leases.counters()
        leases = GaugeMetricFamily("gpuenv_leases", "Leases held through gpuenvd", labels=["kind"])
        leases.add_metric(["connection"], counts["leases_connection"])
        leases.add_metric(["standing"], counts["leases_standing"])
        yield leases
        for name in ("grants", "releases", "refusals"):
            c = CounterMetricFamily(
                f"gpuenv_lease_{name}", f"Lease {name} since the daemon started"
            )
            c.add_metric([], counts[name])
            yield c
        conns = GaugeMetricFamily("gpuenv_daemon_connections", "Open client connections")
        conns.add_metric([], server.connections())
        yield conns
        up = GaugeMetricFamily("gpuenv_daemon_start_time_seconds", "When gpuenvd started (epoch)")
        up.add_metric([], server.started_at)
        yield up
        scraped = GaugeMetricFamily(
            "gpuenv_scrape_time_seconds", "When this scrape was built (epoch)"
        )
        scraped.add_metric([], time.time())
        yield scraped


def _gpu_families() -> dict[str, Any]:
    """The per-GPU metric families, empty, in the order they are served."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

    gl = ["gpu", "uuid"]
    return {
        "info": InfoMetricFamily(
            "gpuenv_gpu", "GPUs gpuenvd watches", labels=["gpu", "uuid", "name"]
        ),
        "sm": GaugeMetricFamily(
            "gpuenv_sm_clock_mhz", "SM clock (nvidia-smi clocks.sm)", labels=gl
        ),
        "mem": GaugeMetricFamily(
            "gpuenv_mem_clock_mhz", "Memory clock (nvidia-smi clocks.mem)", labels=gl
        ),
        "power": GaugeMetricFamily(
            "gpuenv_power_watts", "Power draw, the driver's 1 s average", labels=gl
        ),
        "temp": GaugeMetricFamily("gpuenv_temperature_celsius", "GPU temperature", labels=gl),
        "reasons": GaugeMetricFamily(
            "gpuenv_clock_event_reason_active",
            "1 while a clock-event (throttle) reason is active",
            labels=[*gl, "reason"],
        ),
        "reason_s": CounterMetricFamily(
            "gpuenv_clock_event_reason_seconds",
            "Time under each clock-event reason since driver load (NVML violation counters)",
            labels=[*gl, "reason"],
        ),
        "energy": CounterMetricFamily(
            "gpuenv_energy_joules", "Energy since driver load", labels=gl
        ),
        "locked": GaugeMetricFamily(
            "gpuenv_lock_active", "1 while gpuenv holds a lock on the GPU", labels=gl
        ),
        "holds": GaugeMetricFamily(
            "gpuenv_lock_holds",
            "1 while the SM clock is inside the locked range (0: pulled below it)",
            labels=gl,
        ),
        "lock_sm": GaugeMetricFamily(
            "gpuenv_lock_sm_mhz", "Locked SM clock range", labels=[*gl, "bound"]
        ),
        "holder": GaugeMetricFamily(
            "gpuenv_lock_holder", "1 for each owner of a lock", labels=[*gl, "user", "kind", "pid"]
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

    def __init__(self, httpd: Any, thread: Any, host: str, port: int):
        self.httpd = httpd
        self.thread = thread
        self.host = host
        self.port = port

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=2.0)


def start_metrics(server: Server, listen: str) -> MetricsEndpoint:
    """Serve /metrics on `listen` ("127.0.0.1:9400"; port 0 picks a free one)."""
    import logging

    host, port = parse_listen(listen)
    prom = _prometheus()
    try:
        httpd, thread = prom.start_http_server(port, addr=host, registry=registry_for(server))
    except OSError as err:
        raise ConfigError(
            f"cannot serve metrics on {host}:{port}: {err.strerror or err}",
            hint="choose another port",
        ) from None
    bound = httpd.server_address[1]
    logging.getLogger("gpuenv.daemon").info(
        "Prometheus metrics on http://%s:%d/metrics", host, bound
    )
    return MetricsEndpoint(httpd, thread, host, bound)
