"""Large task messages through S3: tasks/s and requests per task, by argument size.

A backlog of tasks whose one argument is 100 kB (its body stays in SQS), 1 MiB or 10 MiB
(their bodies go through S3) is published with the transport and ``large_payload_bucket``
set, then one ``celery worker`` drains it. Per size:

- tasks/s: tasks over the span from the first task's start to the last one's end;
- publish ms/task: the producer's time per ``send_task``, S3's put included;
- requests per task, counted on the strict server: the producer's (SendMessage,
  s3:PutObject) and the worker's, SQS and S3 apart, from its start until the queue is
  empty and every object is deleted.

Local only: the strict server on 127.0.0.1 answers S3 and SQS from memory, so S3's own
latency (tens of ms per request on AWS) is not in these figures; what is in them is the
transport's cost of moving the bytes through a second service.

    python benchmarks/large_payloads.py            # --runs N, --pool POOL, -c N, --smoke
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import boto3
from bench_report import environment
from bench_runs import BASE_OPTIONS, OURS, Setup
from bench_workers import Bench, _worker
from celery import Celery

from celery_sqs_heartbeat.testing import StrictSQSServer

BUCKET = "bench-large-payloads"
#: Argument sizes and how many tasks a run publishes of each.
SIZES = {"100 kB": (100_000, 200), "1 MiB": (1_048_576, 60), "10 MiB": (10_485_760, 12)}
SMOKE_SIZES = {"100 kB": (100_000, 4), "1 MiB": (1_048_576, 3)}


@dataclass
class Result:
    size: str
    tasks: int
    rate: float
    publish_ms: float
    producer: dict[str, int]
    worker: dict[str, int]

    def per_task(self, calls: dict[str, int], s3: bool) -> float:
        total = sum(n for action, n in calls.items() if action.startswith("s3:") == s3)
        return total / self.tasks


def run_once(bench: Bench, label: str, size: int, count: int, setup: Setup) -> Result:
    """Publish one size's backlog, drain it with a worker, and count the calls."""
    server, workdir = bench.server, bench.workdir
    queue = f"bench-large-{uuid.uuid4().hex[:8]}"
    options = {**BASE_OPTIONS, "visibility_timeout": 30, "large_payload_bucket": BUCKET}
    boto3.client("sqs", **server.boto3_kwargs).create_queue(QueueName=queue)
    server.reset_calls()
    producer = Celery("bench-large-producer", set_as_current=False)
    producer.conf.update(
        broker_url=server.broker_url,
        broker_transport=OURS.transport,
        broker_transport_options=options,
    )
    data = "x" * size
    started = time.monotonic()
    with producer.producer_or_acquire() as publisher:
        for _ in range(count):
            producer.send_task("bench_app.takes", args=[data], queue=queue, producer=publisher)
    publish_ms = (time.monotonic() - started) * 1000 / count
    producer.close()
    published = server.calls()
    server.reset_calls()
    records = workdir / f"{queue}.jsonl"
    env = bench._worker_env(OURS.transport, options, queue, records)
    with _worker(env, setup, workdir / f"{queue}.log") as process:
        process.wait_ready()
        spans = _wait_for(records, count)
        own = _wait_drained(server, queue)
        process.stop()
    worker_calls = server.calls()
    for action, n in own.items():
        worker_calls[action] -= n
    return Result(
        label,
        count,
        count / (max(end for _, end in spans) - min(start for start, _ in spans)),
        publish_ms,
        published,
        {action: n for action, n in worker_calls.items() if n},
    )


def _env(
    server: StrictSQSServer, options: dict[str, Any], queue: str, records: Path
) -> dict[str, str]:
    import bench_workers

    bench = bench_workers.Bench.__new__(bench_workers.Bench)
    bench.server = server
    return bench._worker_env(OURS.transport, options, queue, records)


def _wait_for(records: Path, count: int, timeout: float = 600) -> list[tuple[float, float]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = records.read_text().splitlines() if records.exists() else []
        if len(lines) >= count:
            return [(r["start"], r["end"]) for r in map(json.loads, lines)]
        time.sleep(0.05)
    raise RuntimeError(f"only {len(lines)} of {count} tasks ran in {timeout} s")


def _wait_drained(server: StrictSQSServer, queue: str, timeout: float = 60) -> Counter[str]:
    """The queue empty and the bucket too: every delete, SQS's and S3's, is counted.

    Returns the calls made here, which are not the worker's.
    """
    sqs = boto3.client("sqs", **server.boto3_kwargs)
    s3 = boto3.client("s3", config=server.s3_config, **server.boto3_kwargs)
    url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    own = Counter({"GetQueueUrl": 1})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        objects = s3.list_objects_v2(Bucket=BUCKET).get("KeyCount", 0)
        own.update(["GetQueueAttributes", "s3:ListObjects"])
        if not objects and all(value == "0" for value in counts.values()):
            return own
        time.sleep(0.1)
    raise RuntimeError(f"queue {queue} or bucket {BUCKET} not drained in {timeout} s")


HEADER = (
    "| argument | tasks/run | runs | tasks/s (median, range) | publish ms/task "
    "| producer: SQS / S3 requests per task | worker: SQS / S3 requests per task "
    "| worker S3 calls per task |\n|---|---:|---:|---:|---:|---:|---:|---|"
)


def table(results: list[Result]) -> str:
    rows = [HEADER]
    for label in dict.fromkeys(r.size for r in results):
        runs = [r for r in results if r.size == label]
        rates = [r.rate for r in runs]
        last = runs[-1]
        s3_calls = [
            f"{action[3:]} {n / last.tasks:.2f}"
            for action, n in sorted(last.worker.items())
            if action.startswith("s3:")
        ]
        cells = [
            label,
            str(last.tasks),
            str(len(runs)),
            f"{statistics.median(rates):.1f} ({min(rates):.1f} to {max(rates):.1f})",
            f"{statistics.median(r.publish_ms for r in runs):.1f}",
            f"{last.per_task(last.producer, False):.2f} / {last.per_task(last.producer, True):.2f}",
            f"{last.per_task(last.worker, False):.2f} / {last.per_task(last.worker, True):.2f}",
            ", ".join(s3_calls) or "none",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--pool", default="threads")
    parser.add_argument("-c", "--concurrency", type=int, default=4)
    parser.add_argument("--smoke", action="store_true", help="a few small tasks, one run")
    args = parser.parse_args(argv)
    sizes = SMOKE_SIZES if args.smoke else SIZES
    runs = 1 if args.smoke else args.runs
    setup = Setup(f"{args.pool}:{args.concurrency}", args.pool, args.concurrency)
    began = time.monotonic()
    results = []
    with StrictSQSServer() as server, TemporaryDirectory() as tmp:
        s3 = boto3.client("s3", config=server.s3_config, **server.boto3_kwargs)
        s3.create_bucket(Bucket=BUCKET)
        bench = Bench(server, Path(tmp))
        for _ in range(runs):
            for label, (size, count) in sizes.items():
                result = run_once(bench, label, size, count, setup)
                print(f"{label}: {result.rate:.1f} tasks/s", file=sys.stderr, flush=True)
                results.append(result)
        bench.close()
    given = argv if argv is not None else sys.argv[1:]
    command = " ".join(["python benchmarks/large_payloads.py", *given])
    print(table(results))
    print()
    print(environment(command, time.monotonic() - began))


if __name__ == "__main__":
    main()
