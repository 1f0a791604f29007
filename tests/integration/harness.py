"""Real worker processes and the records their tasks leave behind."""

from __future__ import annotations

import collections
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import boto3
import pytest
from celery import Celery

from celery_sqs_heartbeat.compat import KOMBU_BROADCASTS_THROUGH_SNS
from celery_sqs_heartbeat.testing import StrictSQSServer

REPO = Path(__file__).resolve().parents[2]

#: The workers' secret key: the strict server takes any, and this one must never be logged.
SECRET_KEY = "it-secret-key-that-must-never-be-logged"
#: A receipt handle of the strict server (moto's: 185 lowercase letters), or 24 letters of one.
RECEIPT_HANDLE = re.compile(r"[a-z]{24,}")
#: Where a Celery log record starts: ``[2026-11-23 14:20:25,797: INFO/MainProcess] ...``.
#: For a test of remote control: on SQS it needs kombu's SNS fanout, from kombu 5.7.
needs_sns_fanout = pytest.mark.skipif(
    not KOMBU_BROADCASTS_THROUGH_SNS,
    reason="kombu before 5.7 has no SNS fanout: a broadcast on SQS reaches no worker",
)

#: Transport options of a producer whose countdowns a worker must hold or park: without
#: them a countdown of up to 15 minutes is sent with SQS's DelaySeconds, and no worker
#: sees it before it is due (``eta_send_delay``, tests/integration/test_countdown_delay.py).
UNDELAYED = {"eta_send_delay": False}

_RECORD_START = re.compile(r"^\[[^\]]*: (DEBUG|INFO|WARNING|ERROR|CRITICAL)/", re.MULTILINE)


