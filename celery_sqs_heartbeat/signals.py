"""Celery-style signals about leases, sent in the worker process that holds them.

Connect to them as to Celery's own (``@lease_lost.connect``). Handlers run in the
thread that renews the leases, so they should be quick and must not block.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = ["lease_lost", "lease_released", "lease_renewed"]

#: A message's lease was renewed. Sender: the task name.
lease_renewed = Signal(
    name="lease_renewed",
    providing_args={"task_id", "task_name", "queue", "visibility_timeout", "renewals"},
)

#: A message was made visible again instead of deleted (failure, requeue or shutdown).
lease_released = Signal(
    name="lease_released",
    providing_args={"task_id", "task_name", "queue", "delay", "reason"},
)

#: A message's lease is gone while its task is still pending: SQS may deliver it again.
lease_lost = Signal(
    name="lease_lost",
    providing_args={"task_id", "task_name", "queue", "reason"},
)
