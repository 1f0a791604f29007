"""Run the Spark pipeline through a real Celery worker on SQS and report what happened.

By default everything is local: an SQS server on 127.0.0.1 (the project's strict
test server, which enforces SQS's lease rules), one Celery worker using the
heartbeat transport with a short lease, and Spark in local mode. Each step takes
longer than the lease, which is the situation the transport exists for. The demo
watches the run, then prints a report measured from the tasks' own records and the
SQS server's log, and draws a timeline PNG.

``--compare`` runs the same pipeline again on kombu's stock SQS transport with the
same lease, and shows both side by side: the stock transport lets each lease run
out mid-task, so SQS hands the message to another pool process and steps run twice.

``--region`` or ``--endpoint-url`` use a real SQS (or any SQS-compatible service)
instead; credentials come from the flags or from boto3's usual sources.

    python -m examples.spark_pipeline.demo [--compare] [--rows N] [--lease S]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import ClientError
from celery import Celery

from celery_sqs_heartbeat.testing import StrictSQSServer
from examples.spark_pipeline import records
from examples.spark_pipeline.app import STEPS, PipelineSettings, pipeline
from examples.spark_pipeline.report import (
    RUN_INFO,
    SERVER_EVENTS,
    Run,
    format_comparison,
    format_run,
    load_executions,
    load_run,
    step_of,
)
from examples.spark_pipeline.timeline import write_timeline

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_ROWS = 5_000_000
DEFAULT_LEASE = 10
WORKER_READY_TIMEOUT = 120.0
POLL_INTERVAL = 0.5
#: The run is over once nothing runs and the queue stays empty this long. A moment of
#: both is not enough: a duplicate run whose message another run already deleted sends
#: the next step's message only after it has finished.
SETTLE_SECONDS = 5.0
#: Print a status line when nothing else happened for this long.
QUIET_STATUS_AFTER = 15.0
#: The stock run can keep redelivering for a long time; it gets this multiple of the
#: heartbeat run's wall clock (at least ``MIN_STOCK_BUDGET`` s) before it is stopped.
STOCK_BUDGET_FACTOR = 3.0
MIN_STOCK_BUDGET = 120.0


class DemoError(RuntimeError):
    """The demo could not run; the message says why and what to look at."""


@dataclass
class SQSTarget:
    """Where the queues live: the embedded server, or a real SQS endpoint or region."""

    region: str
    endpoint_url: str | None = None
    #: Only for the embedded server, whose throwaway keys can go in the broker URL.
    credentials: tuple[str, str] | None = None
    server: StrictSQSServer | None = None

    def describe(self) -> str:
        if self.server is not None:
            return f"embedded SQS server at {self.endpoint_url} (strict lease rules)"
        if self.endpoint_url:
            return f"SQS endpoint {self.endpoint_url} ({self.region})"
        return f"Amazon SQS in {self.region}"

    def client(self) -> Any:
        kwargs: dict[str, Any] = {"region_name": self.region}
        if self.endpoint_url:
            kwargs["endpoint_url"] = self.endpoint_url
        if self.credentials:
            kwargs["aws_access_key_id"], kwargs["aws_secret_access_key"] = self.credentials
        return boto3.client("sqs", **kwargs)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m examples.spark_pipeline.demo",
        description=(
            "Run a PySpark pipeline through Celery on SQS with the heartbeat transport "
            "and report how often each step ran."
        ),
    )
    parser.add_argument(
        "--rows",
        type=int,
        default=DEFAULT_ROWS,
        help=f"orders to generate (default {DEFAULT_ROWS:,}: each step outlasts the lease)",
    )
    parser.add_argument(
        "--lease",
        type=int,
        default=DEFAULT_LEASE,
        help=f"SQS visibility timeout in seconds (default {DEFAULT_LEASE})",
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="run again on kombu's stock SQS transport and compare",
    )
    parser.add_argument("--seed", type=int, default=7, help="seed of the synthetic data")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=2,
        help="pool processes per worker (default 2: a free one is what picks up a redelivery)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="Celery workers sharing the queue, as on that many machines (default 1)",
    )
    parser.add_argument(
        "--spark-master",
        default=os.environ.get("SPARK_MASTER"),
        help="Spark master URL (default: $SPARK_MASTER, else local[*])",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("demo-output"),
        help="directory for the run's records, report and timeline (default ./demo-output)",
    )
    parser.add_argument(
        "--data-dir",
        help="where the Parquet goes (default: inside --out); on a cluster, a path or "
        "URI every executor can reach, such as s3a://bucket/prefix",
    )
    parser.add_argument(
        "--timeout", type=float, default=1800.0, help="give up after this many seconds per run"
    )
    sqs = parser.add_argument_group(
        "real SQS (instead of the embedded server)",
        "Credentials default to boto3's usual sources: AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance role.",
    )
    sqs.add_argument("--region", help="use Amazon SQS in this region")
    sqs.add_argument("--endpoint-url", help="use this SQS-compatible endpoint")
    sqs.add_argument("--aws-access-key-id")
    sqs.add_argument("--aws-secret-access-key")
    args = parser.parse_args(argv)
    if args.rows < 1 or args.lease < 2 or args.concurrency < 1 or args.workers < 1:
        parser.error("--rows, --concurrency and --workers must be positive, --lease at least 2")
    if bool(args.aws_access_key_id) != bool(args.aws_secret_access_key):
        parser.error("--aws-access-key-id and --aws-secret-access-key go together")
    return args


@contextmanager
def sqs_target(args: argparse.Namespace) -> Iterator[SQSTarget]:
    """The embedded server for the duration of the demo, unless real SQS was asked for."""
    if args.region or args.endpoint_url:
        if args.aws_access_key_id:
            # Where boto3 looks anyway: this process's sender and client, and the worker,
            # which inherits the environment, all find them without keys in a URL.
            os.environ["AWS_ACCESS_KEY_ID"] = args.aws_access_key_id
            os.environ["AWS_SECRET_ACCESS_KEY"] = args.aws_secret_access_key
            os.environ.pop("AWS_SESSION_TOKEN", None)
        region = (
            args.region
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
            or "us-east-1"
        )
        yield SQSTarget(region=region, endpoint_url=args.endpoint_url)
        return
    with StrictSQSServer() as server:
        yield SQSTarget(
            region=server.REGION,
            endpoint_url=server.endpoint_url,
            credentials=(server.ACCESS_KEY, server.ACCESS_KEY),
            server=server,
        )


class Worker:
    """A ``celery worker`` subprocess in its own process group, logging to a file.

    Its own process group, so that stopping it also stops its pool processes and
    their Spark JVMs, even if the worker itself hangs.
    """

    def __init__(
        self,
        name: str,
        settings: PipelineSettings,
        env: dict[str, str],
        log: Path,
        concurrency: int,
    ) -> None:
        self.log = log
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "examples.spark_pipeline.app",
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            str(concurrency),
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--hostname",
            f"{name}@%h",
            "--queues",
            settings.queue,
        ]
        with log.open("wb") as output:
            self.process = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise DemoError(f"the Celery worker exited with {code}:\n{self.log_tail()}")

    def stop_signal(self) -> None:
        """Ask for a warm shutdown without waiting: several workers stop side by side."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except FileNotFoundError:
            return "(no worker log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, deadline: float) -> None:
        """After :meth:`stop_signal`: wait for the warm shutdown until ``deadline`` (a
        ``time.time()``), then kill what is left of the group."""
        with suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=max(0.0, deadline - time.time()))
        with suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def stop_workers(workers: Sequence[Worker], grace: float) -> None:
    """Warm shutdown of every worker at once (running tasks finish), killed after ``grace``."""
    for worker in workers:
        worker.stop_signal()
    deadline = time.time() + grace
    for worker in workers:
        worker.stop(deadline)


