"""Whether a worker runs its tasks on its event loop's own thread: Celery's solo pool.

Such a worker reads nothing from SQS while a task runs. An answer to a receive that was
on the wire when the task started waits, unread and so without a lease, until the task
ends: past its visibility timeout if the task is longer, when SQS has shown the message
again and the worker must drop its copy (it may run elsewhere meanwhile). kombu's one
receive per queue is never on the wire while a task runs: the next one goes out after
the task, from the turn that delivered it. So a solo worker keeps that one receive per
queue, sized to the whole prefetch window, whose messages are all leased before its first
task starts (:func:`~celery_sqs_heartbeat.receiving.chains.most_receives_in_flight`).

Read from Celery's ``worker_init`` signal, sent before the worker's consumer connects.
"""

from __future__ import annotations

from typing import Any

from celery import concurrency
from celery.concurrency.solo import TaskPool as SoloPool

__all__ = ["runs_tasks_on_the_loop"]


def runs_tasks_on_the_loop(pool_cls: Any) -> bool:
    """Whether ``pool_cls`` (a worker's ``pool_cls``: a class, or a name Celery resolves)
    is the solo pool or one built on it."""
    try:
        pool = concurrency.get_implementation(pool_cls)
    except (ImportError, AttributeError, ValueError):
        return False
    return isinstance(pool, type) and issubclass(pool, SoloPool)
