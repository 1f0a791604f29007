"""Counters of lease health in one process: pure, thread-safe, no I/O.

A lease that runs out makes no noise. The only symptom is a task that runs twice, long
after the fact. These counters show the trouble before that happens: how many renewals
fail and why, how many leases were lost, and above all how much time a lease still had
left when its renewal went out. That margin is the number to tune
``visibility_extension_threshold`` with: a minimum close to zero means renewals are
sent just in time, or too late.

The renewal manager and the transport write the counters; :func:`snapshot` reads them,
and so do the DEBUG summary, the Prometheus collector, the OpenTelemetry instruments and
the ``sqs_lease_stats`` inspect command. A forked child (a prefork pool process) starts
from zero, like the shared manager: the parent's leases and counts are not the child's.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields, replace
from enum import Enum
from types import MappingProxyType
from typing import Any

from ..aws.sqs_facts import error_code

__all__ = [
    "LISTED_METRICS",
    "MARGIN_BUCKETS",
    "METRICS",
    "LeaseMetrics",
    "MarginHistogram",
    "Metric",
    "MetricKind",
    "MetricsSnapshot",
    "failure_code",
]

#: Upper bounds, in seconds, of the renewal-margin histogram buckets. Renewals are due
#: a margin before expiry (about 4 s on a fast SQS, 10 s at most by default), and the
#: leases added to fill a call have more time left; a margin under a second or two
#: means renewals are late.
MARGIN_BUCKETS: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, math.inf)

_CODE_AT_START = re.compile(r"\s*([A-Za-z_][\w.]*)\s*[:(]")


def failure_code(reason: str) -> str:
    """The error code a failure reason starts with, for counting failures by kind.

    The SQS layer words a failed entry as ``"Code: message"`` (an SQS error answer) or
    as the ``repr`` of a network error (``"ReadTimeoutError('...')"``); the counters
    keep the code (as :func:`~celery_sqs_heartbeat.aws.sqs_facts.error_code` shows it) or
    the exception name, and never the message, so they stay few.
    """
    match = _CODE_AT_START.match(reason)
    if match is None:
        return "NoAnswer" if reason.strip().lower() == "no answer" else "Unknown"
    return error_code(match.group(1))


class MetricKind(Enum):
    """What a counter is, which says how each view shows it."""

    #: A level that goes up and down: shown as its value.
    GAUGE = "gauge"
    #: A count since the process started.
    COUNTER = "counter"
    #: Counts by error code: their total, then each code's.
    BY_CODE = "by code"
    #: The renewal margins: count, sum, min, max and buckets.
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class Metric:
    """One counter of :class:`MetricsSnapshot`, as the summary line and Prometheus show it."""

    #: The snapshot's attribute, and the key in :meth:`MetricsSnapshot.as_dict`.
    name: str
    kind: MetricKind
    #: Prometheus's HELP text.
    description: str
    #: The name in the DEBUG summary line, short where the line would grow long.
    summary_name: str
    #: The name after :data:`~celery_sqs_heartbeat.monitoring.prometheus.METRIC_PREFIX`; a counter's
    #: gets ``_total`` from prometheus-client.
    prometheus_name: str


def _shown(
    kind: MetricKind, description: str, summary_name: str = "", prometheus_name: str = ""
) -> dict[str, Metric]:
    """The metadata that makes a :class:`MetricsSnapshot` field a :class:`Metric`.

    The field's own name completes it (:data:`METRICS`), so each counter is written once.
    """
    return {"metric": Metric("", kind, description, summary_name, prometheus_name)}


@dataclass(frozen=True)
class MarginHistogram:
    """Seconds a lease had left when its renewal was sent, over all renewals so far."""

    #: ``(upper bound, renewals with a margin at most that)``, cumulative like
    #: Prometheus buckets; the last bound is ``math.inf`` and counts every renewal.
    buckets: tuple[tuple[float, int], ...]
    count: int
    sum: float
    min: float | None
    max: float | None

    def quantile_bound(self, quantile: float) -> float | None:
        """A bound the ``quantile`` of margins does not exceed; None without renewals.

        Buckets only tell which range a margin fell in, so this is the upper bound of
        the bucket where the quantile lies, or the largest margin if that is smaller.
        """
        if not self.count or self.max is None:
            return None
        wanted = quantile * self.count
        bound = next(le for le, seen in self.buckets if seen >= wanted)
        return min(bound, self.max)

    def labelled_buckets(self) -> list[tuple[str, int]]:
        """The buckets with their bounds written as Prometheus does: ``1.0``, ``+Inf``."""
        return [("+Inf" if math.isinf(le) else repr(float(le)), seen) for le, seen in self.buckets]

    def as_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "sum": self.sum,
            "min": self.min,
            "max": self.max,
            "buckets": dict(self.labelled_buckets()),
        }

    def summary(self) -> str:
        """The margins in a few words: what an operator tuning the threshold looks for."""
        median = self.quantile_bound(0.5)
        if self.min is None or self.max is None or median is None:
            return "none"
        return f"min={self.min:.2f} median<={median:.2f} max={self.max:.2f}"


@dataclass(frozen=True)
class MetricsSnapshot:
    """The process's lease counters at one moment; counts are since the process started.

    Read-only throughout, mappings included, so it can be handed to any thread. Each
    field declares its counter for every view (:data:`METRICS`); the delete counters
    have defaults because they came later than the others.
    """

    leases_held: int = field(
        metadata=_shown(
            MetricKind.GAUGE, "SQS leases this process is renewing now.", summary_name="held"
        )
    )
    renewal_calls: int = field(
        metadata=_shown(
            MetricKind.COUNTER, "ChangeMessageVisibilityBatch calls made to renew leases."
        )
    )
    renewal_entries: int = field(
        metadata=_shown(MetricKind.COUNTER, "Lease renewals sent (entries of the renewal calls).")
    )
    renewal_failures: Mapping[str, int] = field(
        metadata=_shown(
            MetricKind.BY_CODE, "Lease renewals that failed, by SQS error code or network error."
        )
    )
    leases_lost: int = field(
        metadata=_shown(
            MetricKind.COUNTER,
            "Leases lost while their task was pending: SQS may deliver those messages again.",
            summary_name="lost",
        )
    )
    messages_released: int = field(
        metadata=_shown(
            MetricKind.COUNTER,
            "Messages made visible again on reject, requeue or shutdown.",
            summary_name="released",
        )
    )
    receive_errors: Mapping[str, int] = field(
        metadata=_shown(
            MetricKind.BY_CODE, "Failed ReceiveMessage calls, by SQS error code or network error."
        )
    )
    renewal_margin: MarginHistogram = field(
        metadata=_shown(
            MetricKind.HISTOGRAM,
            "Seconds a lease still had when its renewal was sent; near 0 means renewals "
            "are late (tune visibility_extension_threshold).",
            summary_name="margin_seconds",
            prometheus_name="renewal_margin_seconds",
        )
    )
    deletes_pending: int = field(
        default=0,
        metadata=_shown(
            MetricKind.GAUGE,
            "Acked messages whose delete SQS has not confirmed yet; their leases are held.",
        ),
    )
    delete_calls: int = field(
        default=0,
        metadata=_shown(MetricKind.COUNTER, "DeleteMessageBatch calls made for acked messages."),
    )
    messages_deleted: int = field(
        default=0,
        metadata=_shown(
            MetricKind.COUNTER, "Acked messages whose delete SQS confirmed.", summary_name="deleted"
        ),
    )
    delete_failures: Mapping[str, int] = field(
        default_factory=lambda: MappingProxyType({}),
        metadata=_shown(
            MetricKind.BY_CODE, "Deletes that failed, by SQS error code or network error."
        ),
    )
    deletes_retried: int = field(
        default=0,
        metadata=_shown(MetricKind.COUNTER, "Failed deletes tried again while their lease held."),
    )

    @property
    def renewal_failures_total(self) -> int:
        return sum(self.renewal_failures.values())

    @property
    def receive_errors_total(self) -> int:
        return sum(self.receive_errors.values())

    @property
    def delete_failures_total(self) -> int:
        return sum(self.delete_failures.values())

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable data, e.g. for a remote-control reply."""
        data: dict[str, Any] = {}
        for metric in METRICS:
            value = getattr(self, metric.name)
            if metric.kind is MetricKind.BY_CODE:
                value = dict(value)
            elif metric.kind is MetricKind.HISTOGRAM:
                value = value.as_dict()
            data[metric.name] = value
        return data

    def summary(self) -> str:
        """One log line with everything an operator scans for, as ``name=value`` pairs."""
        parts = []
        for metric in LISTED_METRICS:
            value = getattr(self, metric.name)
            if metric.kind is MetricKind.BY_CODE:
                parts.append(f"{metric.summary_name}={sum(value.values())}{_by_code(value)}")
            elif metric.kind is MetricKind.HISTOGRAM:
                parts.append(f"{metric.summary_name} {value.summary()}")
            else:
                parts.append(f"{metric.summary_name}={value}")
        return f"SQS lease summary: {' '.join(parts)} (counts since the process started)"


