"""An answer read after its lease ran out is not run (issue 24, item 2).

A solo worker on two queues: a long task of one blocks its event loop, while its long
poll of the other is out. SQS answers that poll with a new message and starts its lease;
the worker reads the answer only when the task is over. Meanwhile the lease ran out and
a second worker received and ran the message. The first then ran it too: it counted the
lease from when it read the answer. Now it counts from when the receive was sent, and
an answer read that late is delivered only if a renewal confirms SQS still holds it.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack

from tests.integration.harness import Bed, send_recorded, wait_for
from tests.integration.test_worker_stops import events_of, of_action, start

LEASE = 3
#: Under SQS's longest poll (20 s), so that the poll it blocks is still out.
BLOCKING = 5 * LEASE


def test_a_message_answered_while_a_solo_worker_was_blocked_runs_once(bed: Bed) -> None:
    other = dataclasses.replace(bed, queue=f"{bed.queue}-b")
    bed.create_queue(visibility_timeout=LEASE)
    other.create_queue(visibility_timeout=LEASE)
    options = {"visibility_timeout": LEASE}
    with ExitStack() as stack:
        solo = start(
            stack,
            bed,
            "solo",
            1,
            "solo",
            # Long polls that stay out while the task blocks the loop.
            options={**options, "wait_time_seconds": 20},
            IT_EXTRA_QUEUE=other.queue,
        )
        solo.wait_ready()
        blocking = send_recorded(bed, "busy", "blocking", BLOCKING)
        wait_for(lambda: of_action(events_of(bed, blocking), "receive"), 10, "the long task")
        late = send_recorded(other, "busy", "late", 0.1)
        wait_for(lambda: of_action(events_of(other, late), "receive"), 10, "the solo's poll")
        second = start(stack, other, "threads", 2, "second", options=options)
        second.wait_ready()
        bed.wait_for_executions(2, timeout=BLOCKING + 30)
        # The solo worker reads its answer once the long task is over: a second run of
        # the message would start then.
        wait_for(lambda: "succeeded" in solo.log, BLOCKING + 10, "the long task's end")
        bed.wait_for_executions(3, timeout=2 * LEASE)
        solo_log = solo.log
        logs = solo_log + second.log
    runs = [(r["name"], r["worker"]) for r in bed.executions()]
    assert sorted(runs) == [("blocking", "solo"), ("late", "second")], logs
    assert "Not running 1 message(s)" in solo_log, solo_log
