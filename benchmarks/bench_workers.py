"""The runner every scenario of ``worker_throughput.py`` shares: a fresh queue and backlog
per run, a real ``celery worker`` subprocess started as a user starts one, and the SQS
calls counted on the strict server rather than in the worker, so that both transports are
measured by the same yardstick.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from bench_report import progress_line
from bench_runs import BASE_OPTIONS, Plan, Run, Setup, Side, Workload, alternate
from celery import Celery

from celery_sqs_heartbeat.testing import StrictSQSServer

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
#: SQS's limit, used to bound the deletes a batch can carry when entries are not counted.
MAX_BATCH_ENTRIES = 10


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

    def run(self, workload: Workload, setup: Setup, side: Side, latency: float = 0.0) -> Run:
        """Publish the backlog, start a worker, wait, stop it, and collect the counts.

        ``latency`` is added to every SQS call from the worker's start on, so that
        publishing is not slowed down.
        """
        self._runs += 1
        queue, published = self._backlog(workload, side)
        records = self.workdir / f"{queue}.jsonl"
        log = self.workdir / f"{queue}.log"
        options = {
            **workload.base_options,
            **setup.options,
            "visibility_timeout": workload.lease,
            **side.options,
        }
        result = Run(
            workload.scenario,
            setup.label,
            side.label,
            workload.count,
            self._runs,
            latency=latency,
            options=options,
            log=str(log),
        )
        env = self._worker_env(side.transport, options, queue, records)
        if latency:
            self.server.add_latency(latency)
        try:
            with _worker(env, setup, log) as w:
                w.wait_ready()
                self._watch(result, queue, workload)
                if workload.idle and result.all_acked:
                    self._idle(result, workload.idle)
                if workload.probes and result.all_acked:
                    published |= self._probe(result, workload, queue, records)
                result.exit_code = w.stop()
        finally:
            self.server.clear_faults()
        self._settle(result, queue, published, records)
        return result

    def _backlog(self, workload: Workload, side: Side) -> tuple[str, set[str]]:
        """A fresh queue per run, so that no run sees another's messages or leases; the
        calls and events of publishing are cleared, so that only the worker's count."""
        name = re.sub(r"[^A-Za-z0-9_-]", "-", side.label)[:24]
        queue = f"bench-{workload.scenario}-{name}-{uuid.uuid4().hex[:8]}"
        self.server.clear_faults()
        # Created up front with the lease as its attribute: the stock transport does not
        # ask for a visibility timeout when it receives, so SQS applies the queue's.
        self.sqs.create_queue(
            QueueName=queue, Attributes={"VisibilityTimeout": str(workload.lease)}
        )
        published = self._publish(workload.task, workload.args, workload.count, queue)
        self.server.reset_calls()
        self.server.clear_events()
        return queue, published

    def _watch(self, result: Run, queue: str, workload: Workload) -> None:
        """Wait for every message to be deleted (or the window to end) and take the counts.

        The call counters are cheap to read and count a call when it arrives, so they are
        read every ``poll`` seconds and the event log is only fetched once enough deletes
        have arrived. The counts kept are the first ones read after the last message's
        delete was logged: they include every call up to that delete, and the few that
        arrived in the ``poll`` seconds after it (at most a long poll or two).
        """
        window = workload.window
        deadline = time.monotonic() + (window if window is not None else workload.timeout)
        while time.monotonic() < deadline:
            read_at = time.time()
            calls, entries = self._counts()
            if not result.all_acked and deletes_arrived(calls, entries) >= result.tasks:
                deleted, first_receive, last_delete = deletion_progress(self.server.events(), queue)
                if deleted >= result.tasks:
                    result.all_acked = True
                    result.seconds = last_delete - first_receive
                    if read_at < last_delete:
                        calls, entries = self._counts()
                    result.calls, result.entries = calls, entries
                    if window is None:
                        return
            time.sleep(workload.poll)
        if window is not None or not result.all_acked:
            result.calls, result.entries = self._counts()

    def _idle(self, result: Run, seconds: float) -> None:
        """Count what the worker asks of an empty queue for ``seconds``."""
        before = self.server.calls()
        time.sleep(seconds)
        after = self.server.calls()
        result.idle_seconds = seconds
        result.idle_calls = {
            action: n - before.get(action, 0)
            for action, n in after.items()
            if n > before.get(action, 0)
        }

    def _probe(self, result: Run, workload: Workload, queue: str, records: Path) -> set[str]:
        """Publish-to-start latency on the idle worker: one task at a time, each sent once
        the one before it has started; a probe that never starts ends the probing."""
        ids: set[str] = set()
        for _ in range(workload.probes):
            sent_at = time.time()
            [task_id] = self._publish(workload.task, workload.args, 1, queue)
            ids.add(task_id)
            started = _start_of(records, task_id, deadline=time.monotonic() + workload.timeout)
            if started is None:
                break
            result.start_latencies.append(started - sent_at)
        return ids

    def _settle(self, result: Run, queue: str, published: set[str], records: Path) -> None:
        """What the worker did that only shows once it has exited: the calls of its warm
        shutdown, the fate of every delete, executions, and its log's warnings."""
        counted = collections.Counter(result.calls) + collections.Counter(result.idle_calls)
        result.shutdown_calls = {
            action: n - counted[action]
            for action, n in self.server.calls().items()
            if n - counted[action]
        }
        result.delete_results = dict(
            collections.Counter(
                event["result"]
                for event in self.server.events()
                if event["queue"] == queue and event["action"] == "delete"
            )
        )
        result.executions = _executions(records)
        result.missing = sum(1 for task_id in published if task_id not in result.executions)
        result.repeated = sum(1 for task_id in published if result.executions.get(task_id, 0) > 1)
        result.unknown = sum(
            n for task_id, n in result.executions.items() if task_id not in published
        )
        lines = Path(result.log).read_text(errors="replace").splitlines()
        result.warnings = sum(" WARNING" in line or "/WARNING" in line for line in lines)
        result.errors = sum(" ERROR" in line or "/ERROR" in line for line in lines)

    def _counts(self) -> tuple[dict[str, int], dict[str, int]]:
        return self.server.calls(), self.server.batch_entries()

    def _publish(self, task: str, args: Sequence[Any], count: int, queue: str) -> set[str]:
        """Send ``count`` tasks and return their ids, to tell missing runs from extra ones."""
        ids: set[str] = set()
        with self.producer.producer_or_acquire() as producer:
            for _ in range(count):
                sent = self.producer.send_task(
                    f"bench_app.{task}", args=list(args), queue=queue, producer=producer
                )
                ids.add(sent.id)
        return ids

    def _worker_env(
        self, transport: str, options: dict[str, Any], queue: str, records: Path
    ) -> dict[str, str]:
        return worker_env(self.server.broker_url, transport, options, queue, records)


