"""Renewals that fail in an outage are retried at the next check, not at every wake-up."""

from __future__ import annotations

from tests.integration.harness import Bed, report, tally, wait_for, worker

LEASE = 6
#: One check a second (``min(1, LEASE / 4)``) and a failed delete tried again a second
#: later: between two tries of the delete, each of the two leases gets one renewal call
#: per check, two checks at the most.
RENEWALS_BETWEEN_DELETE_TRIES = 4
RENEWALS = "ChangeMessageVisibilityBatch"
DELETES = "DeleteMessageBatch"


def test_a_pending_delete_does_not_make_failed_renewals_go_out_at_once(bed: Bed) -> None:
    """Issue 33: one worker holding one lease made 672 renewal calls in 3 s of an outage.

    The delete of a task finished in the outage waits in the outbox and wakes the renewal
    thread at each try; the other task's lease fails to renew meanwhile.
    """
    held = bed.send("busy", "held", 2 * LEASE)
    acked = bed.send("busy", "acked", 2)
    with worker(bed, "prefork", 2, options={"visibility_timeout": LEASE}) as process:
        bed.server.reset_calls()
        bed.server.outage(120, "drop_connection", actions=[RENEWALS, DELETES])
        lost = f"Lost the SQS lease of task tests.integration.app.busy[{held}]"
        wait_for(lambda: lost in process.log, 60, "the held lease to run out")
        calls = [call["action"] for call in bed.server.call_log()]
        bed.server.end_outages()
        log = process.log
    between = _renewals_between(calls, DELETES)
    report(
        "renewal retries/prefork",
        **tally(bed, [held, acked]),
        renewal_calls=calls.count(RENEWALS),
        delete_calls=calls.count(DELETES),
        most_renewals_between_delete_tries=max(between, default=None),
    )
    assert len(between) >= 1, (calls, log)  # the delete failed and was tried again
    assert max(between) <= RENEWALS_BETWEEN_DELETE_TRIES, between
    assert "Traceback" not in log


def _renewals_between(actions: list[str], marker: str) -> list[int]:
    """How many renewal calls the server saw between each two ``marker`` calls."""
    counts: list[int] = []
    count: int | None = None
    for action in actions:
        if action == marker:
            if count is not None:
                counts.append(count)
            count = 0
        elif action == RENEWALS and count is not None:
            count += 1
    return counts
