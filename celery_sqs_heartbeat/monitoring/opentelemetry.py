"""The lease counters through the OpenTelemetry metrics API (extra ``[opentelemetry]``).

As the Prometheus collector does, the instruments here read
:func:`~celery_sqs_heartbeat.process.snapshot` when a reader collects, so the counters keep
one source of truth. They are observable instruments on the global ``MeterProvider``,
the way instrumentation libraries behave: until the application installs an SDK
``MeterProvider`` (with a reader and an exporter of its choice), the API's provider does
nothing and no callback ever runs. So there is no option to turn them on: the transport
registers them when a worker starts consuming, if ``opentelemetry-api`` is importable.
The API's proxy instruments follow a provider installed later, too.

Names and units follow OpenTelemetry's semantic conventions where one applies: every
observation has ``messaging.system`` = ``aws_sqs``, failures by code ``error.type``. No
messaging convention counts what these count (renewals, leases lost, deletes confirmed:
``messaging.client.consumed.messages`` counts receives, which the transport does not), so
the names are the package's own, under ``celery_sqs_heartbeat.``, with UCUM units.

The API has no observable histogram, and the margins are recorded by the renewal thread
into the counters, not into an instrument. So the renewal margin is exported as its
cumulative buckets, an observable counter by ``celery_sqs_heartbeat.renewal.margin.le``
(the Prometheus buckets: renewals with at most that many seconds left), with the sum of
the margins, and the smallest and largest margin as gauges. A rate of the ``le=1.0``
bucket over the ``+Inf`` one is the share of renewals sent in the last second.

Fork: the registration is inherited by a child forked once the worker consumes (a prefork
pool process replaced after ``worker_max_tasks_per_child``), whose counters are its own
and hold no lease. Only the process that registered, or registered again after the
fork, observes anything: an inherited SDK reader in a child reports nothing rather than
a second, zero-valued copy of the main process's series.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..process import snapshot
from .metrics import METRICS, MetricKind, MetricsSnapshot

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Meter, Observation

__all__ = [
    "INSTRUMENTS",
    "METER_NAME",
    "SYSTEM",
    "Instrument",
    "LeaseInstruments",
    "register_instruments",
]

#: The meter's name, the instrumentation scope in every export.
METER_NAME = "celery_sqs_heartbeat"
#: ``messaging.system`` of every observation, as the messaging conventions name SQS.
SYSTEM = {"messaging.system": "aws_sqs"}
#: The attribute of a failure's error code (the ``code`` label of the Prometheus page).
ERROR_TYPE = "error.type"
#: The attribute of the margin buckets' upper bound, written as Prometheus writes it.
MARGIN_BOUND = "celery_sqs_heartbeat.renewal.margin.le"


@dataclass(frozen=True)
class Instrument:
    """How one counter of :class:`MetricsSnapshot` is exported: its OTel name and unit."""

    name: str
    unit: str


#: Every counter but the margins, by snapshot field; a unit test pins the names.
INSTRUMENTS: Mapping[str, Instrument] = {
    "leases_held": Instrument("celery_sqs_heartbeat.leases.held", "{lease}"),
    "renewal_calls": Instrument("celery_sqs_heartbeat.renewal.calls", "{call}"),
    "renewal_entries": Instrument("celery_sqs_heartbeat.renewal.entries", "{lease}"),
    "renewal_failures": Instrument("celery_sqs_heartbeat.renewal.failures", "{lease}"),
    "leases_lost": Instrument("celery_sqs_heartbeat.leases.lost", "{lease}"),
    "messages_released": Instrument("celery_sqs_heartbeat.messages.released", "{message}"),
    "receive_errors": Instrument("celery_sqs_heartbeat.receive.errors", "{call}"),
    "deletes_pending": Instrument("celery_sqs_heartbeat.deletes.pending", "{message}"),
    "delete_calls": Instrument("celery_sqs_heartbeat.delete.calls", "{call}"),
    "messages_deleted": Instrument("celery_sqs_heartbeat.messages.deleted", "{message}"),
    "delete_failures": Instrument("celery_sqs_heartbeat.delete.failures", "{message}"),
    "deletes_retried": Instrument("celery_sqs_heartbeat.deletes.retried", "{message}"),
}
#: The renewal margin, which has no observable histogram: buckets, sum, min and max.
MARGIN_BUCKETS = Instrument("celery_sqs_heartbeat.renewal.margin.renewals", "{lease}")
MARGIN_SUM = Instrument("celery_sqs_heartbeat.renewal.margin.sum", "s")
MARGIN_MIN = Instrument("celery_sqs_heartbeat.renewal.margin.min", "s")
MARGIN_MAX = Instrument("celery_sqs_heartbeat.renewal.margin.max", "s")

_Observed = list[tuple[float, dict[str, str]]]


class LeaseInstruments:
    """The observable instruments of one meter, reporting for the process that made them.

    ``source`` gives the counters (the process's snapshot); ``reporting_pid`` is the
    process whose counters they are: any other process, a forked child, observes nothing.
    """

    def __init__(self, meter: Meter, source: Callable[[], MetricsSnapshot] = snapshot) -> None:
        self._source = source
        self.reporting_pid = os.getpid()
        for metric in METRICS:
            if metric.kind is not MetricKind.HISTOGRAM:
                self._create(meter, metric.name, metric.kind, metric.description)
        self._create_margins(meter)

    def _create(self, meter: Meter, field: str, kind: MetricKind, description: str) -> None:
        instrument = INSTRUMENTS[field]
        callback = self._callback(lambda current: _values(kind, getattr(current, field)))
        create = (
            meter.create_observable_up_down_counter
            if kind is MetricKind.GAUGE
            else meter.create_observable_counter
        )
        create(instrument.name, [callback], unit=instrument.unit, description=description)

    def _create_margins(self, meter: Meter) -> None:
        described = "Seconds a lease still had when its renewal was sent"
        meter.create_observable_counter(
            MARGIN_BUCKETS.name,
            [self._callback(_margin_buckets)],
            unit=MARGIN_BUCKETS.unit,
            description=f"Renewals by margin: those with at most {MARGIN_BOUND} seconds left.",
        )
        meter.create_observable_counter(
            MARGIN_SUM.name,
            [self._callback(lambda c: [(c.renewal_margin.sum, {})])],
            unit=MARGIN_SUM.unit,
            description=f"{described}, summed over every renewal.",
        )
        for instrument, extreme in ((MARGIN_MIN, "min"), (MARGIN_MAX, "max")):
            meter.create_observable_gauge(
                instrument.name,
                [self._callback(_margin_extreme(extreme))],
                unit=instrument.unit,
                description=f"{described}: the {extreme}imum since the process started.",
            )

    def _callback(
        self, read: Callable[[MetricsSnapshot], _Observed]
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        from opentelemetry.metrics import Observation

        def observe(_: CallbackOptions) -> Iterable[Observation]:
            if os.getpid() != self.reporting_pid:
                return []
            observed = read(self._source())
            return [Observation(value, {**SYSTEM, **extra}) for value, extra in observed]

        return observe


def _values(kind: MetricKind, value: Any) -> _Observed:
    if kind is MetricKind.BY_CODE:
        return [(count, {ERROR_TYPE: code}) for code, count in sorted(value.items())]
    return [(value, {})]


def _margin_buckets(current: MetricsSnapshot) -> _Observed:
    labelled = current.renewal_margin.labelled_buckets()
    return [(count, {MARGIN_BOUND: bound}) for bound, count in labelled]


def _margin_extreme(which: str) -> Callable[[MetricsSnapshot], _Observed]:
    def read(current: MetricsSnapshot) -> _Observed:
        value = getattr(current.renewal_margin, which)
        return [] if value is None else [(value, {})]

    return read


_lock = threading.Lock()
_instruments: LeaseInstruments | None = None


def register_instruments() -> None:
    """Register the instruments on the global ``MeterProvider``, once per interpreter.

    The transport calls this when a worker starts consuming, beside the Prometheus
    exporter: only a consumer's main process holds leases. Called again in a forked
    child that consumes, it makes the child the reporting process instead of
    registering a second set. Does nothing without ``opentelemetry-api``.
    """
    global _instruments
    try:
        from opentelemetry import metrics
    except ImportError:
        return
    from .. import __version__

    with _lock:
        if _instruments is None:
            _instruments = LeaseInstruments(metrics.get_meter(METER_NAME, __version__))
        _instruments.reporting_pid = os.getpid()