@dataclass
class Bed:
    """One test's queue, record file and SQS server."""

    server: StrictSQSServer
    queue: str
    records: Path
    logs: Path

    def env(self, **overrides: Any) -> dict[str, str]:
        options = {"region": "us-east-1", "is_secure": False, "wait_time_seconds": 1}
        options.update(overrides.pop("options", {}))
        env = dict(os.environ)
        env.update(
            IT_BROKER_URL=f"sqs://{self.server.ACCESS_KEY}:{SECRET_KEY}@127.0.0.1:{self.server.port}",
            IT_TRANSPORT_OPTIONS=json.dumps(options),
            IT_QUEUE=self.queue,
            IT_RECORD_FILE=str(self.records),
            PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]),
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY=SECRET_KEY,
            AWS_DEFAULT_REGION="us-east-1",
            # A process that hangs at its stop is ended with SIGABRT, and Python's fault
            # handler then writes every thread's stack to its log (stop_or_show_stacks).
            PYTHONFAULTHANDLER="1",
        )
        env.update({key: str(value) for key, value in overrides.items()})
        return env

    def sqs(self) -> Any:
        return boto3.client("sqs", **self.server.boto3_kwargs)

    def create_queue(self, visibility_timeout: int, max_receive_count: int | None = None) -> str:
        """Create the queue up front, as ops teams do, with a dead-letter queue if asked."""
        return create_queue(self.sqs(), self.queue, visibility_timeout, max_receive_count)

    @contextmanager
    def client_app(
        self,
        name: str,
        credentials: tuple[str, str] | None = None,
        transport_options: dict[str, Any] | None = None,
    ) -> Iterator[Celery]:
        """A Celery app of this process on the bed's server through the heartbeat transport.

        ``credentials`` (access key ID, secret key) default to the server's, which it
        accepts unless IAM is enforced; ``transport_options`` add to the app's.
        """
        url = (
            self.server.broker_url if credentials is None else broker_url(self.server, *credentials)
        )
        with Celery(name, set_as_current=False) as app:
            app.conf.update(
                broker_url=url,
                broker_transport="celery_sqs_heartbeat:Transport",
                broker_transport_options={
                    "region": "us-east-1",
                    "is_secure": False,
                    **(transport_options or {}),
                },
            )
            yield app

    def send(
        self,
        task: str,
        *args: Any,
        credentials: tuple[str, str] | None = None,
        transport_options: dict[str, Any] | None = None,
        **options: Any,
    ) -> str:
        """Publish a task the way ``task.delay()`` does, through the heartbeat transport.

        ``credentials`` (access key ID, secret key) are those of the producer; by default
        the server's, which it accepts unless IAM is enforced. ``transport_options`` add
        to the producer's ``broker_transport_options``.
        """
        with self.client_app("producer", credentials, transport_options) as app:
            result = app.send_task(
                f"tests.integration.app.{task}", args=args, queue=self.queue, **options
            )
            return str(result.id)

    def executions(self) -> list[dict[str, Any]]:
        if not self.records.exists():
            return []
        return [json.loads(line) for line in self.records.read_text().splitlines() if line]

    def runs_per_task(self) -> dict[str, int]:
        return dict(collections.Counter(record["task_id"] for record in self.executions()))

    def wait_for_executions(self, count: int, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = self.executions()
            if len(done) >= count:
                return done
            time.sleep(0.2)
        return self.executions()


def create_queue(
    sqs: Any, name: str, visibility_timeout: int, max_receive_count: int | None = None
) -> str:
    """Create queue ``name`` with the client ``sqs``; its URL.

    With ``max_receive_count``, SQS moves a message received that many times to the
    dead-letter queue ``<name>-dlq``, made first (``sqs_reads.dead_lettered`` reads it).
    """
    attributes = {"VisibilityTimeout": str(visibility_timeout)}
    if max_receive_count is not None:
        dead = sqs.create_queue(QueueName=f"{name}-dlq")["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])
        attributes["RedrivePolicy"] = json.dumps(
            {
                "deadLetterTargetArn": arn["Attributes"]["QueueArn"],
                "maxReceiveCount": str(max_receive_count),
            }
        )
    return str(sqs.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"])


T = TypeVar("T")


@dataclass(frozen=True)
class Sent:
    """A published task, as the strict server's event log knows it."""

    task_id: str
    message_id: str
    #: The SendMessage parameters as sent: QueueUrl, MessageBody, MessageGroupId, ...
    params: dict[str, Any] = field(compare=False)


def send_recorded(
    bed: Bed,
    task: str,
    *args: Any,
    edit_params: Callable[[dict[str, Any]], None] | None = None,
    transport_options: dict[str, Any] | None = None,
    **options: Any,
) -> Sent:
    """Like ``bed.send``, and also the SQS message id, to find the task in the event log.

    ``edit_params`` may change the SendMessage parameters before they are sent; options
    that ``send_task`` does not know become message properties, which kombu reads
    (``MessageGroupId``, ``MessageDeduplicationId``); ``transport_options`` add to the
    producer's ``broker_transport_options``.
    """
    sent: list[dict[str, Any]] = []
    message_ids: list[str] = []

    def keep(params: dict[str, Any], **_: Any) -> None:
        if edit_params is not None:
            edit_params(params)
        sent.append(dict(params))

    def note_message_id(parsed: dict[str, Any], **_: Any) -> None:
        message_ids.append(parsed["MessageId"])

    hooks: dict[str, Callable[..., None]] = {
        "provide-client-params.sqs.SendMessage": keep,
        "after-call.sqs.SendMessage": note_message_id,
    }
    with (
        bed.client_app("producer", transport_options=transport_options) as app,
        app.producer_or_acquire() as producer,
    ):
        # kombu may hand a later producer the same client: the hooks must not stay.
        events = producer.channel.sqs().meta.events
        for event, hook in hooks.items():
            events.register(event, hook)
        try:
            result = app.send_task(
                f"tests.integration.app.{task}",
                args=args,
                queue=bed.queue,
                producer=producer,
                **options,
            )
        finally:
            for event, hook in hooks.items():
                events.unregister(event, hook)
    assert len(message_ids) == len(sent) == 1, (message_ids, sent)
    return Sent(str(result.id), message_ids[0], sent[0])


def wait_for(find: Callable[[], T], timeout: float, what: str = "the condition") -> T:
    """Poll ``find`` until it returns something true, and return that."""
    deadline = time.monotonic() + timeout
    while not (found := find()):
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.1)
    return found


#: How long :func:`settle` waits by default: a failure guard, not a timing. It returns as
#: soon as what it waits for holds, so a generous guard costs nothing when a test passes;
#: 10 s failed on a machine whose two cores were saturated (a dead-letter move and a
#: delete came 10 to 11 s after the tasks ended, and did come).
SETTLE_GUARD = 30.0


def settle(done: Callable[[], bool], timeout: float = SETTLE_GUARD) -> bool:
    """Wait up to ``timeout`` for ``done``; whether it came, to assert after the report."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def no_copy_left(bed: Bed, guard: float = SETTLE_GUARD) -> dict[str, Any]:
    """Whether a task of the bed's queue can still run again, told by SQS, not by a wait.

    Once the queue holds nothing (visible, in flight or delayed), every message is
    deleted and no copy of it can be received again; a copy received before its delete
    would show as a second receive. So a test asserts ``drained`` and the receives it
    expects, and needs no wait of a lease or two for a duplicate that might come late.
    """
    drained = settle(lambda: queue_is_empty(bed), guard)
    return {"drained": drained, "receives": len(ok_receives(bed))}


def ok_receives(bed: Bed) -> list[float]:
    """When SQS handed out a message of the bed's queue, oldest first."""
    return [
        e["t"]
        for e in bed.server.events()
        if e["queue"] == bed.queue and e["action"] == "receive" and e["result"] == "ok"
    ]


def wait_out_copies(
    bed: Bed, runs: int, task_seconds: float, queues: Iterable[Bed] = ()
) -> list[dict[str, Any]]:
    """The runs, once any copy already received has had time to run as well.

    With the queue drained (:func:`no_copy_left`) no copy can be received any more, but
    one received before a lapse's delete may still be running: it ends at the latest a
    task's length after the last receive (of ``bed``'s queue, and of ``queues``' too).
    Each run comes from a receive of its own, so when there are as many runs as
    receives, none is still to come, and nothing is waited for.
    """
    received = [t for queue in (bed, *queues) for t in ok_receives(queue)]
    done = bed.executions()
    if len(done) >= len(received):
        return done
    latest = max(received) + task_seconds + RUN_SLACK
    return bed.wait_for_executions(runs + 1, timeout=max(0.0, latest - time.time()))


#: Seconds from a task's end to its record being read, and a loaded machine's delay in
#: starting a received task: a failure guard for :func:`wait_out_copies`.
RUN_SLACK = 5.0


def queue_is_empty(bed: Bed) -> bool:
    """Nothing in the bed's queue: no message visible, in flight or delayed."""
    sqs = bed.sqs()
    url = sqs.get_queue_url(QueueName=bed.queue)["QueueUrl"]
    counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=list(_QUEUE_COUNTS))
    return all(counts["Attributes"].get(name) == "0" for name in _QUEUE_COUNTS)


_QUEUE_COUNTS = (
    "ApproximateNumberOfMessages",
    "ApproximateNumberOfMessagesNotVisible",
    "ApproximateNumberOfMessagesDelayed",
)


def broker_url(server: StrictSQSServer, access_key_id: str, secret_access_key: str) -> str:
    """The broker URL of ``server`` with these credentials; kombu unquotes them.

    AWS secret keys may hold "/" and "+", which would otherwise break the URL.
    """
    user = urllib.parse.quote(access_key_id, safe="")
    password = urllib.parse.quote(secret_access_key, safe="")
    return f"sqs://{user}:{password}@127.0.0.1:{server.port}"


def fresh_bed(server: StrictSQSServer, tmp_path: Path) -> Bed:
    """A new bed on a server the tests before it used, as if they had never run.

    Their faults go: a counted fault a test did not use up (three slow deletes where its
    workers made two calls) would hit the next test's calls. And it is as if a minute had
    passed since their queues were deleted: SQS refuses such a name for a minute, and
    tests share worker names (``w1``'s mailbox), so one test's delete would fail the next.
    """
    server.clear_faults()
    server.forget_deleted_queues()
    return new_bed(server, tmp_path)


def new_bed(server: StrictSQSServer, tmp_path: Path) -> Bed:
    return Bed(
        server=server,
        queue=f"it-{uuid.uuid4().hex[:10]}",
        records=tmp_path / "executions.jsonl",
        logs=tmp_path,
    )


class Worker:
    """A ``celery worker`` subprocess, as a user starts one."""

    def __init__(
        self,
        bed: Bed,
        pool: str,
        concurrency: int,
        name: str,
        env: dict[str, str],
        loglevel: str = "info",
        heartbeat: bool = False,
    ):
        """``heartbeat``: Celery's worker heartbeats (events), off unless a test is about them."""
        self.log_path = bed.logs / f"worker-{name}.log"
        self._log = self.log_path.open("w")
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.integration.app",
            "worker",
            "-P",
            pool,
            "-c",
            str(concurrency),
            "-n",
            f"{name}@%h",
            "-l",
            loglevel,
            *([] if heartbeat else ["--without-heartbeat"]),
            "--without-mingle",
            "--without-gossip",
        ]
        self.process = subprocess.Popen(
            command,
            cwd=REPO,
            env={**env, "IT_WORKER_NAME": name},
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=as_from_a_terminal,
        )

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "ready." in self.log:
                return
            if self.process.poll() is not None:
                raise AssertionError(f"worker exited at start-up:\n{self.log}")
            time.sleep(0.1)
        raise AssertionError(f"worker not ready after {timeout} s:\n{self.log}")

    @property
    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to the worker's main process only, as ``kill -SIG PID`` does."""
        if self.process.poll() is None:
            self.process.send_signal(sig)

    def pool_pids(self) -> list[int]:
        """Pids of the worker's child processes (its prefork pool), read from /proc."""
        return [pid for pid, ppid in _process_parents().items() if ppid == self.process.pid]

    def warm_shutdown(self, timeout: float = 60) -> int:
        try:
            return stop_or_show_stacks(self.process, signal.SIGTERM, timeout, self.log_path)
        finally:
            self._log.close()


