"""Countdowns sent with DelaySeconds: SQS holds a short wait, not the worker (issue 35).

A task published with a countdown of a few seconds, on a :data:`LEASE` a fraction of it:
held by the worker, its lease would be renewed several times while it waits; sent with
``DelaySeconds``, SQS counts it as delayed and hands it out only when it is due, and the
worker receives it once and runs it within the second or so left, renewing its lease
once at most. What each publish asked SQS for comes from the strict server's
call log (``delays``, one per message sent), what the workers did from its per-message
event log and the tasks' own records. Counts only: how late a task ran is not asserted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import pytest

from celery_sqs_heartbeat import publishing_in_batches
from tests.integration.harness import Bed, needs_sns_fanout, report, wait_for, worker
from tests.integration.test_batch_publishing import producer
from tests.integration.test_fifo import fifo_queue
from tests.integration.test_worker_stops import start

LEASE = 4
#: Several leases: a worker holding the task would renew its lease four times at least
#: (when at most half the lease is left).
COUNTDOWN = 12
OPTIONS = {"visibility_timeout": LEASE, "ack_batch_interval": 0.2}
BUSY = "tests.integration.app.busy"
#: Long enough for a second run of any task to show: a duplicate comes within a lease or two.
DUPLICATE_GUARD = 3 * LEASE


def send_delays(bed: Bed) -> list[int]:
    """The ``DelaySeconds`` of every message sent since the last reset, in order."""
    return [
        delay
        for call in bed.server.call_log()
        if call["action"] in ("SendMessage", "SendMessageBatch")
        for delay in call["delays"] or []
    ]


def delayed_in_sqs(bed: Bed) -> int:
    """How many of the queue's messages SQS counts as delayed (``DelaySeconds``) now."""
    sqs = bed.sqs()
    url = sqs.get_queue_url(QueueName=bed.queue)["QueueUrl"]
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )
    return int(attributes["Attributes"]["ApproximateNumberOfMessagesDelayed"])


def not_held(renewals: list[dict[str, Any]], receives: list[dict[str, Any]]) -> bool:
    """At most one renewal per receive: a task received when due may still wait a
    fraction of a second for its ETA, run and wait for its ack's call past the first
    renewal's margin, but a task held for the countdown takes several."""
    return len(renewals) <= len(receives)


def queue_events(bed: Bed, action: str) -> list[dict[str, Any]]:
    return [
        dict(e) for e in bed.server.events() if e["queue"] == bed.queue and e["action"] == action
    ]


def test_a_countdown_is_delayed_in_sqs_and_received_once_when_due_in_or_out_of_a_scope(
    bed: Bed,
) -> None:
    bed.create_queue(visibility_timeout=LEASE)
    app = producer(bed)
    with worker(bed, "threads", 2, options=OPTIONS) as process:
        bed.server.reset_calls()
        alone = app.send_task(BUSY, args=("alone", 0.1), countdown=COUNTDOWN)
        with publishing_in_batches():
            in_scope = app.send_task(BUSY, args=("in-scope", 0.1), countdown=COUNTDOWN)
        # Confirmed by SQS (the scope ended): both wait in SQS, neither in the worker.
        delayed = delayed_in_sqs(bed)
        calls = [call["action"] for call in bed.server.call_log() if "Send" in call["action"]]
        delays = send_delays(bed)
        bed.wait_for_executions(2, timeout=COUNTDOWN + 30)
        bed.wait_for_executions(3, timeout=DUPLICATE_GUARD)
        log = process.log
    app.close()
    receives, renewals = queue_events(bed, "receive"), queue_events(bed, "change_visibility")
    report(
        "countdown/delayed",
        calls=calls,
        delays=delays,
        delayed=delayed,
        receives=len(receives),
        renewals=len(renewals),
    )
    assert bed.runs_per_task() == {alone.id: 1, in_scope.id: 1}, log
    assert calls == ["SendMessage", "SendMessageBatch"]
    # Whole seconds to the ETA as each publish read it: never more than the countdown.
    assert len(delays) == 2 and all(COUNTDOWN - 3 <= d <= COUNTDOWN for d in delays), delays
    assert delayed == 2
    assert len(receives) == 2, receives
    assert not_held(renewals, receives), (renewals, receives)


