"""``celery inspect ping --timeout 1`` answers within its timeout, on both ends of the wire."""

from __future__ import annotations

import time
import uuid

from tests.integration.harness import Bed, needs_sns_fanout, worker
from tests.integration.test_monitoring import run_celery

#: The worker's kombu waits this long after an empty poll before polling a queue again.
WORKER_POLLING_INTERVAL = 10
WORKER_OPTIONS = {
    "supports_fanout": True,
    "wait_time_seconds": 1,
    "polling_interval": WORKER_POLLING_INTERVAL,
}
#: SQS's longest long poll, on the client that pings.
CLIENT_LONG_POLL = 20
CLIENT_OPTIONS = {"supports_fanout": True, "wait_time_seconds": CLIENT_LONG_POLL}
PINGS = 3


def ping(bed: Bed) -> tuple[str, float]:
    """One ``celery inspect ping --timeout 1``, as an operator runs it: output and seconds."""
    started = time.monotonic()
    process = run_celery(
        bed, "inspect", "ping", "--timeout", "1", options=CLIENT_OPTIONS, timeout=90
    )
    return process.stdout + process.stderr, time.monotonic() - started


@needs_sns_fanout
def test_inspect_ping_with_timeout_1_is_answered_and_ends_in_seconds(bed: Bed) -> None:
    """The worker hears the ping at once, and the client stops listening when its timeout says.

    Before: the client's last, empty long poll of its reply queue took the whole 20 s;
    and the worker's kombu looked at its mailbox again only ``polling_interval`` (10 s
    here) after each empty 1-s poll, so most pings came while nobody listened and got
    no answer within 1 s. The bound is the client's one long poll: a ping that waited
    its reply queue out took at least that (22 to 32 s before), whatever the machine's
    load; it is not a timing.
    """
    name = f"tr{uuid.uuid4().hex[:6]}"
    with worker(bed, "prefork", 1, name=name, options=WORKER_OPTIONS):
        pings = [ping(bed) for _ in range(PINGS)]

    unanswered = [output for output, _ in pings if f"{name}@" not in output]
    assert unanswered == [], unanswered
    took = [round(seconds, 1) for _, seconds in pings]
    assert max(took) < CLIENT_LONG_POLL, f"inspect ping --timeout 1 took {took} s"
