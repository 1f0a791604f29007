"""The next receive goes out when acks free the prefetch window, not on kombu's timer.

kombu's SQS channel looks at a full window again only ``polling_interval`` later. Set to
30 s here, it would hold each round of tasks back by 30 s on prefork and threads, and by
the synchronous loop's 2 s on gevent; the transport wakes the receive loop on the ack.
"""

from __future__ import annotations

import time

import pytest

from .harness import Bed, report, wait_for, worker

TASKS = 12
TASK_SECONDS = 0.2
#: kombu's wait when the window is full; no round of tasks should ever wait for it.
POLLING_INTERVAL = 30
#: Six rounds of 0.2 s tasks on two slots take about 1.5 s; kombu's own wait makes them
#: 5 x 30 s on prefork and threads and 5 x 2 s or more on gevent.
ROUNDS_DEADLINE = 8.0
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
        2,
        options={"polling_interval": POLLING_INTERVAL, "visibility_timeout": 30},
        IT_PREFETCH_MULTIPLIER=1,
    ) as process:
        done = bed.wait_for_executions(TASKS, timeout=ROUNDS_DEADLINE + 5)
        bed.server.reset_calls()
        time.sleep(IDLE_SECONDS)
        idle_receives = bed.server.calls().get("ReceiveMessage", 0)
        log = process.log
    starts = sorted(record["start"] for record in done)
    elapsed = starts[-1] - starts[0] if starts else None
    report(
        f"prefetch room/{pool}",
        executions=len(done),
        first_to_last_start=elapsed,
        idle_receives=idle_receives,
    )
    assert bed.runs_per_task() == dict.fromkeys(sent, 1), log
    assert elapsed is not None and elapsed < ROUNDS_DEADLINE, log
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
        wait_for(lambda: len(received(bed)) >= 2 or None, 20, "both long tasks received")
        short_id = bed.send("busy", "short", 0.1)
        done = bed.wait_for_executions(1, timeout=LONG_SECONDS - 2)
        log = process.log
    assert [record["task_id"] for record in done] == [short_id], log


def received(bed: Bed) -> list[str | None]:
    return [
        event["message_id"]
        for event in bed.server.events()
        if event["queue"].endswith(bed.queue) and event["action"] == "receive"
    ]