class Progress:
    """Prints what the worker records as it happens, one line per event."""

    def __init__(self, label: str, origin: float, lease: int) -> None:
        self.label = label
        self.origin = origin
        self.lease = lease
        self.seen = {records.EXECUTIONS: 0, records.WORKER_EVENTS: 0}
        self.receives: dict[str, int] = {}
        self.messages: set[str] = set()
        self.last_output = time.time()

    def say(self, when: float, step: str, text: str) -> None:
        print(f"  [{self.label} {when - self.origin:6.1f}s] {step:<10} {text}", flush=True)
        self.last_output = time.time()

    def update(self, directory: Path) -> None:
        fresh: list[dict[str, Any]] = []
        for name in self.seen:
            lines = records.read(directory / name)
            fresh.extend(lines[self.seen[name] :])
            self.seen[name] = len(lines)
        for record in sorted(fresh, key=lambda r: r["time"]):
            self._show(record)

    def _show(self, record: dict[str, Any]) -> None:
        event = record["event"]
        when = record["time"]
        step = record.get("step") or step_of(record.get("task_name", ""))
        if event == "receive":
            message_id = record["message_id"] or "?"
            seen_message = message_id in self.messages
            self.messages.add(message_id)
            count = self.receives[record["task_id"]] = self.receives.get(record["task_id"], 0) + 1
            text = f"received from SQS (message {message_id[:8]})"
            if seen_message:
                text += "  << REDELIVERED: its lease ran out while the task ran"
            elif count > 1:
                text += "  << DUPLICATE: sent again by a duplicate run of the step before"
            self.say(when, step, text)
        elif event == "start":
            how = "reusing its Spark session" if record["session_reused"] else "starting Spark"
            self.say(when, step, f"started on {record['worker']} pid {record['pid']}, {how}")
        elif event == "end":
            tables = ", ".join(f"{n} {t['rows']:,}" for n, t in record["tables"].items())
            self.say(when, step, f"finished {record['status']}" + (f": {tables}" if tables else ""))
        elif event == "renew":
            self.say(when, step, f"lease renewed (#{record['renewals']}), +{self.lease} s")
        elif event in ("release", "lost"):
            self.say(when, step, f"lease {event}: {record['reason']}")

    def quiet_status(self, running: dict[str, float]) -> None:
        """A sign of life while a long step runs with nothing to report."""
        now = time.time()
        if now - self.last_output < QUIET_STATUS_AFTER:
            return
        if running:
            text = ", ".join(f"{step} for {now - start:.0f} s" for step, start in running.items())
            self.say(now, "", f"running: {text}")
        else:
            self.say(now, "", "waiting for the next message")