def _start_of(records: Path, task_id: str, deadline: float) -> float | None:
    """When ``task_id`` started, from the record file, waiting for it until ``deadline``."""
    while time.monotonic() < deadline:
        if records.exists():
            for line in records.read_text().splitlines():
                record = json.loads(line)
                if record["task_id"] == task_id:
                    return float(record["start"])
        time.sleep(0.002)
    return None


def worker_env(
    broker_url: str, transport: str, options: Mapping[str, Any], queue: str, records: Path
) -> dict[str, str]:
    """What ``bench_app`` reads to serve ``queue`` (each run recorded to ``records``), with
    this folder and this copy of the package importable, and the test server's credentials."""
    return local_server_env(
        BENCH_BROKER_URL=broker_url,
        BENCH_TRANSPORT=transport,
        BENCH_TRANSPORT_OPTIONS=json.dumps(options),
        BENCH_QUEUE=queue,
        BENCH_RECORD_FILE=str(records),
    )


def local_server_env(**settings: str) -> dict[str, str]:
    """This process's environment for a worker or client of the local test server:
    ``settings``, this folder and this copy of the package importable, the server's
    credentials, and no proxy between them."""
    env = dict(os.environ)
    env.update(
        settings,
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


def measure_cells(
    bench: Bench,
    workload: Workload,
    *,
    setups: Sequence[Setup],
    sides: Sequence[Side],
    reps: int,
    latencies: Sequence[float] = (0.0,),
) -> list[Run]:
    """Every scenario's loop: latency, then worker set-up, then the sides alternated, so
    that the runs of one cell follow each other and share the machine's state."""
    runs: list[Run] = []
    for latency in latencies:
        for setup in setups:
            for side in alternate(sides, reps):
                run = bench.run(workload, setup, side, latency)
                runs.append(run)
                progress_line(run, workload.exactly_once)
    return runs


@dataclass(frozen=True)
class Scenario:
    """What ``worker_throughput.py`` needs of a scenario module, so that it can run any
    selection of them against one server and print their sections in a fixed order."""

    name: str
    measure: Callable[[Bench, Plan], list[Run]]
    section: Callable[[Sequence[Run], Plan, float], str]
    #: Whether a run makes the script exit 1.
    failed: Callable[[Run], bool]


def deletes_arrived(calls: Mapping[str, int], entries: Mapping[str, int]) -> int:
    """Deletes the server has received so far, single or batched (an upper bound)."""
    batched = entries.get(
        "DeleteMessageBatch", MAX_BATCH_ENTRIES * calls.get("DeleteMessageBatch", 0)
    )
    return calls.get("DeleteMessage", 0) + batched


def deletion_progress(events: Iterable[Mapping[str, Any]], queue: str) -> tuple[int, float, float]:
    """Messages deleted so far, first receive, and the last message's first delete.

    The strict server logs every entry of a DeleteMessageBatch as its own ``delete``
    event, so batched and single deletes count alike. Only ``ok`` deletes count: a
    ``stale`` one is answered with success but leaves the message in the queue.
    """
    first_receive = float("inf")
    first_delete: dict[str, float] = {}
    for event in events:
        if event["queue"] != queue or event["result"] != "ok":
            continue
        if event["action"] == "receive":
            first_receive = min(first_receive, event["t"])
        elif event["action"] == "delete" and event["message_id"]:
            first_delete.setdefault(event["message_id"], event["t"])
    last = max(first_delete.values(), default=0.0)
    return len(first_delete), first_receive, last


class _Worker:
    """A ``celery -A bench_app worker`` subprocess, started as a user starts one."""

    def __init__(self, env: dict[str, str], setup: Setup, log: Path) -> None:
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
            setup.pool,
            "-c",
            str(setup.concurrency),
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
def _worker(env: dict[str, str], setup: Setup, log: Path) -> Iterator[_Worker]:
    """A worker is stopped even when the run fails, so that none outlives the session."""
    worker = _Worker(env, setup, log)
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
