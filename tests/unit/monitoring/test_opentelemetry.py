"""The lease counters through the OpenTelemetry metrics API, read by the SDK's in-memory reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Sum

from celery_sqs_heartbeat.monitoring import opentelemetry as otel
from celery_sqs_heartbeat.monitoring.metrics import METRICS, LeaseMetrics, MetricKind
from celery_sqs_heartbeat.monitoring.opentelemetry import (
    INSTRUMENTS,
    LeaseInstruments,
    register_instruments,
)
from celery_sqs_heartbeat.process import ProcessState

#: Every instrument as a dashboard or an alert names it: (name, unit, kind). A rename
#: breaks them, so it must show here first (and in docs/observability.md's table).
PINNED = [
    ("celery_sqs_heartbeat.delete.calls", "{call}", "counter"),
    ("celery_sqs_heartbeat.delete.failures", "{message}", "counter"),
    ("celery_sqs_heartbeat.deletes.pending", "{message}", "updowncounter"),
    ("celery_sqs_heartbeat.deletes.retried", "{message}", "counter"),
    ("celery_sqs_heartbeat.leases.held", "{lease}", "updowncounter"),
    ("celery_sqs_heartbeat.leases.lost", "{lease}", "counter"),
    ("celery_sqs_heartbeat.messages.deleted", "{message}", "counter"),
    ("celery_sqs_heartbeat.messages.released", "{message}", "counter"),
    ("celery_sqs_heartbeat.receive.errors", "{call}", "counter"),
    ("celery_sqs_heartbeat.renewal.calls", "{call}", "counter"),
    ("celery_sqs_heartbeat.renewal.entries", "{lease}", "counter"),
    ("celery_sqs_heartbeat.renewal.failures", "{lease}", "counter"),
    ("celery_sqs_heartbeat.renewal.margin.max", "s", "gauge"),
    ("celery_sqs_heartbeat.renewal.margin.min", "s", "gauge"),
    ("celery_sqs_heartbeat.renewal.margin.renewals", "{lease}", "counter"),
    ("celery_sqs_heartbeat.renewal.margin.sum", "s", "counter"),
]
SQS = ("messaging.system", "aws_sqs")
Points = dict[tuple[str, tuple[tuple[str, Any], ...]], float]


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def provider(reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    provider = MeterProvider(metric_readers=[reader])
    yield provider
    provider.shutdown()


def collected(reader: InMemoryMetricReader) -> tuple[dict[str, tuple[str, str]], Points]:
    """Each instrument's (unit, kind), and every data point by name and sorted attributes."""
    described: dict[str, tuple[str, str]] = {}
    points: Points = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                described[metric.name] = (metric.unit or "", _kind(metric.data))
                for point in metric.data.data_points:
                    attributes = tuple(sorted((point.attributes or {}).items()))
                    points[(metric.name, attributes)] = point.value
    return described, points


def _kind(data: Any) -> str:
    if isinstance(data, Gauge):
        return "gauge"
    assert isinstance(data, Sum)
    return "counter" if data.is_monotonic else "updowncounter"


def test_the_instruments_are_the_pinned_ones(
    provider: MeterProvider, reader: InMemoryMetricReader, history: LeaseMetrics
) -> None:
    LeaseInstruments(provider.get_meter("test"), source=history.snapshot)

    described, _ = collected(reader)

    assert sorted((name, *how) for name, how in described.items()) == PINNED


def test_every_counter_but_the_margins_has_an_instrument() -> None:
    """A counter added to the snapshot must be given an OTel name, never left out."""
    shown = {m.name for m in METRICS if m.kind is not MetricKind.HISTOGRAM}
    assert set(INSTRUMENTS) == shown


def test_the_values_are_the_snapshots_with_the_messaging_system(
    provider: MeterProvider, reader: InMemoryMetricReader, history: LeaseMetrics
) -> None:
    LeaseInstruments(provider.get_meter("test"), source=history.snapshot)

    _, points = collected(reader)

    prefix = "celery_sqs_heartbeat."
    plain = {name[len(prefix) :]: v for (name, attrs), v in points.items() if attrs == (SQS,)}
    assert plain == {
        "leases.held": 3,
        "renewal.calls": 2,
        "renewal.entries": 6,
        "leases.lost": 1,
        "messages.released": 5,
        "deletes.pending": 1,
        "delete.calls": 1,
        "messages.deleted": 7,
        "deletes.retried": 1,
        "renewal.margin.sum": pytest.approx(20.8),
        "renewal.margin.min": 0.3,
        "renewal.margin.max": 12.0,
    }
    by_code = {
        (name[len(prefix) :], dict(attrs)["error.type"]): v
        for (name, attrs), v in points.items()
        if "error.type" in dict(attrs)
    }
    assert by_code == {
        ("renewal.failures", "ThrottlingException"): 2,
        ("renewal.failures", "MessageNotInflight"): 1,
        ("receive.errors", "ReadTimeoutError"): 1,
        ("delete.failures", "ReceiptHandleIsInvalid"): 1,
        ("delete.failures", "InternalError"): 1,
    }
    assert all(SQS in attrs for _, attrs in points)


