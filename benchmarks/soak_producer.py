"""The soak's producer: every planned task published at its time, through the heartbeat
transport, and kept in the list of what was published only once SQS took it.

A publish that fails (an outage, a throttled send) is tried again with the same task id:
the strict server's faulted calls never reach its queues, so a failed try sent nothing.
"""

from __future__ import annotations

import collections
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery
from soak_plan import PlannedTask
from soak_verdicts import Published

#: The app's task names, by what they do.
WORK = "soak_app.work"
FAILS = "soak_app.fails_then_succeeds"
RETRIES = "soak_app.retries_once"
#: How long a publish is tried before the task is given up (and so not published).
PUBLISH_GUARD = 120.0


@dataclass(frozen=True)
class Shapes:
    """What each task shape sends, from the run's lease and parking threshold."""

    queue: str
    fifo_queue: str
    long_seconds: float
    countdown: float
    payload_bytes: int

    def send_arguments(self, task: PlannedTask) -> tuple[str, dict[str, Any]]:
        """The task name and ``send_task`` options of a planned task."""
        on_queue: dict[str, Any] = {"queue": self.queue}
        if task.shape == "short":
            return WORK, {**on_queue, "args": [0.2]}
        if task.shape == "long":
            return WORK, {**on_queue, "args": [self.long_seconds]}
        if task.shape == "parked":
            return WORK, {**on_queue, "args": [0.1], "countdown": self.countdown}
        if task.shape == "large":
            return WORK, {**on_queue, "args": [0.2, "x" * self.payload_bytes]}
        if task.shape == "fifo":
            return WORK, {"queue": self.fifo_queue, "args": [0.5], "MessageGroupId": task.group}
        if task.shape == "released":
            return FAILS, on_queue
        return RETRIES, on_queue


class Producer(threading.Thread):
    """Publishes the plan, ``started`` being the run's start (monotonic)."""

    def __init__(
        self, app: Celery, shapes: Shapes, plan: Sequence[PlannedTask], started: float
    ) -> None:
        super().__init__(name="soak-producer", daemon=True)
        self.app = app
        self.shapes = shapes
        self.plan = plan
        self.started = started
        self.published: list[Published] = []
        self.given_up = 0
        #: Task ids whose publish failed at least once, with how many times.
        self.failed_tries: collections.Counter[str] = collections.Counter()

    def run(self) -> None:
        for task in self.plan:
            wait = self.started + task.at - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            task_id = self._publish(task)
            if task_id is None:
                self.given_up += 1
            else:
                self.published.append(Published(task_id, task.shape, task.group, task.seq))

    def _publish(self, task: PlannedTask) -> str | None:
        name, options = self.shapes.send_arguments(task)
        # Chosen here, so that every try of one task carries the same id.
        task_id = str(uuid.uuid4())
        deadline = time.monotonic() + PUBLISH_GUARD
        while time.monotonic() < deadline:
            try:
                result = self.app.send_task(name, task_id=task_id, **options)
                return str(result.id)
            except Exception:
                self.failed_tries[task_id] += 1
                time.sleep(1.0)
        return None
