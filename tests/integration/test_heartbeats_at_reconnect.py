"""A gevent worker lets a lost connection's heartbeat go (issue 33's growing gevent worker).

Celery starts a heartbeat (``Heart``) at each connect and stops it at a lost connection.
In a gevent worker the stop never took (Celery's gevent timer, see
``celery_sqs_heartbeat/startup/green_timer.py``): each stopped heartbeat went on, and held
the lost connection with its channels and their botocore clients (the chaos soak's gevent
worker grew by some 12 MiB a lost connection). Counted inside the worker after the drop,
by a task: the heartbeats the process holds, asked again (a stopped heartbeat may beat
once more) until it is one, within a generous guard.

Only gevent: a threads or solo worker holds its last stopped heartbeat besides the live
one (two, seen after one drop and after three), so one drop tells nothing there; and a
prefork worker's tasks run in children forked before any heartbeat started.
"""

from __future__ import annotations

from tests.integration.harness import Bed, assert_reconnected, reconnected, settle, worker

#: Counts asked for at most, one after another: a failure guard only.
COUNTS = 10


def test_a_lost_connections_heartbeat_is_let_go(bed: Bed) -> None:
    counts: list[str] = []
    with worker(bed, "gevent", 2, heartbeat=True, IT_DROP_CONNECTION_AFTER=1) as process:
        settle(lambda: reconnected(process.log))
        while len(counts) < COUNTS and counts[-1:] != ["1"]:
            bed.send("counts_heartbeats", f"count {len(counts)}")
            counts = [run["outcome"] for run in bed.wait_for_executions(len(counts) + 1, 60)]
        log = process.log
    assert_reconnected(log)
    assert counts[-1:] == ["1"], (counts, log)
