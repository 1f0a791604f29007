"""The lease counters for Prometheus (extra ``celery-sqs-heartbeat[prometheus]``).

The counters live in :mod:`celery_sqs_heartbeat.monitoring.metrics`, which knows nothing of
Prometheus. The collector here reads :func:`~celery_sqs_heartbeat.process.snapshot` at
every scrape, so there is one source of truth and nothing is done between scrapes.

A worker serves them when the transport option ``metrics_port`` is set: the transport
calls :func:`start_exporter` when the worker starts consuming. To put them on an
exporter of your own instead, register the collector with its registry::

    from prometheus_client import REGISTRY
    from celery_sqs_heartbeat.monitoring.prometheus import LeaseMetricsCollector

    REGISTRY.register(LeaseMetricsCollector())

This module imports without prometheus-client; only collecting and serving need it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from celery.utils.log import get_logger

from ..options import HeartbeatOptions, InvalidTransportOption
from ..process import snapshot
from .metrics import LISTED_METRICS, MetricKind, MetricsSnapshot
from .metrics import Metric as LeaseMetric

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

__all__ = ["METRIC_PREFIX", "LeaseMetricsCollector", "start_exporter"]

logger = get_logger(__name__)

#: Every metric's name starts with this.
METRIC_PREFIX = "celery_sqs_heartbeat"

_MISSING_CLIENT = (
    "metrics_port={port!r}: the Prometheus exporter needs prometheus-client; "
    "install it with: pip install 'celery-sqs-heartbeat[prometheus]'"
)

_exporter_lock = threading.Lock()
_exporter_started = False


class LeaseMetricsCollector:
    """A Prometheus collector of this process's lease counters, read at each scrape."""

    def __init__(self, source: Callable[[], MetricsSnapshot] = snapshot) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        current = self._source()
        for metric in LISTED_METRICS:
            yield _family(metric, getattr(current, metric.name))


def _family(metric: LeaseMetric, value: Any) -> Metric:
    """One counter of the snapshot as Prometheus has it: gauge, counter or histogram."""
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    name = f"{METRIC_PREFIX}_{metric.prometheus_name}"
    if metric.kind is MetricKind.GAUGE:
        return GaugeMetricFamily(name, metric.description, value=value)
    if metric.kind is MetricKind.COUNTER:
        return CounterMetricFamily(name, metric.description, value=value)
    if metric.kind is MetricKind.HISTOGRAM:
        return HistogramMetricFamily(
            name, metric.description, buckets=value.labelled_buckets(), sum_value=value.sum
        )
    family = CounterMetricFamily(name, metric.description, labels=["code"])
    for code, count in sorted(value.items()):
        family.add_metric([code], count)
    return family


def start_exporter(options: HeartbeatOptions) -> None:
    """Serve the lease counters on ``metrics_address:metrics_port``, once per process.

    The transport calls this when a worker starts consuming, so only a consumer's main
    process serves them: that is where the leases are renewed. Producers and prefork pool
    processes never consume, and a process forked after the start finds it started.
    Does nothing while ``metrics_port`` is None.

    Without prometheus-client this raises :class:`InvalidTransportOption`, so the worker
    stops at start-up naming the extra to install. A port already in use only logs an
    ERROR: the metrics are not worth stopping task processing for, for example when a
    second worker on the host shares the configuration.
    """
    global _exporter_started
    port = options.metrics_port
    if port is None:
        return
    with _exporter_lock:
        if _exporter_started:
            return
        try:
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError:
            raise InvalidTransportOption(_MISSING_CLIENT.format(port=port)) from None
        _exporter_started = True
        # A registry of its own: the page shows the lease counters, not whatever else
        # the application registered with prometheus-client's global one.
        registry = CollectorRegistry()
        registry.register(LeaseMetricsCollector())
        address = options.metrics_address
        try:
            start_http_server(port, address, registry=registry)
        except OSError as exc:
            logger.error(
                "Cannot serve SQS lease metrics on %s port %d (metrics_address, "
                "metrics_port): %s; the worker goes on without them",
                address,
                port,
                exc,
            )
            return
    logger.info("Serving SQS lease metrics for Prometheus on http://%s:%d/metrics", address, port)
