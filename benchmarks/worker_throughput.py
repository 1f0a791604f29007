"""Real Celery workers on a real SQS server: kombu's stock SQS transport against ours.

The simulation (``renewal_requests.py``) counts renewal calls; this one asks what the
heartbeat costs and buys in a real worker: ``celery worker`` subprocesses talking HTTP to
a local SQS server (``celery_sqs_heartbeat.testing.strict_sqs``: moto with SQS's lease
rules, and a count of every SQS call by action). Both transports get the same transport
options, the same queue settings and the same tasks; only ``broker_transport`` differs.

Scenarios:

* ``throughput``: a backlog of no-op tasks, drained by one worker (prefork -c 2, then
  threads -c 4). Timed on the server, from the first ReceiveMessage that returned a
  message to the DeleteMessage (the late ack) of the last one; SQS calls are counted from
  the worker's start to that moment and divided by the number of tasks.
* ``long``: tasks that outlive the lease (8 x 12 s on a 5 s lease, prefork -c 4). The
  worker runs for a fixed window, then gets SIGTERM (a warm shutdown lets running tasks
  finish). Executions are counted from the file every execution appends to, not from
  logs: with the stock transport SQS hands the message out again while it runs.

Runs alternate the transports (stock, ours, ours, stock, ...) so that drift of the machine
hits both sides alike; tables show the median and, in brackets, the range of the runs.

Usage: ``python benchmarks/worker_throughput.py [--quick] [--json results.json]``
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import boto3
from celery import Celery

from celery_sqs_heartbeat.testing import StrictSQSServer

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
TRANSPORTS = {"stock": "sqs", "ours": "celery_sqs_heartbeat:Transport"}
#: The options both sides get (``visibility_timeout`` is added per scenario).
BASE_OPTIONS: dict[str, Any] = {"region": "us-east-1", "is_secure": False, "wait_time_seconds": 1}
#: Actions shown in their own column; everything else is summed as "other".
MAIN_ACTIONS = (
    "ReceiveMessage",
    "DeleteMessage",
    "ChangeMessageVisibilityBatch",
    "ChangeMessageVisibility",
)


@dataclass(frozen=True)
class Setup:
    """A worker command line and any transport options added to :data:`BASE_OPTIONS`."""

    label: str
    pool: str
    concurrency: int
    options: dict[str, Any] = field(default_factory=dict)


THROUGHPUT_SETUPS = (
    Setup("prefork -c 2", "prefork", 2),
    Setup("threads -c 4", "threads", 4),
    # kombu waits polling_interval (1 s by default) whenever the prefetch window is full,
    # which caps prefork at one window per second for both transports; without that wait
    # the transports themselves are compared.
    Setup("prefork -c 2, polling_interval 0", "prefork", 2, {"polling_interval": 0}),
)
LONG_SETUP = Setup("prefork -c 4", "prefork", 4)


@dataclass
class Run:
    """One worker's run of one scenario with one transport."""

    scenario: str
    setup: str
    transport: str
    tasks: int
    order: int
    #: First receive to last first-delete, on the server's clock (None: not all acked).
    seconds: float | None = None
    #: SQS calls by action from the worker's start until all messages were deleted (or
    #: the window ended), and batch entries by action.
    calls: dict[str, int] = field(default_factory=dict)
    entries: dict[str, int] = field(default_factory=dict)
    #: Calls made during the warm shutdown, by action.
    shutdown_calls: dict[str, int] = field(default_factory=dict)
    #: Executions per task id, from the record file, after the worker exited.
    executions: dict[str, int] = field(default_factory=dict)
    all_acked: bool = False
    exit_code: int | None = None
    warnings: int = 0
    errors: int = 0
    log: str = ""

    @property
    def rate(self) -> float | None:
        return None if self.seconds is None else self.tasks / self.seconds

    def per_task(self, action: str) -> float:
        return self.calls.get(action, 0) / self.tasks

    def other_per_task(self) -> float:
        other = sum(n for action, n in self.calls.items() if action not in MAIN_ACTIONS)
        return other / self.tasks


