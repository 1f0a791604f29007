"""The next receive goes out when acks free the prefetch window, not on kombu's timer.

kombu's SQS channel looks at a full window again only after a wait: ``polling_interval``
on prefork and threads, 30 s here, and on gevent the 2 s for which Celery's synchronous
loop drains the connection (kombu cuts its wait to that). The transport wakes the
receive loop on the ack instead.

A time limit on the whole run said so too, until a loaded machine stretched every round
past it. The server's event log says it in order: every receive comes after the acks
that made room for it, and before kombu's wait, counted from the receive that filled
the window, would have let it out.
"""

from __future__ import annotations

import itertools
import time

import pytest

from celery_sqs_heartbeat.testing import Event
from tests.integration.harness import Bed, report, wait_for, worker

TASKS = 12
TASK_SECONDS = 0.2
CONCURRENCY = 2
#: Celery's prefetch window: concurrency x ``worker_prefetch_multiplier`` (1).
WINDOW = CONCURRENCY
POLLING_INTERVAL = 30
#: kombu's wait when the window is full. Celery's synchronous loop (gevent) calls
#: ``drain_events(timeout=2.0)``, and kombu's blocking transport sleeps no longer.
KOMBU_WAIT = {"prefork": POLLING_INTERVAL, "threads": POLLING_INTERVAL, "gevent": 2.0}
#: Full windows that kombu would wait out: each of its receives brings one window at most.
REFILLS = TASKS // WINDOW - 1
#: Only a failure guard: the tasks take about 2 s; kombu's waits 5 x 30 s.
EXECUTIONS_GUARD = 2 * POLLING_INTERVAL
IDLE_SECONDS = 3
#: Long enough that a task waiting for one of these to end is easy to tell apart.
LONG_SECONDS = 12


@pytest.mark.parametrize("pool", ["prefork", "threads", "gevent"])
def test_a_full_window_receives_again_as_soon_as_tasks_are_acked(bed: Bed, pool: str) -> None:
    bed.create_queue(visibility_timeout=30)
    sent = [bed.send("busy", f"t{n}", TASK_SECONDS) for n in range(TASKS)]
    with worker(
        bed,
        pool,
        CONCURRENCY,
        options={"polling_interval": POLLING_INTERVAL, "visibility_timeout": 30},
        IT_PREFETCH_MULTIPLIER=1,
    ) as process:
        done = bed.wait_for_executions(TASKS, timeout=EXECUTIONS_GUARD)
        bed.server.reset_calls()
        time.sleep(IDLE_SECONDS)
        idle_receives = bed.server.calls().get("ReceiveMessage", 0)
        log = process.log
    received_at = sorted(event["t"] for event in receives(bed))
    ends = sorted(record["end"] for record in done)
    # A task records its end before it returns, hence before its ack frees its slot.
    ended_before = [sum(end < t for end in ends) for t in received_at]
    waits = [later - earlier for earlier, later in itertools.pairwise(received_at)]
    report(
        f"prefetch room/{pool}",
        executions=len(done),
        ended_before_each_receive=ended_before,
        waits_between_receives=[round(wait, 2) for wait in waits],
        idle_receives=idle_receives,
    )
    assert bed.runs_per_task() == dict.fromkeys(sent, 1), log
    assert len(received_at) == TASKS, log
    # After the acks: the k-th message (from 0) is received once k + 1 - WINDOW tasks ended.
    assert all(ended >= k + 1 - WINDOW for k, ended in enumerate(ended_before)), ended_before
    # Woken by the ack, never by a timer: kombu would have waited its polling interval
    # from the receive that filled the window, and the park waits as long for an ack
    # that never wakes it.
    assert max(waits) < POLLING_INTERVAL, waits
    # On gevent kombu waits only 2 s, about what a loaded machine adds to some rounds:
    # its waits are told apart by their sum, 2 s for each of the refills at least.
    assert sum(waits) < REFILLS * KOMBU_WAIT[pool], waits
    assert "Traceback" not in log
    # Idle, the loop long-polls (1 s), then polls again at once (kombu 5.5, 5.6) or after
    # polling_interval (5.7), as kombu does: at most a receive per second, never a spin.
    assert idle_receives <= IDLE_SECONDS + 1, idle_receives


def test_room_for_less_than_a_full_call_is_used_after_kombus_wait(bed: Bed) -> None:
    """Two long tasks hold two of three slots: a receive for one is worth it after a second.

    A full call's worth is two slots here (half the window), so the loop parks, and
    kombu's wait (polling_interval, 1 s) ends the park with any room at all.
    """
    bed.create_queue(visibility_timeout=30)
    for n in range(2):
        bed.send("busy", f"long-{n}", LONG_SECONDS)
    with worker(bed, "prefork", 3, options={"visibility_timeout": 30}) as process:
        wait_for(lambda: len(receives(bed)) >= 2 or None, 20, "both long tasks received")
        short_id = bed.send("busy", "short", 0.1)
        done = bed.wait_for_executions(1, timeout=LONG_SECONDS - 2)
        log = process.log
    assert [record["task_id"] for record in done] == [short_id], log


def receives(bed: Bed) -> list[Event]:
    """The server's receive events of the bed's queue, one per message received."""
    return [
        event
        for event in bed.server.events()
        if event["queue"].endswith(bed.queue) and event["action"] == "receive"
    ]