def _queue_is_empty(client: Any, queue: str) -> bool:
    """No message waiting and none in flight (received but not deleted)."""
    try:
        url = client.get_queue_url(QueueName=queue)["QueueUrl"]
        attributes = client.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
    except ClientError:
        return False  # not created yet
    return all(int(value) == 0 for value in attributes.values())


def _delete_queue(client: Any, queue: str) -> None:
    """The queue was made for this run only; leave nothing behind on a real account."""
    with suppress(ClientError):
        client.delete_queue(QueueUrl=client.get_queue_url(QueueName=queue)["QueueUrl"])


def _running(directory: Path) -> dict[str, float]:
    """Steps started and not yet ended, with their start times."""
    executions = load_executions(records.read(directory / records.EXECUTIONS))
    return {e.step: e.start for e in executions if e.end is None}


def _wait_ready(workers: Sequence[Worker], directory: Path) -> None:
    deadline = time.time() + WORKER_READY_TIMEOUT
    while time.time() < deadline:
        for worker in workers:
            worker.check_alive()
        events = records.read(directory / records.WORKER_EVENTS)
        if sum(r["event"] == "worker_ready" for r in events) >= len(workers):
            return
        time.sleep(POLL_INTERVAL)
    tails = "\n".join(worker.log_tail(10) for worker in workers)
    raise DemoError(f"the workers were not ready after {WORKER_READY_TIMEOUT:.0f} s:\n{tails}")


@dataclass
class RunPlan:
    """What one run needs besides the transport name."""

    args: argparse.Namespace
    target: SQSTarget
    run_dir: Path
    stamp: str


