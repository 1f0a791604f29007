"""A worker lives on when SQS fails the delete of a broadcast; the delete is retried.

A worker's mailbox is consumed without acks: kombu deletes each broadcast as it delivers
it, with an asynchronous ``DeleteMessage`` on the worker's event loop, whose 5xx raised a
bare ``Exception`` inside the loop: Celery's "Unrecoverable error", the worker exited
(found by the chaos soak, issue 33, item 1, when ``celery events`` started while 3 % of
the workers' deletes failed). On the loop (prefork, threads, solo) the transport now
sends that delete through its outbox, as it sends an acked task's; a gevent worker
deletes it blocking, and hands a failed delete to the outbox. Either way it is retried
until SQS confirms it, the broadcast hidden meanwhile, so no command runs twice.
"""

from __future__ import annotations

import contextlib

import pytest

from celery_sqs_heartbeat.testing.recorder import Event
from tests.integration.harness import Bed, needs_sns_fanout, settle, worker
from tests.integration.test_monitoring import REMOTE_CONTROL, in_process_app

POOLS = [("prefork", 1), ("threads", 1), ("solo", 1), ("gevent", 1)]


def _mailbox_events(bed: Bed) -> list[Event]:
    """What SQS saw become of the messages of the worker's mailbox (not a reply queue)."""
    return [
        event
        for event in bed.server.events()
        if event["queue"].endswith("pidbox") and "reply" not in event["queue"]
    ]


def _outcomes(events: list[Event]) -> dict[str | None, list[str]]:
    """Each message's successful receives and deletes, in order."""
    outcomes: dict[str | None, list[str]] = {}
    for event in events:
        if event["result"] == "ok" and event["action"] != "change_visibility":
            outcomes.setdefault(event["message_id"], []).append(event["action"])
    return outcomes


def _all_deleted(bed: Bed) -> bool:
    outcomes = _outcomes(_mailbox_events(bed))
    return bool(outcomes) and all("delete" in actions for actions in outcomes.values())


@needs_sns_fanout
@pytest.mark.parametrize(("pool", "concurrency"), POOLS)
def test_a_worker_lives_on_when_sqs_fails_the_delete_of_a_broadcast(
    bed: Bed, pool: str, concurrency: int
) -> None:
    with worker(bed, pool, concurrency, options=REMOTE_CONTROL) as process:
        bed.server.fail_fraction(1.0, "server_error", ["DeleteMessage", "DeleteMessageBatch"])
        replies: list[dict[str, object]] = []
        with (
            in_process_app(bed) as app,
            app.connection_for_write() as connection,
            # The client's own deletes of the replies fail too; only the worker matters.
            contextlib.suppress(Exception),
        ):
            replies = app.control.ping(timeout=3, connection=connection)
        # A failure guard: the worker exited at once after the failed delete, if at all.
        settle(lambda: process.process.poll() is not None, timeout=10)
        bed.server.clear_faults()
        # Retried once SQS takes deletes again: the broadcast leaves the mailbox.
        settle(lambda: _all_deleted(bed), timeout=60)
        outcomes = _outcomes(_mailbox_events(bed))
        log = process.log
        alive = process.process.poll() is None
    assert "Unrecoverable error" not in log, log
    assert alive, log
    assert replies, log
    # Each broadcast received once (never again while its delete was retried), then deleted.
    assert outcomes, log
    assert all(actions == ["receive", "delete"] for actions in outcomes.values()), outcomes
