"""Prometheus metrics for `zq serve --metrics HOST:PORT`, with the standard client library.

The collector never touches engine state: the server loop replaces its ``snapshot`` (a
stats dict) on every heartbeat tick, and a scrape renders the latest one, read through
the ``latest`` callable the loop hands over (this module does not know the loop).

Metric names (all labelled by ``queue`` where per queue):

* ``zq_queue_depth``, ``zq_queue_delayed`` (of them, waiting for a retry or a publish's
  delay), ``zq_queue_leased``, ``zq_queue_consumers``, ``zq_queue_groups`` (gauges)
* ``zq_published_total``, ``zq_delivered_total``, ``zq_acked_total``, ``zq_cancelled_total``,
  ``zq_expired_total``, ``zq_dead_lettered_total``, ``zq_redelivered_total``, and unfinished
  deliveries by cause: ``zq_failed_total``, ``zq_lease_expiries_total``,
  ``zq_consumers_gone_total``, and ``zq_reclaimed_total`` (deliveries given back unstarted
  for an idle consumer), ``zq_poisoned_total`` (set aside: content the queue could not
  evaluate) (counters)
* ``zq_queue_oldest_message_seconds`` (gauge; 0 when nothing waits)
* ``zq_tenant_held`` (gauge, labelled ``queue`` and ``tenant``: messages a tenant holds in a
  fair queue, waiting or leased; the ten tenants holding most, so a scrape stays small)
* ``zq_ack_latency_seconds`` (histogram: publish -> ack; ``_bucket``, ``_sum``, ``_count``)
* ``zq_journal_bytes``, ``zq_uptime_seconds``, ``zq_peers``, ``zq_workers`` (gauges)
* ``zq_journal_sync_running_seconds`` (how long the periodic fsync now running has run, 0
  when none: a stalled disk shows here), ``zq_journal_sync_last_seconds`` (gauges)
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import CollectorRegistry

from zq.core.errors import ConfigError

COUNTERS = ("published", "delivered", "acked", "cancelled", "expired", "dead_lettered", "redelivered", "failed",
            "lease_expiries", "consumers_gone", "reclaimed", "poisoned")


class ZqCollector:
    def __init__(self, latest: Callable[[], dict | None]) -> None:
        self.latest = latest

    def collect(self):  # type: ignore[no-untyped-def]
        st = self.latest()
        if st is None:
            return
        yield from queue_metrics(st)
        srv = st["server"]
        for name, value, doc in (
            ("zq_journal_bytes", srv["journal_bytes"], "Bytes used by the LMDB journal"),
            ("zq_uptime_seconds", srv["uptime_ms"] / 1000, "Seconds since the dispatcher started"),
            ("zq_peers", srv["peers"], "Connected clients with a session"),
            ("zq_workers", srv["workers"], "Connected clients with at least one subscription"),
            ("zq_journal_sync_running_seconds", srv["journal"]["sync_running_ms"] / 1000,
             "How long the journal's periodic fsync now running has run (0: none)"),
            ("zq_journal_sync_last_seconds", srv["journal"]["sync_last_ms"] / 1000,
             "How long the journal's last periodic fsync took"),
        ):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            yield g


def queue_metrics(st: dict):  # type: ignore[no-untyped-def]
    gauges = {
        "depth": GaugeMetricFamily("zq_queue_depth", "Messages waiting", labels=["queue"]),
        "delayed": GaugeMetricFamily("zq_queue_delayed", "Waiting messages that wait for a time (retry, delay)",
                                     labels=["queue"]),
        "leased": GaugeMetricFamily("zq_queue_leased", "Messages leased to consumers", labels=["queue"]),
        "groups": GaugeMetricFamily("zq_queue_groups", "Message groups known", labels=["queue"]),
    }
    consumers = GaugeMetricFamily("zq_queue_consumers", "Subscriptions", labels=["queue"])
    oldest = GaugeMetricFamily("zq_queue_oldest_message_seconds", "Age of the oldest waiting message", labels=["queue"])
    counters = {k: CounterMetricFamily(f"zq_{k}", f"Messages {k.replace('_', ' ')}", labels=["queue"]) for k in COUNTERS}
    hist = HistogramMetricFamily("zq_ack_latency_seconds", "Publish to ack latency", labels=["queue"])
    tenants = GaugeMetricFamily("zq_tenant_held", "Messages a tenant holds in a fair queue (the ten holding most)",
                                labels=["queue", "tenant"])
    for name, q in sorted(st["queues"].items()):
        for t in q.get("tenants", ()):
            tenants.add_metric([name, t["tenant"]], t["held"])
        for key, fam in gauges.items():
            fam.add_metric([name], q.get(key, 0))
        consumers.add_metric([name], len(q["consumers"]))
        oldest.add_metric([name], (q["oldest_ms"] or 0) / 1000)
        for key, counter in counters.items():
            counter.add_metric([name], q.get(key, 0))
        lat = q["ack_latency"]
        cumulative, buckets = 0, []
        for edge, count in zip([*lat["buckets_ms"], None], lat["counts"]):
            cumulative += count
            buckets.append(("+Inf" if edge is None else str(edge / 1000), cumulative))
        hist.add_metric([name], buckets, lat["sum_ms"] / 1000)
    yield from gauges.values()
    yield consumers
    yield oldest
    yield tenants
    yield from counters.values()
    yield hist


class MetricsEndpoint:
    def __init__(self, httpd, thread: threading.Thread) -> None:  # type: ignore[no-untyped-def]
        self.httpd = httpd
        self.thread = thread
        self.port = httpd.server_address[1]

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def serve_metrics(latest: Callable[[], dict | None], address: str) -> MetricsEndpoint:
    """Serve /metrics on HOST:PORT; ``latest()`` is the newest stats snapshot (or None)."""
    from prometheus_client import start_http_server

    host, _, port = address.rpartition(":")
    if not port.isdigit():
        raise ConfigError(f"--metrics wants HOST:PORT, got {address!r}")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ZqCollector(latest))  # type: ignore[arg-type]
    try:
        httpd, thread = start_http_server(int(port), addr=host or "127.0.0.1", registry=registry)
    except OSError as exc:  # a busy port: one line, as for the main endpoint
        raise ConfigError(f"cannot serve metrics on {address}: {exc.strerror or exc}") from None
    return MetricsEndpoint(httpd, thread)