def run_pipeline(plan: RunPlan, transport: str, budget: float) -> Run:
    """Start a worker on ``transport``, send the pipeline, watch it to the end."""
    args, target = plan.args, plan.target
    directory = plan.run_dir / transport
    record_dir = directory / "records"
    record_dir.mkdir(parents=True)
    data_dir = (
        f"{args.data_dir.rstrip('/')}/{plan.stamp}/{transport}"
        if args.data_dir
        else str((directory / "output").resolve())
    )
    settings = PipelineSettings(
        transport=transport,
        queue=f"spark-pipeline-{plan.stamp}-{transport}",
        lease=args.lease,
        region=target.region,
        endpoint_url=target.endpoint_url,
        credentials=target.credentials,
    )
    env = {
        **os.environ,
        **settings.to_env(),
        records.RECORD_DIR_ENV: str(record_dir.resolve()),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    }
    if args.spark_master:
        env["SPARK_MASTER"] = args.spark_master
    label = "heartbeat" if transport == "heartbeat" else "stock"
    names = [f"{transport}-{index}" for index in range(1, args.workers + 1)]
    print(
        f"\n== {label}: {args.workers} worker{'s' if args.workers > 1 else ''} with "
        f"{settings.celery_config()['broker_transport']!r}, lease {args.lease} s, "
        f"{args.concurrency} pool processes each; logs in {directory}/{names[0]}.log"
        + (" ..." if len(names) > 1 else ""),
        flush=True,
    )
    workers = [
        Worker(name, settings, env, directory / f"{name}.log", args.concurrency) for name in names
    ]
    client = target.client()
    timed_out = False
    try:
        _wait_ready(workers, record_dir)
        sender = Celery("spark_pipeline_demo", set_as_current=False)
        sender.conf.update(settings.celery_config())
        started = time.time()
        pipeline(data_dir, args.rows, args.seed, sender=sender).apply_async()
        sender.close()
        print(f"  pipeline sent: {args.rows:,} orders -> {data_dir}", flush=True)
        progress = Progress(label, started, args.lease)
        idle_since: float | None = None
        while True:
            time.sleep(POLL_INTERVAL)
            for worker in workers:
                worker.check_alive()
            progress.update(record_dir)
            running = _running(record_dir)
            progress.quiet_status(running)
            idle = (
                bool(progress.receives) and not running and _queue_is_empty(client, settings.queue)
            )
            if not idle:
                idle_since = None
            elif idle_since is None:
                idle_since = time.time()
            elif time.time() - idle_since >= SETTLE_SECONDS:
                break
            if time.time() - started > budget:
                timed_out = True
                progress.say(time.time(), "", f"time limit of {budget:.0f} s reached, stopping")
                break
        finished = idle_since or time.time()
    finally:
        stop_workers(workers, grace=5.0 if timed_out else 30.0)
        _delete_queue(client, settings.queue)
    server_events = target.server.events() if target.server is not None else None
    if server_events is not None:
        (record_dir / SERVER_EVENTS).write_text(json.dumps(server_events, indent=1))
    (record_dir / RUN_INFO).write_text(
        json.dumps(
            {
                "transport": transport,
                "lease": args.lease,
                "queue": settings.queue,
                "started": started,
                "finished": finished,
                "timed_out": timed_out,
            }
        )
    )
    return load_run(record_dir, STEPS)


def _check_java() -> None:
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        raise DemoError("PySpark needs Java 17 or later: install a JDK or set JAVA_HOME")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; exit status 0 only if the heartbeat run was exactly once."""
    args = parse_args(argv)
    try:
        _check_java()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run_dir = (args.out / stamp).resolve()
        run_dir.mkdir(parents=True)
        with sqs_target(args) as target:
            print(f"SQS: {target.describe()}", flush=True)
            plan = RunPlan(args, target, run_dir, stamp)
            runs = [run_pipeline(plan, "heartbeat", args.timeout)]
            if args.compare:
                wall = runs[0].finished - runs[0].started
                budget = min(args.timeout, max(MIN_STOCK_BUDGET, STOCK_BUDGET_FACTOR * wall))
                runs.append(run_pipeline(plan, "stock", budget))
    except DemoError as error:
        print(f"\ndemo failed: {error}", file=sys.stderr)
        return 2
    sections = [format_run(run) for run in runs]
    if len(runs) == 2:
        sections.append(format_comparison(runs[0], runs[1]))
    report = "\n\n".join(sections)
    (run_dir / "report.txt").write_text(report + "\n")
    png = write_timeline(runs, run_dir / "timeline.png")
    print("\n" + "=" * 78 + "\n" + report + "\n" + "=" * 78)
    print(f"Timeline: {png}\nReport and records: {run_dir}")
    return 0 if runs[0].exactly_once() else 1


if __name__ == "__main__":
    sys.exit(main())