class Bench:
    """The SQS server, a producer, and the worker subprocesses of one benchmark session."""

    def __init__(self, server: StrictSQSServer, workdir: Path) -> None:
        self.server = server
        self.workdir = workdir
        self.sqs = boto3.client("sqs", **server.boto3_kwargs)
        self.producer = Celery("bench-producer", set_as_current=False)
        self.producer.conf.update(
            broker_url=server.broker_url,
            broker_transport="sqs",
            broker_transport_options=dict(BASE_OPTIONS),
            broker_connection_retry_on_startup=False,
        )
        self._runs = 0

    def close(self) -> None:
        self.producer.close()

    # -- one run ----------------------------------------------------------------------

    def run(
        self,
        *,
        scenario: str,
        setup: Setup,
        transport: str,
        lease: int,
        task: str,
        args: Sequence[Any],
        count: int,
        window: float | None,
        timeout: float,
    ) -> Run:
        """Publish ``count`` tasks, start a worker, wait, stop it, and collect the counts.

        With ``window`` None the worker is stopped as soon as every message is deleted;
        otherwise it runs for ``window`` seconds after it is ready.
        """
        self._runs += 1
        queue = f"bench-{scenario}-{transport}-{uuid.uuid4().hex[:8]}"
        records = self.workdir / f"{queue}.jsonl"
        log = self.workdir / f"{queue}.log"
        # Created up front with the lease as its attribute: the stock transport does not
        # ask for a visibility timeout when it receives, so SQS applies the queue's.
        self.sqs.create_queue(QueueName=queue, Attributes={"VisibilityTimeout": str(lease)})
        self._publish(task, args, count, queue)
        self.server.reset_calls()
        self.server.clear_events()
        result = Run(scenario, setup.label, transport, count, self._runs, log=str(log))
        options = {**setup.options, "visibility_timeout": lease}
        env = self._worker_env(transport, options, queue, records)
        with _worker(env, setup.pool, setup.concurrency, log) as w:
            w.wait_ready()
            started = time.monotonic()
            deadline = started + (window if window is not None else timeout)
            while time.monotonic() < deadline:
                deleted, first_receive, last_delete = self._progress(queue)
                if deleted >= count and not result.all_acked:
                    result.all_acked = True
                    result.seconds = last_delete - first_receive
                    if window is None:
                        break
                time.sleep(0.25)
            result.calls = self.server.calls()
            result.entries = self.server.batch_entries()
            result.exit_code = w.stop()
        after = self.server.calls()
        result.shutdown_calls = {
            action: n - result.calls.get(action, 0)
            for action, n in after.items()
            if n - result.calls.get(action, 0)
        }
        result.executions = _executions(records)
        text = log.read_text(errors="replace")
        result.warnings = sum(
            " WARNING" in line or "/WARNING" in line for line in text.splitlines()
        )
        result.errors = sum(" ERROR" in line or "/ERROR" in line for line in text.splitlines())
        return result

    def _publish(self, task: str, args: Sequence[Any], count: int, queue: str) -> None:
        with self.producer.producer_or_acquire() as producer:
            for _ in range(count):
                self.producer.send_task(
                    f"bench_app.{task}", args=list(args), queue=queue, producer=producer
                )

    def _progress(self, queue: str) -> tuple[int, float, float]:
        """Messages deleted so far, first receive, and the last message's first delete."""
        first_receive = float("inf")
        first_delete: dict[str, float] = {}
        for event in self.server.events():
            if event["queue"] != queue or event["result"] != "ok":
                continue
            if event["action"] == "receive":
                first_receive = min(first_receive, event["t"])
            elif event["action"] == "delete" and event["message_id"]:
                first_delete.setdefault(event["message_id"], event["t"])
        last = max(first_delete.values(), default=0.0)
        return len(first_delete), first_receive, last

    def _worker_env(
        self, transport: str, extra: dict[str, Any], queue: str, records: Path
    ) -> dict[str, str]:
        options = {**BASE_OPTIONS, **extra}
        env = dict(os.environ)
        env.update(
            BENCH_BROKER_URL=self.server.broker_url,
            BENCH_TRANSPORT=TRANSPORTS[transport],
            BENCH_TRANSPORT_OPTIONS=json.dumps(options),
            BENCH_QUEUE=queue,
            BENCH_RECORD_FILE=str(records),
            PYTHONPATH=os.pathsep.join(
                filter(None, [str(BENCH_DIR), str(REPO), env.get("PYTHONPATH")])
            ),
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_DEFAULT_REGION="us-east-1",
            NO_PROXY="127.0.0.1,localhost",
            no_proxy="127.0.0.1,localhost",
        )
        return env