def as_from_a_terminal() -> None:
    """In a started ``celery`` process: Ctrl-C (SIGINT) and SIGQUIT do what they do for a
    user at a terminal. A command run in the background by a non-interactive shell (as
    some CI runners start the tests) ignores both, and its children inherit that: a
    monitor told to stop with SIGINT ran on, and a test's stop hung."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


#: How long a process still running past its stop has to write its threads' stacks.
STACKS_GUARD = 10


def stop_or_show_stacks(process: subprocess.Popen[Any], sig: int, timeout: float, log: Path) -> int:
    """Send ``sig`` and wait up to ``timeout`` for the process to exit: its exit status.

    One still running then is ended with SIGABRT: Python's fault handler
    (``PYTHONFAULTHANDLER``, set by :meth:`Bed.env`) writes the stack of every thread to
    its log, and the failure shows that log, so that a hang at a stop says where it hung.
    """
    if process.poll() is None:
        process.send_signal(sig)
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        try:
            process.wait(STACKS_GUARD)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        command = " ".join(map(str, process.args))
        raise AssertionError(
            f"{command} was still running {timeout:g} s after signal {sig}; its log, "
            f"ending with its threads' stacks:\n{log.read_text(errors='replace')[-20000:]}"
        ) from None


@contextmanager
def worker(
    bed: Bed,
    pool: str = "prefork",
    concurrency: int = 2,
    name: str = "w1",
    loglevel: str = "info",
    heartbeat: bool = False,
    **env: Any,
) -> Iterator[Worker]:
    process = Worker(bed, pool, concurrency, name, bed.env(**env), loglevel, heartbeat)
    try:
        process.wait_ready()
        yield process
    finally:
        process.warm_shutdown()


def report(title: str, **figures: Any) -> None:
    """A scenario's figures: shown with ``-s``, and by pytest with a failure."""
    print(f"\n[{title}] " + ", ".join(f"{key}={value}" for key, value in figures.items()))


