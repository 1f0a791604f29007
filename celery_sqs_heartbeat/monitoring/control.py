"""Remote-control commands that show a worker's SQS leases and counters.

``celery -A proj inspect sqs_leases`` lists the leases each worker is renewing, and
``celery -A proj inspect sqs_lease_stats`` shows its counters (see
:mod:`celery_sqs_heartbeat.monitoring.metrics`). Importing this module registers both with Celery's
own extension point, :func:`celery.worker.control.inspect_command`. The commands run in
the worker's main process, which holds every lease: prefork pool processes hold none.

On SQS, remote control needs the broadcast that kombu's SQS transport does through SNS,
so it works only with the transport option ``supports_fanout: True``. The ``celery``
command line checks command names before it connects, so the module that defines the
app must import this module for ``celery inspect`` to accept these two names. From
Python, ``app.control.broadcast("sqs_leases", reply=True, timeout=5)`` needs no import.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from celery.worker.control import inspect_command

from ..leasing.manager import VisibilityExtensionManager
from ..process import snapshot, this_process
from .metrics import MetricsSnapshot

__all__ = ["lease_listing", "lease_stats", "sqs_lease_stats", "sqs_leases"]


def lease_listing(manager: VisibilityExtensionManager) -> list[dict[str, Any]]:
    """The manager's leases as JSON-ready dicts, oldest first, times to the millisecond."""
    listing = []
    for status in manager.leases():
        entry = asdict(status)
        entry["age"] = round(status.age, 3)
        entry["expires_in"] = round(status.expires_in, 3)
        listing.append(entry)
    return listing


def lease_stats(current: MetricsSnapshot) -> dict[str, Any]:
    """The counters as JSON-ready data."""
    return current.as_dict()


def sqs_leases(state: Any, **_: Any) -> list[dict[str, Any]]:
    """SQS leases this worker renews: task id and name, queue, age, renewals, expires_in."""
    return lease_listing(this_process().manager)


def sqs_lease_stats(state: Any, **_: Any) -> dict[str, Any]:
    """This worker's SQS lease counters: renewals, failures, losses, renewal margins."""
    return lease_stats(snapshot())


# Registered by call rather than as decorators: Celery's decorator is untyped.
inspect_command()(sqs_leases)
inspect_command()(sqs_lease_stats)