class _Worker:
    """A ``celery -A bench_app worker`` subprocess, started as a user starts one."""

    def __init__(self, env: dict[str, str], pool: str, concurrency: int, log: Path) -> None:
        self.log_path = log
        self._log = log.open("w")
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "bench_app",
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-n",
            f"{log.stem}@%h",
            "-l",
            "info",
            "--without-heartbeat",
            "--without-mingle",
            "--without-gossip",
        ]
        # Its own session, so that a worker that will not stop can be killed with its pool.
        self.process = subprocess.Popen(
            command,
            cwd=BENCH_DIR,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "ready." in self.log_path.read_text(errors="replace"):
                return
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited at start-up; see {self.log_path}")
            time.sleep(0.05)
        raise RuntimeError(f"worker not ready after {timeout} s; see {self.log_path}")

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM (Celery's warm shutdown), then SIGKILL of its process group if stuck."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            return self.process.wait()
        finally:
            self._log.close()


@contextmanager
def _worker(env: dict[str, str], pool: str, concurrency: int, log: Path) -> Iterator[_Worker]:
    worker = _Worker(env, pool, concurrency, log)
    try:
        yield worker
    finally:
        if worker.process.poll() is None:
            worker.stop()


def _executions(records: Path) -> dict[str, int]:
    if not records.exists():
        return {}
    lines = [json.loads(line) for line in records.read_text().splitlines() if line]
    return dict(collections.Counter(record["task_id"] for record in lines))


def alternating(reps: int) -> list[str]:
    """stock, ours, ours, stock, stock, ours, ...: ``reps`` runs of each transport."""
    order: list[str] = []
    for i in range(reps):
        order += ["stock", "ours"] if i % 2 == 0 else ["ours", "stock"]
    return order


# -- reporting ------------------------------------------------------------------------


def spread(values: Sequence[float], digits: int = 2) -> str:
    """Median and range: ``12.3 [11.9..13.0]``, or just the value for a single run."""
    if not values:
        return "n/a"
    median = statistics.median(values)
    if len(values) == 1:
        return f"{median:.{digits}f}"
    return f"{median:.{digits}f} [{min(values):.{digits}f}..{max(values):.{digits}f}]"


def throughput_table(runs: Sequence[Run]) -> str:
    lines = [
        "| worker | transport | runs | tasks/s | ours/stock | Receive/task | Delete/task "
        "| CMVBatch calls/task (entries) | CMV/task | other/task | worker warnings |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for pool in dict.fromkeys(r.setup for r in runs):
        group = [r for r in runs if r.setup == pool]
        medians: dict[str, float] = {}
        for transport in TRANSPORTS:
            mine = [r for r in group if r.transport == transport]
            rates = [r.rate for r in mine if r.rate is not None]
            if rates:
                medians[transport] = statistics.median(rates)
        for transport in TRANSPORTS:
            mine = [r for r in group if r.transport == transport]
            if not mine:
                continue
            rates = [r.rate for r in mine if r.rate is not None]
            ratio = ""
            if transport == "ours" and len(medians) == 2:
                ratio = f"{medians['ours'] / medians['stock']:.2f}"
            batch_entries = [
                r.entries.get("ChangeMessageVisibilityBatch", 0) / r.tasks for r in mine
            ]
            lines.append(
                f"| {pool} | {transport} | {len(mine)} | {spread(rates, 1)} | {ratio} "
                f"| {spread([r.per_task('ReceiveMessage') for r in mine])} "
                f"| {spread([r.per_task('DeleteMessage') for r in mine])} "
                f"| {spread([r.per_task('ChangeMessageVisibilityBatch') for r in mine], 3)} "
                f"({spread(batch_entries, 3)}) "
                f"| {spread([r.per_task('ChangeMessageVisibility') for r in mine], 3)} "
                f"| {spread([r.other_per_task() for r in mine], 3)} "
                f"| {', '.join(str(r.warnings) for r in mine)} |"
            )
    return "\n".join(lines)


def long_table(runs: Sequence[Run]) -> str:
    lines = [
        "| transport | runs | tasks | executions (all runs) | executions per task "
        "| tasks run >1 time | all acked after (s) | CMVBatch calls (entries) | CMV calls "
        "| worker warnings / errors |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for transport in TRANSPORTS:
        mine = [r for r in runs if r.transport == transport]
        if not mine:
            continue
        per_task = [n for r in mine for n in _padded(r)]
        total = sum(per_task)
        repeated = sum(1 for n in per_task if n > 1)
        acked = [r.seconds for r in mine if r.seconds is not None]
        acked_text = (
            spread(acked, 1)
            if len(acked) == len(mine)
            else (f"{spread(acked, 1)}; {len(mine) - len(acked)} run(s) never acked all")
        )
        batch_calls = [float(r.calls.get("ChangeMessageVisibilityBatch", 0)) for r in mine]
        batch_entries = [float(r.entries.get("ChangeMessageVisibilityBatch", 0)) for r in mine]
        single = [float(r.calls.get("ChangeMessageVisibility", 0)) for r in mine]
        lines.append(
            f"| {transport} | {len(mine)} | {mine[0].tasks} | {total} "
            f"| min {min(per_task)}, median {statistics.median(per_task):g}, max {max(per_task)} "
            f"| {repeated} of {len(per_task)} | {acked_text} "
            f"| {spread(batch_calls, 0)} ({spread(batch_entries, 0)}) | {spread(single, 0)} "
            f"| {', '.join(f'{r.warnings} / {r.errors}' for r in mine)} |"
        )
    return "\n".join(lines)


def _padded(run: Run) -> list[int]:
    """Executions per task, with 0 for tasks that never ran."""
    counts = sorted(run.executions.values(), reverse=True)
    return counts + [0] * max(0, run.tasks - len(counts))


# -- main -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one run each, smaller loads")
    parser.add_argument("--tasks", type=int, help="no-op tasks per throughput run (300)")
    parser.add_argument("--reps", type=int, help="throughput runs per transport and pool (2)")
    parser.add_argument("--long-reps", type=int, help="long-task runs per transport (2)")
    parser.add_argument("--long-window", type=float, help="seconds a long-task worker runs (50)")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-long", action="store_true")
    parser.add_argument("--json", type=Path, help="also write every run's raw figures here")
    parser.add_argument("--workdir", type=Path, help="worker logs and record files (temp dir)")
    args = parser.parse_args(argv)
    tasks = args.tasks or (100 if args.quick else 300)
    reps = args.reps or (1 if args.quick else 2)
    long_reps = args.long_reps or (1 if args.quick else 2)
    window = args.long_window or (40.0 if args.quick else 50.0)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sqs-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)

    began = time.monotonic()
    runs: list[Run] = []
    with StrictSQSServer() as server:
        bench = Bench(server, workdir)
        try:
            if not args.skip_throughput:
                for setup in THROUGHPUT_SETUPS:
                    for transport in alternating(reps):
                        run = bench.run(
                            scenario="throughput",
                            setup=setup,
                            transport=transport,
                            lease=30,
                            task="noop",
                            args=(),
                            count=tasks,
                            window=None,
                            timeout=180.0,
                        )
                        runs.append(run)
                        _progress_line(run)
            if not args.skip_long:
                for transport in alternating(long_reps):
                    run = bench.run(
                        scenario="long",
                        setup=LONG_SETUP,
                        transport=transport,
                        lease=5,
                        task="sleep_for",
                        args=(12.0,),
                        count=8,
                        window=window,
                        timeout=window,
                    )
                    runs.append(run)
                    _progress_line(run)
        finally:
            bench.close()

    elapsed = time.monotonic() - began
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"\n{stamp}, {os.cpu_count()} CPUs, {elapsed:.0f} s in all; logs in {workdir}\n")
    throughput = [r for r in runs if r.scenario == "throughput"]
    if throughput:
        print(f"Throughput: {tasks} no-op tasks per run, lease 30 s, wait_time_seconds 1\n")
        print(throughput_table(throughput))
    long = [r for r in runs if r.scenario == "long"]
    if long:
        print(
            f"\nLong tasks: 8 x 12 s, lease 5 s, prefork -c 4, worker stopped after {window:g} s\n"
        )
        print(long_table(long))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=1))
    failed = [r for r in runs if r.scenario == "throughput" and not r.all_acked]
    failed += [r for r in long if r.transport == "ours" and set(_padded(r)) != {1}]
    return 1 if failed else 0


def _progress_line(run: Run) -> None:
    rate = f"{run.rate:.1f} tasks/s" if run.rate else "not all acked"
    executions = sum(run.executions.values())
    print(
        f"[{run.order:2d}] {run.scenario:10s} {run.setup} {run.transport:5s} "
        f"{rate}, {executions} executions of {run.tasks} tasks, calls {run.calls}, "
        f"shutdown {run.shutdown_calls}, exit {run.exit_code}, "
        f"{run.warnings} warnings, {run.errors} errors",
        file=sys.stderr,
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
