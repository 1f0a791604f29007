"""Several ReceiveMessage calls in flight on a queue with a backlog, counted (issue 34).

A worker drains a backlog of no-op tasks with 15 ms added to every SQS call. The
server's call log says, by counts and order only: receives of the queue overlapped
(several in flight), the receives in flight at any one time never asked for more
messages than the prefetch window holds, no two long polls were out at once, every
task ran once, and once the backlog was gone the worker went back to kombu's one long
poll at a time. With ``receives_in_flight`` 1 no two receives overlap, as with kombu's own loop.
"""

from __future__ import annotations

import collections
import time
from typing import Any

import pytest

from celery_sqs_heartbeat import publishing_in_batches
from celery_sqs_heartbeat.testing import Call
from tests.integration.harness import Bed, report, worker

TASKS = 150
LATENCY = 0.015
#: Celery's prefetch window: concurrency x ``worker_prefetch_multiplier`` (4).
MULTIPLIER = 4
POOLS = {"prefork": 4, "threads": 8, "gevent": 8}
#: Only a failure guard: the backlog drains in a few seconds.
GUARD = 120
#: The transport's default ``receives_in_flight``.
RECEIVES_IN_FLIGHT = 4
#: Idle after the backlog: several of the harness's 1 s long polls.
IDLE_SECONDS = 4


def publish_backlog(bed: Bed, count: int) -> list[str]:
    """``count`` no-op tasks, published in batches before any worker runs."""
    with bed.client_app("producer") as app, publishing_in_batches():
        results = [
            app.send_task("tests.integration.app.busy", args=[f"t{n}", 0], queue=bed.queue)
            for n in range(count)
        ]
    return [str(result.id) for result in results]


def receives_of(bed: Bed, log: list[Call]) -> list[Call]:
    return [c for c in log if c["action"] == "ReceiveMessage" and c["queue"] == bed.queue]


def most_in_flight(receives: list[Call]) -> tuple[int, int]:
    """The most receives on the wire at once, and the most messages they asked for at once."""
    edges = sorted(
        [(call["arrived"], 1, call["asked"] or 0) for call in receives]
        + [(call["answered"], -1, -(call["asked"] or 0)) for call in receives],
        key=lambda edge: (edge[0], edge[1]),  # an answer before a send at the same instant
    )
    calls = asked = most_calls = most_asked = 0
    for _, step, messages in edges:
        calls += step
        asked += messages
        most_calls, most_asked = max(most_calls, calls), max(most_asked, asked)
    return most_calls, most_asked


def drain(bed: Bed, pool: str, options: dict[str, Any]) -> dict[str, Any]:
    bed.create_queue(visibility_timeout=30)
    sent = publish_backlog(bed, TASKS)
    bed.server.add_latency(LATENCY)
    try:
        return drain_slowly(bed, sent, pool, options)
    finally:
        bed.server.clear_faults()  # the server is shared with the tests after this one


def drain_slowly(bed: Bed, sent: list[str], pool: str, options: dict[str, Any]) -> dict[str, Any]:
    bed.server.reset_calls()
    with worker(
        bed,
        pool,
        POOLS[pool],
        options={"visibility_timeout": 30, **options},
        IT_PREFETCH_MULTIPLIER=MULTIPLIER,
    ) as process:
        bed.wait_for_executions(TASKS, timeout=GUARD)
        backlog = receives_of(bed, bed.server.call_log())
        time.sleep(IDLE_SECONDS)
        idle = receives_of(bed, bed.server.call_log())[len(backlog) :]
        log = process.log
    return {"sent": sent, "backlog": backlog, "idle": idle, "log": log}


@pytest.mark.parametrize("pool", list(POOLS))
def test_a_backlog_is_received_with_several_calls_in_flight_within_the_window(
    bed: Bed, pool: str
) -> None:
    run = drain(bed, pool, {})
    backlog, idle, log = run["backlog"], run["idle"], run["log"]
    calls, asked = most_in_flight(backlog)
    window = POOLS[pool] * MULTIPLIER
    report(
        f"receives in flight/{pool}",
        receives=len(backlog),
        most_in_flight=calls,
        most_asked_at_once=asked,
        window=window,
        idle_receives=len(idle),
        idle_most_in_flight=most_in_flight(idle)[0],
    )
    assert bed.runs_per_task() == dict.fromkeys(run["sent"], 1), log
    assert calls >= 2, backlog
    assert asked <= window, backlog
    # Never two long polls at once: the others beside one ask SQS not to wait.
    long_polls = [call for call in backlog + idle if call["wait"] != 0]
    assert most_in_flight(long_polls)[0] == 1, long_polls
    # Idle: each extra chain ended at its first answer that was not full, at most one
    # receive without wait each; then long polls only, as many as kombu makes (at most
    # one a second), one at a time (above).
    without_wait = [call for call in idle if call["wait"] == 0]
    assert len(without_wait) <= RECEIVES_IN_FLIGHT - 1, idle
    assert idle and idle[-1]["wait"] != 0, idle
    assert len(idle) - len(without_wait) <= IDLE_SECONDS + 1, idle
    assert "Traceback" not in log


def test_with_one_receive_in_flight_no_two_receives_overlap(bed: Bed) -> None:
    run = drain(bed, "threads", {"receives_in_flight": 1})
    calls, _ = most_in_flight(run["backlog"])

    assert bed.runs_per_task() == dict.fromkeys(run["sent"], 1), run["log"]
    assert calls == 1, run["backlog"]


#: The solo cell's lease: its tasks outlive it, so an answer that waits for one is late.
SOLO_LEASE = 3


def test_a_solo_worker_keeps_one_receive_in_flight(bed: Bed) -> None:
    """A solo worker runs each task on its event loop: an answer that came in meanwhile
    would wait unread past its lease (SQS hands the message out again, and the worker
    drops the late copy). So its queue keeps kombu's one receive at a time, each sized to
    the whole window, whose messages are all leased before the first task starts."""
    bed.create_queue(visibility_timeout=SOLO_LEASE)
    sent = [bed.send("busy", f"t{n}", SOLO_LEASE + 1) for n in range(4)]
    bed.server.reset_calls()
    with worker(
        bed,
        "solo",
        1,
        options={"visibility_timeout": SOLO_LEASE},
        IT_PREFETCH_MULTIPLIER=2,
    ) as process:
        bed.wait_for_executions(len(sent), timeout=GUARD)
        receives = receives_of(bed, bed.server.call_log())
        log = process.log
    received = collections.Counter(
        event["message_id"]
        for event in bed.server.events()
        if event["queue"].endswith(bed.queue) and event["action"] == "receive"
    )
    report("receives in flight/solo", receives=len(receives), received=dict(received))
    assert bed.runs_per_task() == dict.fromkeys(sent, 1), log
    assert most_in_flight(receives)[0] == 1, receives
    assert sorted(received.values()) == [1, 1, 1, 1], (received, log)
    assert "Not running" not in log, log
