"""SQS requests for countdown tasks, parked against held: a virtual-clock simulation.

``N`` countdown tasks are published at random over the first hour, each with the same
countdown ``W``; the simulation runs until the last is due, without SQS and without
sleeping. Only the requests the *waiting* costs are counted: the receive that first
brings a task and its delete at the ack are the same either way.

* *held* (``eta_parking: False``, and every release before issue 18): the package's real
  :class:`~celery_sqs_heartbeat.leasing.book.LeaseBook` and
  :class:`~celery_sqs_heartbeat.leasing.leases.AdaptiveMargin` renew every lease, checked every
  second as the manager checks them, every call answered at once, until the task is due.
  A wait longer than the hold limit (12 h less 60 s) cannot be held: the lease is capped,
  SQS hands the message out again, and a worker holds it anew (counted as one more
  receive; in real life the first worker may run it too).
* *parked* (the default): the real :class:`~celery_sqs_heartbeat.receiving.parking.ParkingPolicy`
  decides at every receive; a park is a visibility change in the real
  :class:`~celery_sqs_heartbeat.leasing.outbox.Outbox` (``ack_batch_interval`` 0.5 s, ten to a
  call); a returned message costs a receive. Receives are given as a range: ten returned
  messages to a call (a busy queue) up to one a call (returns that trickle in, each ending
  a long poll early). The last stretch before the ETA is held as above (20 s: within the
  first lease, no renewal).
* *parked, fresh copies*: the same on a queue with a dead-letter queue, where a task back
  from a park is sent again (SendMessageBatch, ten a call), its original deleted
  (DeleteMessageBatch, ten a call), and the copy received and parked once more.

**Memory** (``--rss``): a real ``celery worker`` (threads pool, ``-c 2``, prefetch
multiplier 0: no limit, or Celery takes in two ETA tasks a
second) against the strict server; ``N`` tasks with a 6-hour countdown are
published first. Once SQS shows them all in flight, and ``--settle`` (60) s later (a couple of
renewal rounds), the worker's resident memory (``VmRSS``) is read, with parking on and
off, and for an idle worker on an empty queue.

    python benchmarks/parking_requests.py                 # 10,000 tasks of 1 h, 6 h, 3 days
    python benchmarks/parking_requests.py --smoke         # seconds: keeps the script working
    python benchmarks/parking_requests.py --rss           # worker memory, 10,000 tasks
"""

from __future__ import annotations

import argparse
import base64
import heapq
import json
import math
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from celery_sqs_heartbeat.aws.sqs_facts import SQS_BATCH_SIZE  # noqa: E402
from celery_sqs_heartbeat.leasing.book import LeaseBook  # noqa: E402
from celery_sqs_heartbeat.leasing.leases import EntryResult, Lease, LeasePolicy  # noqa: E402
from celery_sqs_heartbeat.leasing.outbox import Outbox, Outgoing, Request  # noqa: E402
from celery_sqs_heartbeat.options import (  # noqa: E402
    DEFAULT_ETA_PARKING_THRESHOLD,
    DEFAULT_VISIBILITY_TIMEOUT,
)
from celery_sqs_heartbeat.receiving.parking import PARK_WAIT_SHARE, Due, ParkingPolicy  # noqa: E402

HOUR = 3600.0
DAY = 24 * HOUR
#: The manager's check interval (``visibility_extension_interval``'s default).
INTERVAL = 1.0
#: Tasks are published at random over this long.
PUBLISHING = HOUR
#: Held tasks simulated for a wait past a day (a second-by-second check loop over three
#: days of 10,000 leases takes hours of CPU); per task-day the cost is the same, since
#: 1,000 leases already fill every call.
HELD_SAMPLE = 1_000
POLICY = LeasePolicy(visibility_timeout=DEFAULT_VISIBILITY_TIMEOUT)
#: How long a park waits for company in its call, as the channel sets it.
PARK_WAIT = DEFAULT_VISIBILITY_TIMEOUT * PARK_WAIT_SHARE