def tally(bed: Bed, sent: list[str]) -> dict[str, int]:
    """Sent, executed, duplicated and lost tasks, from the tasks' own records."""
    runs = bed.runs_per_task()
    return {
        "sent": len(sent),
        "executed": sum(runs.values()),
        "duplicates": sum(count - 1 for count in runs.values() if count > 1),
        "lost": sum(1 for task_id in sent if task_id not in runs),
    }


def records(log: str) -> list[str]:
    """A worker log cut into its records, each with its traceback; what comes first, too."""
    starts = [match.start() for match in _RECORD_START.finditer(log)]
    return [log[start:end] for start, end in zip([0, *starts], [*starts, len(log)], strict=True)]


def leaks(log: str) -> list[str]:
    """Log records at INFO or above that show the secret key or a receipt handle.

    The banner and anything printed before the first record count as INFO. DEBUG records
    are the operator's explicit choice to see everything, botocore's wire logs included.
    """
    found = []
    for record in records(log):
        level = _RECORD_START.match(record)
        if level is not None and level.group(1) == "DEBUG":
            continue
        if SECRET_KEY in record or RECEIPT_HANDLE.search(record):
            found.append(record)
    return found


def overlapping(executions: list[dict[str, Any]]) -> list[str]:
    """Task ids that ran in two places at the same moment."""
    by_task = collections.defaultdict(list)
    for record in executions:
        by_task[record["task_id"]].append((record["start"], record["end"]))
    clashes = []
    for task_id, spans in by_task.items():
        spans.sort()
        if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)):
            clashes.append(task_id)
    return clashes