def test_the_margin_buckets_are_cumulative_as_prometheus_has_them(
    provider: MeterProvider, reader: InMemoryMetricReader, history: LeaseMetrics
) -> None:
    LeaseInstruments(provider.get_meter("test"), source=history.snapshot)

    _, points = collected(reader)

    bound = "celery_sqs_heartbeat.renewal.margin.le"
    buckets = {
        dict(attrs)[bound]: v
        for (name, attrs), v in points.items()
        if name == "celery_sqs_heartbeat.renewal.margin.renewals"
    }
    assert buckets == {
        "0.5": 1,
        "1.0": 1,
        "2.0": 1,
        "5.0": 3,
        "10.0": 3,
        "20.0": 4,
        "30.0": 4,
        "60.0": 4,
        "+Inf": 4,
    }


def test_without_renewals_there_is_no_smallest_or_largest_margin(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    LeaseInstruments(provider.get_meter("test"), source=LeaseMetrics().snapshot)

    _, points = collected(reader)

    names = {name for name, _ in points}
    assert "celery_sqs_heartbeat.renewal.margin.min" not in names
    assert "celery_sqs_heartbeat.renewal.margin.max" not in names
    assert points[("celery_sqs_heartbeat.leases.held", (SQS,))] == 0


def test_another_process_observes_nothing(
    provider: MeterProvider, reader: InMemoryMetricReader, history: LeaseMetrics
) -> None:
    instruments = LeaseInstruments(provider.get_meter("test"), source=history.snapshot)
    instruments.reporting_pid = os.getpid() + 1

    _, points = collected(reader)

    assert points == {}


@pytest.fixture
def global_meter(
    provider: MeterProvider, monkeypatch: pytest.MonkeyPatch, process_state: ProcessState
) -> None:
    """The test's provider as the global one, and nothing registered on it yet."""
    monkeypatch.setattr(metrics, "get_meter", provider.get_meter)
    monkeypatch.setattr(otel, "_instruments", None)


def test_registering_again_makes_no_second_set(
    global_meter: None, reader: InMemoryMetricReader, process_state: ProcessState
) -> None:
    process_state.metrics.record_released(2)

    register_instruments()
    register_instruments()

    _, points = collected(reader)
    released = [v for (name, _), v in points.items() if name.endswith("messages.released")]
    assert released == [2]


def test_without_the_api_registering_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker without the ``opentelemetry`` extra consumes as before."""
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.setattr(otel, "_instruments", None)

    register_instruments()

    assert otel._instruments is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_reports_nothing_until_it_registers_then_its_own_counters(
    global_meter: None, reader: InMemoryMetricReader, process_state: ProcessState
) -> None:
    process_state.metrics.record_released(2)
    register_instruments()
    read_end, write_end = os.pipe()

    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never back into pytest
        try:
            inherited = len(collected(reader)[1])
            register_instruments()
            _, own = collected(reader)
            released = [v for (name, _), v in own.items() if name.endswith("messages.released")]
            os.write(write_end, json.dumps([inherited, released]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        answer = pipe.read()
    os.waitpid(pid, 0)

    # Before: the parent's registration observes nothing in the child; after, the
    # child's own counters (zero: a forked child starts from zero).
    assert json.loads(answer) == [0, [0]]
    _, points = collected(reader)
    assert [v for (name, _), v in points.items() if name.endswith("messages.released")] == [2]


_REGISTERED_BEFORE_THE_SDK = """
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from celery_sqs_heartbeat.monitoring.opentelemetry import register_instruments
from celery_sqs_heartbeat.process import this_process

this_process().metrics.record_released(2)
register_instruments()
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
for resource in reader.get_metrics_data().resource_metrics:
    for scope in resource.scope_metrics:
        for metric in scope.metrics:
            if metric.name == "celery_sqs_heartbeat.messages.released":
                print(scope.scope.name, [point.value for point in metric.data.data_points])
"""


def test_instruments_registered_before_the_application_installs_its_sdk_follow_it() -> None:
    """A worker registers when it starts consuming, the application may install its
    ``MeterProvider`` later (in ``worker_init``, say): the API's proxy meter hands the
    instruments over. The global provider is set once per process, hence a process."""
    done = subprocess.run(
        [sys.executable, "-c", _REGISTERED_BEFORE_THE_SDK],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "celery_sqs_heartbeat [2]", done.stderr