def _metric(declared: Field[Any]) -> Metric:
    shown: Metric = declared.metadata["metric"]
    return replace(
        shown,
        name=declared.name,
        summary_name=shown.summary_name or declared.name,
        prometheus_name=shown.prometheus_name or declared.name,
    )


#: Every counter, in the snapshot's order, which :meth:`MetricsSnapshot.as_dict` keeps.
METRICS: tuple[Metric, ...] = tuple(_metric(declared) for declared in fields(MetricsSnapshot))
#: The order of the summary line and of the Prometheus page: the margin histogram, the
#: longest to read, last.
LISTED_METRICS: tuple[Metric, ...] = tuple(
    sorted(METRICS, key=lambda metric: metric.kind is MetricKind.HISTOGRAM)
)


class _Margins:
    """The renewal margins as they are recorded: per bucket, not yet cumulative."""

    def __init__(self) -> None:
        self.in_bucket = [0] * len(MARGIN_BUCKETS)
        self.count = 0
        self.sum = 0.0
        self.min: float | None = None
        self.max: float | None = None

    def add(self, seconds: float) -> None:
        self.in_bucket[next(i for i, le in enumerate(MARGIN_BUCKETS) if seconds <= le)] += 1
        self.count += 1
        self.sum += seconds
        if self.min is None or seconds < self.min:
            self.min = seconds
        if self.max is None or seconds > self.max:
            self.max = seconds

    def histogram(self) -> MarginHistogram:
        cumulative = tuple(zip(MARGIN_BUCKETS, itertools.accumulate(self.in_bucket), strict=True))
        return MarginHistogram(cumulative, self.count, self.sum, self.min, self.max)


