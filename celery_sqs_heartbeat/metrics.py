"""Counters of lease health in one process: pure, thread-safe, no I/O.

A lease that runs out makes no noise. The only symptom is a task that runs twice, long
after the fact. These counters show the trouble before that happens: how many renewals
fail and why, how many leases were lost, and above all how much time a lease still had
left when its renewal went out. That margin is the number to tune
``visibility_extension_threshold`` with: a minimum close to zero means renewals are
sent just in time, or too late.

The renewal manager and the transport write the counters; :func:`snapshot` reads them,
and so do the DEBUG summary, the Prometheus collector and the ``sqs_lease_stats`` inspect
command. A forked child (a prefork pool process) starts from zero, like the shared
manager: the parent's leases and counts are not the child's.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .sqs_facts import error_code

__all__ = [
    "MARGIN_BUCKETS",
    "LeaseMetrics",
    "MarginHistogram",
    "MetricsSnapshot",
    "failure_code",
    "process_metrics",
    "record_receive_error",
    "snapshot",
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
    keep the code (as :func:`~celery_sqs_heartbeat.sqs_facts.error_code` shows it) or
    the exception name, and never the message, so they stay few.
    """
    match = _CODE_AT_START.match(reason)
    if match is None:
        return "NoAnswer" if reason.strip().lower() == "no answer" else "Unknown"
    return error_code(match.group(1))


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


@dataclass(frozen=True)
class MetricsSnapshot:
    """The process's lease counters at one moment; counts are since the process started.

    Read-only throughout, mappings included, so it can be handed to any thread.
    """

    #: Leases the process is renewing now.
    leases_held: int
    #: ChangeMessageVisibilityBatch calls made to renew leases, and their entries.
    renewal_calls: int
    renewal_entries: int
    #: Renewal entries that failed, by error code (``ThrottlingException``,
    #: ``MessageNotInflight``, ``ReadTimeoutError``, ...).
    renewal_failures: Mapping[str, int]
    #: Leases given up while their task was pending: SQS may deliver them again.
    leases_lost: int
    #: Messages made visible again on purpose (reject, requeue, shutdown), as confirmed.
    messages_released: int
    #: Failed ReceiveMessage calls, by error code.
    receive_errors: Mapping[str, int]
    renewal_margin: MarginHistogram
    #: Acked messages whose delete SQS has not confirmed yet (their leases are held).
    deletes_pending: int = 0
    #: DeleteMessageBatch calls, and the deletes SQS confirmed.
    delete_calls: int = 0
    messages_deleted: int = 0
    #: Delete entries that failed, by error code, and those of them tried again.
    delete_failures: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    deletes_retried: int = 0

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
        return {
            "leases_held": self.leases_held,
            "renewal_calls": self.renewal_calls,
            "renewal_entries": self.renewal_entries,
            "renewal_failures": dict(self.renewal_failures),
            "leases_lost": self.leases_lost,
            "messages_released": self.messages_released,
            "receive_errors": dict(self.receive_errors),
            "renewal_margin": self.renewal_margin.as_dict(),
            "deletes_pending": self.deletes_pending,
            "delete_calls": self.delete_calls,
            "messages_deleted": self.messages_deleted,
            "delete_failures": dict(self.delete_failures),
            "deletes_retried": self.deletes_retried,
        }

    def summary(self) -> str:
        """One log line with everything an operator scans for, as ``name=value`` pairs."""
        margin = self.renewal_margin
        median = margin.quantile_bound(0.5)
        if margin.min is not None and margin.max is not None and median is not None:
            margin_text = (
                f"margin_seconds min={margin.min:.2f} median<={median:.2f} max={margin.max:.2f}"
            )
        else:
            margin_text = "margin_seconds none"
        return (
            f"SQS lease summary: held={self.leases_held} "
            f"renewal_calls={self.renewal_calls} renewal_entries={self.renewal_entries} "
            f"renewal_failures={self.renewal_failures_total}{_by_code(self.renewal_failures)} "
            f"lost={self.leases_lost} released={self.messages_released} "
            f"receive_errors={self.receive_errors_total}{_by_code(self.receive_errors)} "
            f"deletes_pending={self.deletes_pending} delete_calls={self.delete_calls} "
            f"deleted={self.messages_deleted} "
            f"delete_failures={self.delete_failures_total}{_by_code(self.delete_failures)} "
            f"deletes_retried={self.deletes_retried} "
            f"{margin_text} (counts since the process started)"
        )


@dataclass
class _Counts:
    leases_held: int = 0
    renewal_calls: int = 0
    renewal_entries: int = 0
    renewal_failures: dict[str, int] = field(default_factory=dict)
    leases_lost: int = 0
    messages_released: int = 0
    receive_errors: dict[str, int] = field(default_factory=dict)
    margin_buckets: list[int] = field(default_factory=lambda: [0] * len(MARGIN_BUCKETS))
    margin_count: int = 0
    margin_sum: float = 0.0
    margin_min: float | None = None
    margin_max: float | None = None
    deletes_pending: int = 0
    delete_calls: int = 0
    messages_deleted: int = 0
    delete_failures: dict[str, int] = field(default_factory=dict)
    deletes_retried: int = 0


