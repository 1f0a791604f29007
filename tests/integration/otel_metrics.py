"""OpenTelemetry metrics as an application sets them up, with data points written to a file.

``IT_METRICS_FILE`` names the file: :mod:`tests.integration.app` calls
:func:`metrics_to_file` at import when it is set, so a worker's main process installs an
SDK ``MeterProvider`` before it consumes, and its prefork pool processes inherit it (the
SDK's periodic reader starts its thread again in a forked child). Every export writes one
JSON line per data point of the ``celery_sqs_heartbeat`` meter: the exporting process,
the instrument's name, its attributes and value.
"""

from __future__ import annotations

import json
import os
from typing import Any

from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)

#: How often the reader collects: often enough for a test of a few leases.
EXPORT_INTERVAL_MILLIS = 500


class JsonLinesMetricExporter(MetricExporter):
    """Appends the package's data points of each export to ``path``, one a line."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **_: Any
    ) -> MetricExportResult:
        lines = [
            json.dumps(
                {
                    "pid": os.getpid(),
                    "name": metric.name,
                    "attributes": dict(point.attributes or {}),
                    "value": point.value,
                }
            )
            for resource in metrics_data.resource_metrics
            for scope in resource.scope_metrics
            if scope.scope.name == "celery_sqs_heartbeat"
            for metric in scope.metrics
            for point in metric.data.data_points
        ]
        if lines:
            with open(self.path, "a") as out:
                out.write("".join(f"{line}\n" for line in lines))
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **_: Any) -> None:
        pass


def metrics_to_file(path: str) -> None:
    """Export this process's metrics to ``path`` every :data:`EXPORT_INTERVAL_MILLIS`."""
    reader = PeriodicExportingMetricReader(
        JsonLinesMetricExporter(path), export_interval_millis=EXPORT_INTERVAL_MILLIS
    )
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))


def data_points(path: str) -> list[dict[str, Any]]:
    """The data points written to ``path`` so far."""
    if not os.path.exists(path):
        return []
    with open(path) as written:
        return [json.loads(line) for line in written if line.strip()]