@dataclass
class Tally:
    renewal_calls: int = 0
    renewal_entries: int = 0
    park_calls: int = 0
    returns: int = 0
    #: Receive calls for the returns: ten a call at best, one a call at worst.
    receives_best: int = 0
    send_calls: int = 0
    delete_calls: int = 0

    def scaled(self, factor: float) -> Tally:
        """The tally of ``factor`` times as many tasks, for a sample's."""
        return Tally(*(round(value * factor) for value in vars(self).values()))

    def requests(self, best: bool) -> int:
        receives = self.receives_best if best else self.returns
        waiting = self.renewal_calls + self.park_calls + self.send_calls + self.delete_calls
        return waiting + receives


def published(tasks: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    return sorted(rng.uniform(0, PUBLISHING) for _ in range(tasks))


def held(starts: list[float], wait: float) -> Tally:
    """Every task received at its publishing and renewed until due (or its hold limit)."""
    tally = Tally()
    book = LeaseBook()
    book.margin.interval = INTERVAL
    receives: list[tuple[float, int]] = [(start, n) for n, start in enumerate(starts)]
    due = [start + wait for start in starts]
    heapq.heapify(receives)
    ends: list[tuple[float, int, Lease]] = []
    now = 0.0
    while receives or ends:
        while receives and receives[0][0] <= now:
            at, n = heapq.heappop(receives)
            lease = Lease(f"rh-{n}-{at}", "q", POLICY, at, str(n))
            book.add(lease)
            end = min(due[n], lease.hold_deadline)
            heapq.heappush(ends, (end, n, lease))
            if end < due[n]:
                # Capped: SQS hands it out again once the last lease ran out.
                heapq.heappush(receives, (end + 1, n))
                tally.returns += 1
        while ends and ends[0][0] <= now:
            book.end(heapq.heappop(ends)[2])
        for batch in book.due_batches(now):
            tally.renewal_calls += 1
            tally.renewal_entries += len(batch.entries)
            book.margin.record_delay(0.0, now)
            book.settle(batch, {lease: (EntryResult.OK, "") for lease, _ in batch.entries}, now)
        book.take_exhausted(now)
        now += INTERVAL
    tally.receives_best = math.ceil(tally.returns / SQS_BATCH_SIZE)
    return tally


def parked(starts: list[float], wait: float, fresh_copies: bool) -> Tally:
    """Every receive decides again; parks go out through the outbox, ten to a call."""
    tally = Tally()
    policy = ParkingPolicy(DEFAULT_ETA_PARKING_THRESHOLD, POLICY.hold_limit)
    outbox = Outbox(retry_delay=1.0)
    # (time it is received, task, receive count)
    receives: list[tuple[float, int, int]] = [(start, n, 1) for n, start in enumerate(starts)]
    heapq.heapify(receives)
    returned: Counter[float] = Counter()
    held_last: list[float] = []
    copies_waiting = 0
    now = 0.0
    while receives or len(outbox):
        while receives and receives[0][0] <= now:
            at, n, count = heapq.heappop(receives)
            due = Due(str(n), "t", starts[n] + wait, None)
            hide = policy.hide_for(due, at, PARK_WAIT)
            copy = policy.fresh_copy_delay(due, hide, count, at) if fresh_copies else None
            if at > starts[n]:
                # Back from a park, or a copy: a receive holding would not have made.
                tally.returns += 1
                returned[math.floor(at)] += 1
            if copy is not None:
                copies_waiting += 1
                heapq.heappush(receives, (at + copy, n, 1))
            elif hide is not None:
                lease = Lease(f"rh-{n}-{at}", "q", POLICY, at, str(n))
                outbox.add(Outgoing(lease, Request.RELEASE, hide), at + PARK_WAIT)
                heapq.heappush(receives, (at + hide, n, count + 1))
            else:
                held_last.append(due.eta - at if due.eta else 0.0)
        for batch in outbox.due_batches(now):
            tally.park_calls += 1
            outbox.settle(batch, {i.lease: (EntryResult.OK, "") for i in batch.entries}, now)
        if copies_waiting >= SQS_BATCH_SIZE or (copies_waiting and not receives):
            calls = math.ceil(copies_waiting / SQS_BATCH_SIZE)
            tally.send_calls += calls
            tally.delete_calls += calls
            copies_waiting = 0
        now = _next(now, receives, outbox)
    tally.receives_best = sum(math.ceil(n / SQS_BATCH_SIZE) for n in returned.values())
    # What is held after the last return: within the first lease, so no renewal.
    assert all(left < POLICY.visibility_timeout for left in held_last), max(held_last)
    return tally


def _next(now: float, receives: list[tuple[float, int, int]], outbox: Outbox) -> float:
    """Jump to the next receive or outbox call: parked tasks cost nothing in between."""
    owed = [receives[0][0]] if receives else []
    due = outbox.next_due()
    if due is not None:
        owed.append(due)
    return max(now + 0.1, min(owed)) if owed else now + 0.1


def table(tasks: int, waits: list[float], seed: int) -> str:
    lines = [
        f"{tasks:,} tasks published over an hour, each with the same countdown; seed {seed}.",
        "",
        "| countdown | strategy | renewal calls | park calls | returns | receive calls "
        "| send + delete calls | requests per task-day of waiting | held / this |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for wait in waits:
        starts = published(tasks, seed)
        task_days = tasks * wait / DAY
        sample = starts if wait <= DAY else starts[:HELD_SAMPLE]
        rows = {
            "held": held(sample, wait).scaled(len(starts) / len(sample)),
            "parked": parked(starts, wait, fresh_copies=False),
            "parked, fresh copies": parked(starts, wait, fresh_copies=True),
        }
        baseline = rows["held"].requests(best=True) / task_days
        for name, tally in rows.items():
            best, worst = (tally.requests(b) / task_days for b in (True, False))
            per_day = f"{best:,.2f}" if name == "held" else f"{best:,.3f} to {worst:,.3f}"
            ratio = "1" if name == "held" else f"{baseline / worst:,.0f} to {baseline / best:,.0f}"
            receives = (
                f"{tally.receives_best:,}"
                if name == "held"
                else f"{tally.receives_best:,} to {tally.returns:,}"
            )
            lines.append(
                f"| {_duration(wait)} | {name} | {tally.renewal_calls:,} | {tally.park_calls:,} "
                f"| {tally.returns:,} | {receives} | {tally.send_calls + tally.delete_calls:,} "
                f"| {per_day} | {ratio} |"
            )
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    return f"{seconds / DAY:g} days" if seconds >= DAY else f"{seconds / HOUR:g} h"


def worker_rss(
    tasks: int, parking: bool | None, workdir: Path, settle: float
) -> tuple[int, float, int]:
    """The worker's VmRSS in kB with ``tasks`` 6-hour countdowns received (None: idle),
    how long receiving them took, and how many leases the worker lost meanwhile (a held
    worker whose renewals fall behind is not holding what it was asked to)."""
    from celery import Celery

    from celery_sqs_heartbeat.testing import StrictSQSServer

    with StrictSQSServer() as server:
        sqs = boto3_client(server)
        queue = f"rss-{time.monotonic_ns()}"
        url = sqs.create_queue(QueueName=queue)["QueueUrl"]
        producer = Celery("rss-producer", set_as_current=False)
        producer.conf.update(
            broker_url=server.broker_url,
            broker_transport="sqs",
            broker_transport_options={"region": "us-east-1", "is_secure": False},
        )
        publish(producer, sqs, url, queue, tasks if parking is not None else 0)
        producer.close()
        options = {"region": "us-east-1", "is_secure": False, "eta_parking": bool(parking)}
        env = {
            **os.environ,
            "BENCH_BROKER_URL": server.broker_url,
            "BENCH_TRANSPORT": "celery_sqs_heartbeat:Transport",
            "BENCH_TRANSPORT_OPTIONS": json.dumps(options),
            "BENCH_QUEUE": queue,
            "BENCH_PREFETCH": "0",
            "PYTHONPATH": str(REPO),
        }
        log = (workdir / f"rss-{parking}.log").open("w")
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench_app",
            "worker",
            "-P",
            "threads",
            "-c",
            "2",
            "-l",
            "warning",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
        ]
        worker = subprocess.Popen(
            command, cwd=REPO / "benchmarks", env=env, stdout=log, stderr=subprocess.STDOUT
        )
        started = time.monotonic()
        try:
            while _visible(sqs, url) > 0 and worker.poll() is None:
                time.sleep(1)
            took = time.monotonic() - started
            time.sleep(settle)
            rss = _vm_rss(worker.pid)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(120)
            log.close()
    lost = (workdir / f"rss-{parking}.log").read_text().count("Lost the SQS lease")
    return rss, took, lost


def publish(producer: Any, sqs: Any, url: str, queue: str, tasks: int) -> None:
    """``tasks`` 6-hour countdowns, ten to a SendMessageBatch: one body as Celery sends it,
    with its task id replaced in every copy (publishing them one by one takes minutes)."""
    bodies: list[str] = []

    def keep(params: dict[str, Any], **_: Any) -> None:
        bodies.append(params["MessageBody"])
        params["DelaySeconds"] = 900  # the template itself is not consumed

    with producer.producer_or_acquire() as publisher:
        events = publisher.channel.sqs().meta.events
        events.register("provide-client-params.sqs.SendMessage", keep)
        template_id = "rss-template-0000"
        producer.send_task("bench_app.noop", queue=queue, countdown=6 * HOUR,
                           producer=publisher, task_id=template_id)
        events.unregister("provide-client-params.sqs.SendMessage", keep)
    plain = _decoded(bodies[0])
    for first in range(0, tasks, SQS_BATCH_SIZE):
        entries = [
            {"Id": str(n), "MessageBody": _encoded(plain.replace(template_id, f"rss-{n:012d}"),
                                                   like=bodies[0])}
            for n in range(first, min(tasks, first + SQS_BATCH_SIZE))
        ]
        sqs.send_message_batch(QueueUrl=url, Entries=entries)


def _decoded(body: str) -> str:
    try:
        json.loads(body)
        return body
    except ValueError:
        return base64.b64decode(body).decode()


def _encoded(text: str, like: str) -> str:
    return text if _decoded(like) == like else base64.b64encode(text.encode()).decode()


def boto3_client(server: Any) -> Any:
    import boto3

    return boto3.client("sqs", **server.boto3_kwargs)


def _visible(sqs: Any, url: str) -> int:
    attributes = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
    )
    return int(attributes["Attributes"]["ApproximateNumberOfMessages"])


