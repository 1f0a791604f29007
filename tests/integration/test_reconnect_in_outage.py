"""A worker connecting while SQS answers 5xx waits for SQS instead of exiting.

Celery restarts its consumer's connection when it breaks, and the new channel lists the
queues (kombu's ``_update_queue_cache``, ``ListQueues``) as it is made, then declares and
consumes its queues. SQS answering one of those calls with a 5xx (``InternalError``) is
raised as one of the transport's connection errors
(:class:`~celery_sqs_heartbeat.startup.unavailable.SQSUnavailable`), so Celery retries the
connection until SQS is back, as it does after a dropped connection
(``drop_connection``). A worker started during such an outage, or while SQS throttles
it, waits it out the same way (``broker_connection_retry_on_startup``, Celery's default):
a transient 5xx is not a mistake of the configuration, which is what stops a worker
there, at once (credentials SQS does not know, access denied).

Found by the chaos soak (issue 33, item 1), where such workers exited with Celery's
``Unrecoverable error`` (botocore's ``ClientError`` was none of the connection errors).
It takes no more than this: one worker, one outage of SQS's 5xx.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from celery_sqs_heartbeat.testing.faults import FaultKind
from tests.integration.harness import (
    CONNECTION_LOST,
    SETTLE_GUARD,
    Bed,
    Worker,
    assert_reconnected,
    reconnected,
    settle,
    worker,
)

LEASE = 4
#: The drop comes this long after the worker is ready, inside the outage begun then.
DROP_AFTER = 2
#: A failure guard: the outage is ended by the test once the worker has met it.
OUTAGE = 4 * SETTLE_GUARD
#: What the worker logs of the channel's first call failing, as Celery retries it.
LISTING_FAILED = "ListQueues answered InternalError (HTTP 500)"
#: The same, throttled (``Throttling`` or ``ThrottlingException``, by protocol).
LISTING_THROTTLED = "ListQueues answered Throttling"


@pytest.fixture(autouse=True)
def _no_outage_outlives_its_test(bed: Bed) -> Iterator[None]:
    """The server is shared with the tests after these, and each outage is long."""
    yield
    bed.server.end_outages()


def test_a_worker_whose_connection_drops_while_sqs_answers_5xx_reconnects_after(
    bed: Bed,
) -> None:
    with worker(
        bed,
        "threads",
        2,
        options={"visibility_timeout": LEASE},
        IT_DROP_CONNECTION_AFTER=DROP_AFTER,
    ) as process:
        bed.server.outage(OUTAGE, "server_error")
        # Failure guards: the reconnect meets the outage, or the worker exits at once.
        met = settle(lambda: LISTING_FAILED in process.log or process.process.poll() is not None)
        bed.server.end_outages()
        settle(lambda: reconnected(process.log) or process.process.poll() is not None)
        log = process.log
        alive = process.process.poll() is None
    assert "Unrecoverable error" not in log, log
    assert alive, log
    assert_reconnected(log)
    # The new connection met the outage: the test proves nothing otherwise.
    assert met and LISTING_FAILED in log[log.find(CONNECTION_LOST) :], log


@pytest.mark.parametrize(
    ("kind", "failed"),
    [("server_error", LISTING_FAILED), ("throttle", LISTING_THROTTLED)],
)
def test_a_worker_started_while_sqs_answers_5xx_or_throttles_starts_once_it_answers(
    bed: Bed, kind: FaultKind, failed: str
) -> None:
    bed.server.outage(OUTAGE, kind)
    process = Worker(bed, "threads", 2, "w1", bed.env(IT_RETRY_ON_STARTUP=1))
    try:
        # Failure guards: the first connection meets the outage, or the worker exits.
        met = settle(lambda: failed in process.log or process.process.poll() is not None)
        bed.server.end_outages()
        assert met and failed in process.log, process.log
        process.wait_ready(timeout=SETTLE_GUARD)
    finally:
        process.warm_shutdown()


@pytest.mark.parametrize(
    ("kind", "code"),
    [("invalid_credentials", "InvalidClientTokenId"), ("access_denied", "AccessDenied")],
)
def test_a_worker_started_while_sqs_refuses_it_stops_at_once(
    bed: Bed, kind: FaultKind, code: str
) -> None:
    """A mistake of the configuration is not waited out: no retry would fix it."""
    bed.server.outage(OUTAGE, kind)
    process = Worker(bed, "threads", 2, "w1", bed.env(IT_RETRY_ON_STARTUP=1))
    try:
        # A failure guard: a worker that retries is still there after it.
        settle(lambda: process.process.poll() is not None)
        log = process.log
        status = process.process.poll()
    finally:
        process.warm_shutdown()
    assert status == 1, log
    assert f"Unrecoverable error: ClientError('An error occurred ({code})" in log, log
    assert "Cannot connect to" not in log, log
