"""A slow SQS call must not hold renewals back: an SQS brownout on deletes, or receives.

Two workers, a 6 s lease and every other option at its default, with SQS answering each
delete (or each receive) 4 s late; botocore's read timeout is longer, so the calls
succeed, slowly. Short tasks keep deletes on the wire all the time while two long tasks
need a renewal every few seconds. Were deletes sent one after another on the thread
that checks the leases, each would hold the next renewal back by 4 s, more than the
margin, and SQS would hand the long tasks to the other worker while they still run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from celery_sqs_heartbeat.testing import StrictSQSServer
from tests.integration.harness import (
    Bed,
    no_copy_left,
    overlapping,
    report,
    tally,
    wait_out_copies,
    worker,
)

pytestmark = pytest.mark.integration

LEASE = 6
#: How much later SQS answers each slow call.
LATENCY = 4.0
SLOW_CALLS = {
    "deletes": ["DeleteMessageBatch", "DeleteMessage"],
    "receives": ["ReceiveMessage"],
}
LONG_TASKS = 2
LONG_SECONDS = 16
SHORT_TASKS = 40
SHORT_SECONDS = 0.05


@pytest.fixture
def slow(sqs_server: StrictSQSServer, request: pytest.FixtureRequest) -> Iterator[str]:
    sqs_server.add_latency(LATENCY, actions=SLOW_CALLS[request.param])
    try:
        yield request.param
    finally:
        sqs_server.clear_faults()


@pytest.mark.parametrize(
    ("slow", "pool"),
    [("deletes", "threads"), ("deletes", "prefork"), ("receives", "threads")],
    indirect=["slow"],
)
def test_long_tasks_run_once_while_every_slow_call_takes_4_s(
    bed: Bed, slow: str, pool: str
) -> None:
    bed.create_queue(visibility_timeout=LEASE)
    sent = [bed.send("busy", f"long-{n}", LONG_SECONDS) for n in range(LONG_TASKS)]
    sent += [bed.send("busy", f"short-{n}", SHORT_SECONDS) for n in range(SHORT_TASKS)]
    total = LONG_TASKS + SHORT_TASKS
    with ExitStack() as workers:
        processes = [
            workers.enter_context(
                worker(bed, pool, 4, name=name, options={"visibility_timeout": LEASE})
            )
            for name in ("w1", "w2")
        ]
        done = bed.wait_for_executions(total, timeout=LONG_SECONDS + 90)
        # No copy can come once the queue is drained; one received before may still run.
        drained = no_copy_left(bed)["drained"]
        wait_out_copies(bed, total, LONG_SECONDS)
        logs = [process.log for process in processes]
    counts = tally(bed, sent)
    report(
        f"slow {slow}, {pool}",
        **counts,
        lost_lease_lines=sum(log.count("Lost the SQS lease") for log in logs),
    )

    assert drained
    assert counts == {"sent": total, "executed": total, "duplicates": 0, "lost": 0}
    assert bed.runs_per_task() == dict.fromkeys(sent, 1)
    assert overlapping(done) == []
    assert not any("Lost the SQS lease" in log for log in logs)