#: The kinds kept as one number.
_SCALARS = (MetricKind.GAUGE, MetricKind.COUNTER)


class LeaseMetrics:
    """The counters themselves; one per process (:mod:`celery_sqs_heartbeat.process`).

    Every method takes one lock for a few additions, so recording from the renewal
    thread and the worker's loop at once is safe and never waits on I/O. The counts are
    kept by :data:`METRICS` name, so a counter declared in :class:`MetricsSnapshot` is
    kept, reset and copied without being written down again here.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Back to zero, with a new lock (after a fork the old one may be held)."""
        self._lock = threading.Lock()
        self._counts = {m.name: 0 for m in METRICS if m.kind in _SCALARS}
        self._by_code: dict[str, dict[str, int]] = {
            m.name: {} for m in METRICS if m.kind is MetricKind.BY_CODE
        }
        self._margins = _Margins()

    def set_leases_held(self, count: int) -> None:
        with self._lock:
            self._counts["leases_held"] = count

    def record_renewal_call(self, entries: int) -> None:
        """A ChangeMessageVisibilityBatch call renewing ``entries`` leases went out."""
        with self._lock:
            self._add(renewal_calls=1, renewal_entries=entries)

    def record_renewal_margin(self, seconds: float) -> None:
        """A lease's renewal was sent ``seconds`` before the lease would have run out."""
        with self._lock:
            self._margins.add(seconds)

    def record_renewal_failure(self, code: str, entries: int = 1) -> None:
        """``entries`` renewal entries failed with ``code`` (see :func:`failure_code`)."""
        with self._lock:
            self._add_by_code("renewal_failures", code, entries)

    def record_lease_lost(self) -> None:
        with self._lock:
            self._add(leases_lost=1)

    def record_released(self, count: int) -> None:
        """``count`` messages were made visible again, as SQS confirmed."""
        with self._lock:
            self._add(messages_released=count)

    def set_deletes_pending(self, count: int) -> None:
        with self._lock:
            self._counts["deletes_pending"] = count

    def record_delete_call(self, deleted: int) -> None:
        """A DeleteMessageBatch call went out and SQS confirmed ``deleted`` of its entries."""
        with self._lock:
            self._add(delete_calls=1, messages_deleted=deleted)

    def record_delete_failure(self, code: str, retried: bool) -> None:
        with self._lock:
            self._add_by_code("delete_failures", code, 1)
            self._add(deletes_retried=int(retried))

    def record_receive_error(self, code: str) -> None:
        """A ReceiveMessage call failed with ``code``."""
        with self._lock:
            self._add_by_code("receive_errors", code, 1)

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            values: dict[str, Any] = dict(self._counts)
            for name, counts in self._by_code.items():
                values[name] = MappingProxyType(dict(counts))
            values["renewal_margin"] = self._margins.histogram()
        return MetricsSnapshot(**values)

    # Both below expect the caller to hold the lock, so one record is one hold.

    def _add(self, **amounts: int) -> None:
        for name, amount in amounts.items():
            self._counts[name] += amount

    def _add_by_code(self, name: str, code: str, amount: int) -> None:
        counts = self._by_code[name]
        counts[code] = counts.get(code, 0) + amount


def _by_code(counts: Mapping[str, int]) -> str:
    if not counts:
        return ""
    return " (" + " ".join(f"{code}={n}" for code, n in sorted(counts.items())) + ")"