def _vm_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def rss_table(tasks: int, settle: float) -> str:
    with tempfile.TemporaryDirectory() as workdir:
        rows = [
            (name, *worker_rss(tasks, parking, Path(workdir), settle))
            for name, parking in (("idle, empty queue", None), ("held", False), ("parked", True))
        ]
    lines = [
        f"Worker (threads, -c 2) with {tasks:,} tasks of a 6 h countdown received.",
        "",
        "| worker | VmRSS (MB) | all received after | leases lost |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {name} | {rss / 1024:.1f} | {took:.0f} s | {lost} |" for name, rss, took, lost in rows
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--smoke", action="store_true", help="100 tasks, 1 h and 13 h")
    parser.add_argument("--rss", action="store_true", help="a real worker's memory instead")
    parser.add_argument("--settle", type=float, default=60.0, help="--rss: seconds before VmRSS")
    args = parser.parse_args()
    if args.rss:
        print(rss_table(args.tasks, args.settle))
        print(f"\nCommand: `python benchmarks/parking_requests.py {' '.join(sys.argv[1:])}`")
        return
    waits = [HOUR, 13 * HOUR] if args.smoke else [HOUR, 6 * HOUR, 3 * DAY]
    tasks = 100 if args.smoke else args.tasks
    started = time.perf_counter()
    print(table(tasks, waits, args.seed), flush=True)
    command = " ".join(["python benchmarks/parking_requests.py", *sys.argv[1:]])
    print(
        f"\nCommand: `{command}`; Python {platform.python_version()}, "
        f"{time.perf_counter() - started:.0f} s of CPU."
    )


if __name__ == "__main__":
    main()
