"""Enqueuing tasks from one process: kombu's stock transport against a batch-publishing scope.

One producer process (this one) publishes ``--tasks`` no-op tasks to a fresh queue of
the strict server, in two shapes:

- loop: ``task.apply_async((n,))`` once per task;
- group: one ``group(task.s(n) for n in ...).apply_async()``;
- threads (only when asked, ``--shapes threads``): ``--threads`` threads, each
  ``task.apply_async((n,))`` in a loop over its share of the tasks, as a web app's
  request threads publish; ours opens a scope in each thread (a scope is its thread's),
  and the threads' scopes share calls;

on kombu's stock SQS transport (one ``SendMessage`` per task, as ever) and on this
transport inside ``publishing_in_batches()`` (``SendMessageBatch``, several calls in
flight), alternated, at each latency the server adds to every SQS call (``--latency``,
0 and 15 ms by default).

- tasks/s: tasks over the time from the first publish until the loop or the group
  returned (stock) or the scope ended, which is when SQS confirmed every message
  (ours). Both sides then hold every message in SQS: the script checks the queue's
  count;
- requests per task: every SQS call the strict server counted from the first publish
  to the end, over the tasks. The queue is declared and the connection warmed before.

Local only (127.0.0.1). What the server's CPU costs is in the figures for both sides.

    python benchmarks/publishing.py        # --tasks N, --runs N, --latency MS ...

``--sides ours --shapes loop --senders N`` measures one side and shape with ``N``
sending threads instead of :data:`~celery_sqs_heartbeat.aws.sqs_queue.MAX_PUBLISH_CALLS_IN_FLIGHT`
(a figure for choosing it); the table then shows only what ran.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import boto3
from bench_report import environment
from bench_runs import BASE_OPTIONS, TRANSPORTS
from celery import Celery, group

from celery_sqs_heartbeat import publishing_in_batches
from celery_sqs_heartbeat.publishing import publisher as batch_publisher
from celery_sqs_heartbeat.testing import StrictSQSServer

SHAPES = ("loop", "group", "threads")
DEFAULT_SHAPES = ["loop", "group"]
#: Publishing threads of the ``threads`` shape (``--threads``).
THREADS = 8
SIDES = ("stock", "ours")


@dataclass
class Result:
    shape: str
    latency_ms: float
    side: str
    tasks: int
    seconds: float
    calls: dict[str, int]

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds

    @property
    def requests_per_task(self) -> float:
        return sum(self.calls.values()) / self.tasks


def producer(server: StrictSQSServer, side: str, queue: str) -> tuple[Celery, Callable[..., None]]:
    """A producer app of ``side`` sending to ``queue``, and its no-op task."""
    app = Celery(f"bench-publishing-{side}", set_as_current=False)
    app.conf.update(
        broker_url=server.broker_url,
        broker_transport=TRANSPORTS[side],
        broker_transport_options=dict(BASE_OPTIONS),
        task_default_queue=queue,
    )

    @app.task(name="bench_app.noop")
    def noop(number: int) -> None:
        """Never runs: only its publishing is measured."""

    return app, noop


def publish(shape: str, noop: Callable[..., None], tasks: int, threads: int, side: str) -> None:
    if shape == "loop":
        publish_loop(noop, range(tasks))
    elif shape == "threads":
        target = publish_loop_in_a_scope if side == "ours" else publish_loop
        publishers = [
            threading.Thread(target=target, args=(noop, range(first, tasks, threads)))
            for first in range(threads)
        ]
        for publisher in publishers:
            publisher.start()
        for publisher in publishers:
            publisher.join()
    else:
        group(noop.s(number) for number in range(tasks)).apply_async()  # type: ignore[attr-defined]


def publish_loop(noop: Callable[..., None], numbers: range) -> None:
    for number in numbers:
        noop.apply_async((number,))  # type: ignore[attr-defined]


def publish_loop_in_a_scope(noop: Callable[..., None], numbers: range) -> None:
    with publishing_in_batches():
        publish_loop(noop, numbers)


def run_once(
    server: StrictSQSServer, shape: str, side: str, latency_ms: float, tasks: int, threads: int
) -> Result:
    queue = f"bench-publish-{uuid.uuid4().hex[:8]}"
    sqs = boto3.client("sqs", **server.boto3_kwargs)
    url = sqs.create_queue(QueueName=queue)["QueueUrl"]
    app, noop = producer(server, side, queue)
    # Warm: the queue's URL cached, the connections open and (ours) the sending
    # threads and their client made, as in a producer that has published before.
    if side == "ours":
        with publishing_in_batches():
            noop.apply_async((-1,))  # type: ignore[attr-defined]
    else:
        noop.apply_async((-1,))  # type: ignore[attr-defined]
    server.reset_calls()
    started = time.monotonic()
    if side == "ours":
        with publishing_in_batches():
            publish(shape, noop, tasks, threads, side)
    else:
        publish(shape, noop, tasks, threads, side)
    seconds = time.monotonic() - started
    calls = {action: n for action, n in server.calls().items() if not action.startswith("s3:")}
    held = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
    count = int(held["Attributes"]["ApproximateNumberOfMessages"])
    if count != tasks + 1:
        raise RuntimeError(f"{side} {shape}: SQS holds {count} messages, not {tasks + 1}")
    sqs.delete_queue(QueueUrl=url)
    app.close()
    return Result(shape, latency_ms, side, tasks, seconds, calls)


HEADER = (
    "| shape | latency per call | stock tasks/s | ours tasks/s | ours / stock "
    "| stock requests/task | ours requests/task | ours calls |\n"
    "|---|---:|---:|---:|---:|---:|---:|---|"
)


def table(results: list[Result]) -> str:
    rows = [HEADER]
    cells = dict.fromkeys((r.latency_ms, r.shape) for r in results)
    for latency_ms, shape in cells:
        sides = {
            side: [
                r for r in results if (r.latency_ms, r.shape, r.side) == (latency_ms, shape, side)
            ]
            for side in SIDES
        }
        rate = {
            side: statistics.median(r.rate for r in runs) for side, runs in sides.items() if runs
        }
        requests = {side: runs[-1].requests_per_task for side, runs in sides.items() if runs}
        ours = sides["ours"]
        ours_calls = (
            ", ".join(f"{a} {n}" for a, n in sorted(ours[-1].calls.items())) if ours else ""
        )
        ratio = f"{rate['ours'] / rate['stock']:.1f}x" if len(rate) == 2 else "-"
        rows.append(
            f"| {shape} | {latency_ms:g} ms | {_figure(rate, 'stock', 1)} "
            f"| {_figure(rate, 'ours', 1)} | {ratio} | {_figure(requests, 'stock', 3)} "
            f"| {_figure(requests, 'ours', 3)} | {ours_calls} |"
        )
    return "\n".join(rows)


def _figure(figures: dict[str, float], side: str, digits: int) -> str:
    return f"{figures[side]:.{digits}f}" if side in figures else "-"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000, help="tasks per run")
    parser.add_argument("--runs", type=int, default=1, help="runs per side and cell")
    parser.add_argument(
        "--latency", type=float, nargs="+", default=[0.0, 15.0], help="ms added to every call"
    )
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=DEFAULT_SHAPES)
    parser.add_argument("--threads", type=int, default=THREADS, help="threads of 'threads'")
    parser.add_argument("--senders", type=int, help="sending threads (ours), instead of 8")
    args = parser.parse_args(argv)
    if args.senders is not None:
        batch_publisher.MAX_PUBLISH_CALLS_IN_FLIGHT = args.senders
    sides = [side for side in SIDES if side in args.sides]
    began = time.monotonic()
    results: list[Result] = []
    with StrictSQSServer() as server:
        for latency_ms in args.latency:
            server.clear_faults()
            if latency_ms:
                server.add_latency(latency_ms / 1000)
            for shape in (shape for shape in SHAPES if shape in args.shapes):
                for run in range(args.runs):
                    # Alternated, and the first side swapped each run.
                    for side in sides if run % 2 == 0 else sides[::-1]:
                        result = run_once(server, shape, side, latency_ms, args.tasks, args.threads)
                        print(
                            f"{shape} {latency_ms:g} ms {side}: {result.rate:.1f} tasks/s, "
                            f"{result.requests_per_task:.3f} requests/task",
                            file=sys.stderr,
                            flush=True,
                        )
                        results.append(result)
    given = argv if argv is not None else sys.argv[1:]
    command = " ".join(["python benchmarks/publishing.py", *given])
    print(table(results))
    print()
    print(environment(command, time.monotonic() - began))


if __name__ == "__main__":
    main()