class LeaseMetrics:
    """The counters themselves. One per process is enough: see :func:`process_metrics`.

    Every method takes one lock for a few additions, so recording from the renewal
    thread and the worker's loop at once is safe and never waits on I/O.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = _Counts()

    def reset(self) -> None:
        """Back to zero, with a new lock (after a fork the old one may be held)."""
        self._lock = threading.Lock()
        self._counts = _Counts()

    def set_leases_held(self, count: int) -> None:
        with self._lock:
            self._counts.leases_held = count

    def record_renewal_call(self, entries: int) -> None:
        """A ChangeMessageVisibilityBatch call renewing ``entries`` leases went out."""
        with self._lock:
            self._counts.renewal_calls += 1
            self._counts.renewal_entries += entries

    def record_renewal_margin(self, seconds: float) -> None:
        """A lease's renewal was sent ``seconds`` before the lease would have run out."""
        with self._lock:
            counts = self._counts
            index = next(i for i, le in enumerate(MARGIN_BUCKETS) if seconds <= le)
            counts.margin_buckets[index] += 1
            counts.margin_count += 1
            counts.margin_sum += seconds
            if counts.margin_min is None or seconds < counts.margin_min:
                counts.margin_min = seconds
            if counts.margin_max is None or seconds > counts.margin_max:
                counts.margin_max = seconds

    def record_renewal_failure(self, code: str, entries: int = 1) -> None:
        """``entries`` renewal entries failed with ``code`` (see :func:`failure_code`)."""
        with self._lock:
            failures = self._counts.renewal_failures
            failures[code] = failures.get(code, 0) + entries

    def record_lease_lost(self) -> None:
        with self._lock:
            self._counts.leases_lost += 1

    def record_released(self, count: int) -> None:
        """``count`` messages were made visible again, as SQS confirmed."""
        with self._lock:
            self._counts.messages_released += count

    def set_deletes_pending(self, count: int) -> None:
        with self._lock:
            self._counts.deletes_pending = count

    def record_delete_call(self, deleted: int) -> None:
        """A DeleteMessageBatch call went out and SQS confirmed ``deleted`` of its entries."""
        with self._lock:
            self._counts.delete_calls += 1
            self._counts.messages_deleted += deleted

    def record_delete_failure(self, code: str, retried: bool) -> None:
        with self._lock:
            failures = self._counts.delete_failures
            failures[code] = failures.get(code, 0) + 1
            if retried:
                self._counts.deletes_retried += 1

    def record_receive_error(self, code: str) -> None:
        """A ReceiveMessage call failed with ``code``."""
        with self._lock:
            errors = self._counts.receive_errors
            errors[code] = errors.get(code, 0) + 1

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            counts = self._counts
            cumulative, seen = [], 0
            for le, in_bucket in zip(MARGIN_BUCKETS, counts.margin_buckets, strict=True):
                seen += in_bucket
                cumulative.append((le, seen))
            return MetricsSnapshot(
                leases_held=counts.leases_held,
                renewal_calls=counts.renewal_calls,
                renewal_entries=counts.renewal_entries,
                renewal_failures=MappingProxyType(dict(counts.renewal_failures)),
                leases_lost=counts.leases_lost,
                messages_released=counts.messages_released,
                receive_errors=MappingProxyType(dict(counts.receive_errors)),
                renewal_margin=MarginHistogram(
                    buckets=tuple(cumulative),
                    count=counts.margin_count,
                    sum=counts.margin_sum,
                    min=counts.margin_min,
                    max=counts.margin_max,
                ),
                deletes_pending=counts.deletes_pending,
                delete_calls=counts.delete_calls,
                messages_deleted=counts.messages_deleted,
                delete_failures=MappingProxyType(dict(counts.delete_failures)),
                deletes_retried=counts.deletes_retried,
            )


_process_metrics = LeaseMetrics()


def process_metrics() -> LeaseMetrics:
    """The counters of this process, written by the shared manager and the transport."""
    return _process_metrics


def snapshot() -> MetricsSnapshot:
    """This process's lease counters now: ``celery_sqs_heartbeat.metrics.snapshot()``."""
    return _process_metrics.snapshot()


def record_receive_error(code: str) -> None:
    """Count a failed ReceiveMessage call; ``code`` is SQS's error code or the error's name."""
    _process_metrics.record_receive_error(code)


def _by_code(counts: Mapping[str, int]) -> str:
    if not counts:
        return ""
    return " (" + " ".join(f"{code}={n}" for code, n in sorted(counts.items())) + ")"


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_process_metrics.reset)
