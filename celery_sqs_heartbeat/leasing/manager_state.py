"""What the lease manager's parts share, and who holds its one lock when.

The manager is three parts with one job each: its public face
(:class:`~celery_sqs_heartbeat.leasing.manager.VisibilityExtensionManager`), the check
that starts calls (:class:`~celery_sqs_heartbeat.leasing.call_starter.CallStarter`), and
the settling of each call's answer
(:class:`~celery_sqs_heartbeat.leasing.call_answers.AnswerSettler`). They share the book,
the outbox and the reporter, all under one lock, so that an ack, a check and an answer
never see each other's work half done. The record is the one place that lock lives.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from .book import LeaseBook
from .outbox import Outbox
from .reporting import LeaseReporter

__all__ = ["ManagerState"]


@dataclass(eq=False)
class ManagerState:
    """The book, the outbox and the reporter, and the lock every change to them is under.

    Who holds ``lock`` when, and never across an SQS call:

    - the public face (callers' threads: acks, rejects, receives), to update the book or
      the outbox; ``confirm`` lets go of it while its call is out;
    - the check (the manager's thread), for a few calls' worth of due leases at a time,
      and once to take the outbox's due calls; it starts the calls after letting go;
    - a call's own thread, once to apply its answer, counting failures under it so no ack
      slips in between; the rest of the report comes after letting go;
    - the manager's thread while it works out how long to sleep, and while it sleeps on
      ``changed``, which whoever changes what is owed notifies.
    """

    book: LeaseBook
    outbox: Outbox
    report: LeaseReporter
    clock: Callable[[], float]
    lock: threading.Lock
    changed: threading.Condition