def _process_parents() -> dict[int, int]:
    """The parent pid of every process on the machine, from /proc (Linux only)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # The command name in parentheses may hold spaces; the fields after it do not.
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


def process_gone(pid: int) -> bool:
    """Whether ``pid`` has exited: no such process, or a zombie nobody has reaped yet."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def log_has(process: Worker, text: str, count: int) -> bool:
    return process.log.count(text) >= count


def assert_queue_empty(bed: Bed) -> None:
    """Nothing left in the queue, visible or in flight: every task was acked and deleted."""
    sqs = bed.sqs()
    url = sqs.get_queue_url(QueueName=bed.queue)["QueueUrl"]
    attributes = sqs.get_queue_attributes(
        QueueUrl=url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    assert attributes == {
        "ApproximateNumberOfMessages": "0",
        "ApproximateNumberOfMessagesNotVisible": "0",
    }


def assert_no_visibility_change_after_delete(bed: Bed) -> None:
    """SQS took no visibility change of a message after its delete: the delete was last."""
    deleted: dict[str, float] = {}
    for event in bed.server.events():
        if not event["queue"].endswith(bed.queue):
            continue
        if event["action"] == "delete" and event["result"] == "ok":
            deleted[event["message_id"]] = event["t"]
        elif event["action"] == "change_visibility" and event["result"] == "ok":
            assert event["message_id"] not in deleted, event


#: Celery's warning when its consumer's broker connection breaks, and what it logs at
#: each (re)connect.
CONNECTION_LOST = "Connection to broker lost"
CONNECTED = "Connected to "


def reconnected(log: str) -> bool:
    """Whether the worker logged a lost connection, and a connection after it.

    A scenario waits for it (:func:`settle`) before it stops the worker: the tasks may
    all have ended before the worker connected again.
    """
    lost = log.find(CONNECTION_LOST)
    return lost != -1 and CONNECTED in log[lost:]


def assert_reconnected(log: str) -> None:
    """The worker lost its broker connection, then connected again: the drop did happen.

    A drop that never came would leave a reconnect scenario passing on an undisturbed
    worker.
    """
    lost = log.find(CONNECTION_LOST)
    assert lost != -1, f"the worker never logged {CONNECTION_LOST!r}:\n{log}"
    assert CONNECTED in log[lost:], f"no {CONNECTED!r} after the lost connection:\n{log}"