#: The two ways a countdown goes out undelayed: the queue and the producer's options.
UNDELAYED: dict[str, tuple[Callable[[Bed, int], object], dict[str, Any]]] = {
    # A FIFO queue takes no per-message delay.
    "fifo": (fifo_queue, {}),
    "opted-out": (Bed.create_queue, {"eta_send_delay": False}),
}


@pytest.mark.parametrize("label", UNDELAYED)
def test_a_countdown_sent_without_a_delay_is_held_by_the_worker_and_runs_once(
    bed: Bed, caplog: pytest.LogCaptureFixture, label: str
) -> None:
    """Sent at once, as before issue 35, the task is held by the worker until due; there is
    no delay to warn about (kombu 5.7 warns of one a FIFO queue cannot take)."""
    create_queue, options = UNDELAYED[label]
    create_queue(bed, LEASE)
    app = producer(bed, **options)
    with worker(bed, "threads", 2, options=OPTIONS) as process:
        bed.server.reset_calls()
        with caplog.at_level(logging.WARNING):
            sent = app.send_task(BUSY, args=(label, 0.1), countdown=COUNTDOWN)
        delays = send_delays(bed)
        bed.wait_for_executions(1, timeout=COUNTDOWN + 30)
        bed.wait_for_executions(2, timeout=DUPLICATE_GUARD)
        log = process.log
    app.close()
    report(f"countdown/{label}", delays=delays)
    assert bed.runs_per_task() == {sent.id: 1}, log
    assert delays == [0]
    assert "delay" not in caplog.text, caplog.text
    # Held by the worker while it waited: its lease was renewed again and again.
    receives, renewals = queue_events(bed, "receive"), queue_events(bed, "change_visibility")
    assert len(receives) == 1, receives
    assert len(renewals) > len(receives), (renewals, log)


def test_a_retry_with_a_countdown_is_sent_delayed_by_the_worker(bed: Bed) -> None:
    bed.create_queue(visibility_timeout=LEASE)
    app = producer(bed)
    with worker(bed, "threads", 2, options=OPTIONS) as process:
        bed.server.reset_calls()
        sent = app.send_task("tests.integration.app.retries_later", args=("retried", COUNTDOWN))
        bed.wait_for_executions(2, timeout=COUNTDOWN + 30)
        bed.wait_for_executions(3, timeout=DUPLICATE_GUARD)
        delays = send_delays(bed)
        log = process.log
    app.close()
    report("countdown/retry", delays=delays)
    assert [r["name"] for r in bed.executions()] == ["retried-first", "retried"], log
    assert bed.runs_per_task() == {sent.id: 2}, log
    # The first publish has no ETA; the retry, published by the worker, waits in SQS.
    first, retry = delays
    assert first == 0 and COUNTDOWN - 3 <= retry <= COUNTDOWN, delays
    receives, renewals = queue_events(bed, "receive"), queue_events(bed, "change_visibility")
    assert len(receives) == 2, receives
    assert not_held(renewals, receives), (renewals, receives)


@needs_sns_fanout
def test_a_task_revoked_while_delayed_in_sqs_never_runs(bed: Bed) -> None:
    """Revoked by id while SQS holds it: the worker that got the broadcast remembers the
    id, and discards the task when SQS hands it out. A second countdown, not revoked and
    due after it, shows when the first would have run."""
    bed.create_queue(visibility_timeout=LEASE)
    fanout = {"supports_fanout": True}
    app = producer(bed, **fanout)
    with ExitStack() as stack:
        process = start(stack, bed, "threads", 2, "rv", options={**OPTIONS, **fanout})
        process.wait_ready()
        revoked = app.send_task(BUSY, args=("revoked", 0.1), countdown=COUNTDOWN)
        kept = app.send_task(BUSY, args=("kept", 0.1), countdown=COUNTDOWN + 2)
        replies = app.control.revoke(revoked.id, reply=True, timeout=5)
        wait_for(lambda: bed.runs_per_task().get(kept.id), COUNTDOWN + 30, "the kept task")
        bed.wait_for_executions(2, timeout=DUPLICATE_GUARD)
        log = process.log
    app.close()
    report("countdown/revoked", replies=replies, runs=bed.runs_per_task())
    assert replies, log
    assert bed.runs_per_task() == {kept.id: 1}, log
    assert f"Discarding revoked task: {BUSY}[{revoked.id}]" in log, log
