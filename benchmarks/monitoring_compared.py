"""Monitoring on SQS as a user runs it: kombu's stock transport beside this one, in one run.

For each transport: a fresh strict SQS server (SQS and SNS) on 127.0.0.1, a real
``celery worker -E -P prefork -c 2`` of ``bench_app``, and the monitoring commands of
issue 25's table, each under a timeout:

- ``celery inspect ping/active/reserved/scheduled/stats`` and ``celery status``: did the
  worker answer, and how long the command took;
- ``celery control revoke`` of a countdown task: did the worker answer, and how many
  times the task ran anyway (the stock transport's lease runs out while the worker holds
  the task for its countdown, so SQS hands it out again);
- ``celery control terminate`` of a running task: did the worker answer, and did it
  terminate the task;
- ``celery events --dump``: which events it printed within the window;
- Flower: its REST API (online workers from events, the task list, the workers as
  ``inspect`` finds them) and the dashboard's counters.

Both sides get the same transport options: kombu's stock transport takes
``supports_fanout`` (kombu's own option) and ignores ``events_through_sns`` (this
package's). It prints one markdown table, stock beside ours, and what it was measured on.
Every subprocess runs in a session of its own and is killed, with its children, at the end.

    .venv/bin/python benchmarks/monitoring_compared.py   # --lease S, --window S, --timeout S
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from bench_report import environment
from celery import Celery
from spawned import Spawned

from celery_sqs_heartbeat.testing import StrictSQSServer

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
#: The worker's name; ``%h`` is the host, as ``celery worker -n`` expands it.
NODE = "monitored@%h"
INSPECT_COMMANDS = ("ping", "active", "reserved", "scheduled", "stats")
#: How long a ``celery`` command may take before it is killed and counted as no answer.
COMMAND_GUARD = 60.0
#: The terminate row's task, as a share of the lease: it ends within its lease, so the
#: stock transport does not hand it out again and keep the pool busy for the later rows.
TERMINATE_TASK_LEASES = 0.8
#: Tasks sent while Flower and ``celery events --dump`` listen.
MONITORED_TASKS = 3
#: Flower's REST API answers without authentication only when this is set.
FLOWER_ENV = {"FLOWER_UNAUTHENTICATED_API": "1"}
#: An HTTP client that never goes through a configured proxy: everything is on 127.0.0.1.
HTTP = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Side:
    """One column of the table: a transport, named as ``broker_transport`` takes it."""

    label: str
    transport: str


SIDES = (
    Side("kombu's stock SQS (`sqs`)", "sqs"),
    Side("this transport (`celery_sqs_heartbeat:Transport`)", "celery_sqs_heartbeat:Transport"),
)


@dataclass(frozen=True)
class Settings:
    """What a run may change from the command line: the lease, the rows' wait, --timeout."""

    lease: int
    window: float
    timeout: float

    def transport_options(self) -> dict[str, Any]:
        """The same for both sides; kombu's default long poll, as users run it."""
        return {
            "region": "us-east-1",
            "is_secure": False,
            "visibility_timeout": self.lease,
            "supports_fanout": True,
            "events_through_sns": True,
        }


class Bed:
    """One side's server, queue, worker environment and producer."""

    def __init__(self, side: Side, settings: Settings, server: StrictSQSServer, logs: Path):
        self.side = side
        self.settings = settings
        self.server = server
        self.logs = logs
        self.queue = f"monitored-{uuid.uuid4().hex[:8]}"
        self.records = logs / "executions.jsonl"
        self.node = NODE.replace("%h", socket.gethostname())
        self.producer = Celery("monitoring-producer", set_as_current=False)
        self.producer.conf.update(
            broker_url=server.broker_url,
            broker_transport=side.transport,
            broker_transport_options=settings.transport_options(),
            broker_connection_retry_on_startup=False,
        )

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            BENCH_BROKER_URL=self.server.broker_url,
            BENCH_TRANSPORT=self.side.transport,
            BENCH_TRANSPORT_OPTIONS=json.dumps(self.settings.transport_options()),
            BENCH_QUEUE=self.queue,
            BENCH_RECORD_FILE=str(self.records),
            PYTHONPATH=os.pathsep.join([str(REPO), str(BENCH_DIR)]),
            AWS_ACCESS_KEY_ID=StrictSQSServer.ACCESS_KEY,
            AWS_SECRET_ACCESS_KEY=StrictSQSServer.ACCESS_KEY,
            AWS_DEFAULT_REGION=StrictSQSServer.REGION,
            **FLOWER_ENV,
        )
        return env

    def spawn(self, name: str, *args: str) -> Spawned:
        command = [sys.executable, "-m", "celery", "-A", "bench_app", *args]
        return Spawned(command, self.env(), self.logs / f"{name}.log", BENCH_DIR)

    def celery(self, *args: str) -> tuple[str, float]:
        """Run a ``celery`` command to its end: its output, and how long it took."""
        command = [sys.executable, "-m", "celery", "-A", "bench_app", *args]
        started = time.monotonic()
        try:
            done = subprocess.run(
                command,
                cwd=BENCH_DIR,
                env=self.env(),
                capture_output=True,
                text=True,
                timeout=COMMAND_GUARD,
                check=False,
            )
            output = done.stdout + done.stderr
        except subprocess.TimeoutExpired:
            output = f"(killed after {COMMAND_GUARD:.0f} s)"
        seconds = time.monotonic() - started
        (self.logs / f"command-{args[0]}-{args[1]}.log").write_text(output)
        return output, seconds

    def send(self, task: str, *args: Any, **options: Any) -> str:
        result = self.producer.send_task(
            f"bench_app.{task}", args=args, queue=self.queue, **options
        )
        return str(result.id)

    def runs_of(self, task_id: str) -> int:
        if not self.records.exists():
            return 0
        lines = self.records.read_text().splitlines()
        return sum(1 for line in lines if json.loads(line)["task_id"] == task_id)

    def answered(self, output: str) -> bool:
        """Whether the worker is among the nodes a command lists (``->  name: OK``)."""
        return re.search(rf"^->\s+{re.escape(self.node)}:", output, re.MULTILINE) is not None


def wait_for(find: Callable[[], Any], timeout: float) -> Any:
    """Poll ``find`` until it returns something true or ``timeout`` passes; its last answer."""
    deadline = time.monotonic() + timeout
    while not (found := find()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


def answer_text(answered: bool, seconds: float) -> str:
    return f"answered in {seconds:.1f} s" if answered else f"no answer ({seconds:.1f} s)"


def measure_commands(bed: Bed) -> dict[str, str]:
    """``inspect`` and ``status`` against the idle worker, one after the other."""
    cells = {}
    timeout = f"{bed.settings.timeout:g}"
    for command in INSPECT_COMMANDS:
        output, seconds = bed.celery("inspect", command, "--timeout", timeout)
        cells[f"`inspect {command}`"] = answer_text(bed.answered(output), seconds)
    output, seconds = bed.celery("status", "--timeout", timeout)
    cells["`status`"] = answer_text(bed.answered(output), seconds)
    return cells


def received(worker: Spawned, task_id: str, times: int = 1) -> bool:
    return worker.output.count(f"[{task_id}] received") >= times


def measure_revoke(bed: Bed, worker: Spawned) -> str:
    """Revoke a task the worker holds for its countdown; count its runs until well after."""
    countdown = 2 * bed.settings.lease
    sent = time.monotonic()
    task_id = bed.send("noop", countdown=countdown)
    if not wait_for(lambda: received(worker, task_id), bed.settings.window):
        return "the worker never received the task"
    output, seconds = bed.celery(
        "control", "revoke", task_id, "--timeout", f"{bed.settings.timeout:g}"
    )
    watched = countdown + 2 * bed.settings.lease
    time.sleep(max(0.0, sent + watched - time.monotonic()))
    runs = bed.runs_of(task_id)
    receives = worker.output.count(f"[{task_id}] received")
    return (
        f"{answer_text(bed.answered(output), seconds)}; a {countdown} s countdown task "
        f"received {receives}x, ran {runs}x within {watched} s"
    )


def measure_terminate(bed: Bed, worker: Spawned) -> str:
    """Terminate a running task: did the worker terminate it, or did it run to its end?"""
    length = TERMINATE_TASK_LEASES * bed.settings.lease
    task_id = bed.send("sleep_for", length)
    if not wait_for(lambda: received(worker, task_id), bed.settings.window):
        return "the worker never received the task"
    time.sleep(1)  # from received to running, in a free pool process
    output, seconds = bed.celery(
        "control", "terminate", "SIGTERM", task_id, "--timeout", f"{bed.settings.timeout:g}"
    )
    terminated = f"Terminating {task_id}"
    wait_for(lambda: terminated in worker.output or bed.runs_of(task_id), length)
    if terminated in worker.output:
        ending = "terminated"
    elif bed.runs_of(task_id):
        ending = f"ran to its end ({length:g} s)"
    else:
        ending = f"still running after {length:g} s"
    return f"{answer_text(bed.answered(output), seconds)}; the {length:g} s task {ending}"


def measure_events_dump(bed: Bed) -> str:
    """What ``celery events --dump`` prints while the worker runs a few tasks."""
    dump = bed.spawn("events-dump", "events", "--dump")
    try:
        started = time.monotonic()
        wait_for(lambda: "heartbeat" in dump.output, bed.settings.window)
        first = time.monotonic() - started
        task_ids = [bed.send("noop") for _ in range(MONITORED_TASKS)]
        wait_for(
            lambda: all(f"succeeded: bench_app.noop({t})" in dump.output for t in task_ids),
            bed.settings.window,
        )
    finally:
        dump.stop(signal.SIGINT)
    output = dump.log.read_text(errors="replace")
    heartbeats = output.count("] heartbeat")
    succeeded = sum(f"succeeded: bench_app.noop({t})" in output for t in task_ids)
    if not heartbeats and not succeeded:
        return f"no event in {time.monotonic() - started:.0f} s"
    return (
        f"first heartbeat after {first:.1f} s; heartbeats: {heartbeats}, "
        f"`task succeeded`: {succeeded} of {MONITORED_TASKS} tasks"
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def http_json(url: str, timeout: float = 30.0) -> Any:
    try:
        with HTTP.open(url, timeout=timeout) as answer:
            return json.loads(answer.read())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def flower(bed: Bed) -> Iterator[str]:
    """A Flower process on a free port of 127.0.0.1, once it answers; its base URL."""
    port = free_port()
    process = bed.spawn("flower", "flower", "--address=127.0.0.1", f"--port={port}")
    try:
        base = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_json(f"{base}/api/workers?status=1") is not None, 60)
        yield base
    finally:
        process.stop(signal.SIGTERM)


def measure_flower(bed: Bed) -> dict[str, str]:
    """Flower as its pages see the worker and a few tasks sent while it runs."""
    with flower(bed) as base:
        started = time.monotonic()
        # Online once a heartbeat came: Flower's event queue is subscribed by then.
        wait_for(lambda: online_workers(base), bed.settings.window)
        online_after = time.monotonic() - started
        task_ids = [bed.send("noop") for _ in range(MONITORED_TASKS)]
        wait_for(lambda: listed(base, task_ids)["SUCCESS"] == MONITORED_TASKS, bed.settings.window)
        return flower_rows(base, task_ids, online_after)


def online_workers(base: str) -> int:
    """The workers Flower's events say are online."""
    return sum(1 for alive in (http_json(f"{base}/api/workers?status=1") or {}).values() if alive)


def listed(base: str, task_ids: list[str]) -> Counter[str]:
    """The states Flower's task list gives these tasks, counted."""
    tasks = http_json(f"{base}/api/tasks") or {}
    return Counter(tasks[t]["state"] for t in task_ids if t in tasks)


def flower_rows(base: str, task_ids: list[str], online_after: float) -> dict[str, str]:
    online = online_workers(base)
    tasks = task_list_text(listed(base, task_ids))
    dashboard = dashboard_text((http_json(f"{base}/workers?json=1") or {}).get("data", []))
    started = time.monotonic()
    inspected = http_json(f"{base}/api/workers?refresh=1", COMMAND_GUARD) or {}
    inspect_seconds = time.monotonic() - started
    return {
        "Flower `/api/workers?status=1` (online, from events)": (
            f"{online} online (first seen {online_after:.1f} s after Flower answered)"
            if online
            else f"0 online ({online_after:.0f} s)"
        ),
        "Flower `/api/tasks` (task list, from events)": tasks,
        "Flower dashboard (`/workers?json=1`)": dashboard,
        "Flower `/api/workers?refresh=1` (inspect)": (
            f"{len(inspected)} worker(s), {inspect_seconds:.1f} s"
        ),
        "Flower `/api/queues/length` (its broker page)": http_status(f"{base}/api/queues/length"),
    }


def http_status(url: str) -> str:
    """How a page answers, for those that may fail: Flower reads queue lengths itself."""
    try:
        with HTTP.open(url, timeout=30) as answer:
            return f"HTTP {answer.status}: `{answer.read(200).decode(errors='replace')}`"
    except urllib.error.HTTPError as error:
        return f"HTTP {error.code}"
    except OSError as error:
        return f"no answer ({error})"


def task_list_text(states: Counter[str]) -> str:
    if not states:
        return f"0 of {MONITORED_TASKS} tasks"
    shown = ", ".join(f"{count} {state}" for state, count in sorted(states.items()))
    return f"{sum(states.values())} of {MONITORED_TASKS} tasks ({shown})"


def dashboard_text(workers: list[dict[str, Any]]) -> str:
    if not workers:
        return "no worker"
    totals = Counter[str]()
    for worker in workers:
        for field in ("task-received", "task-succeeded", "task-failed"):
            totals[field] += int(worker.get(field, 0))
    return (
        f"{len(workers)} worker(s); received {totals['task-received']}, "
        f"succeeded {totals['task-succeeded']}, failed {totals['task-failed']}"
    )


def measure_side(side: Side, settings: Settings, logs: Path) -> dict[str, str]:
    """Every row for one transport, against a fresh server and worker."""
    logs.mkdir(parents=True)
    with StrictSQSServer() as server:
        bed = Bed(side, settings, server, logs)
        worker = bed.spawn(
            "worker", "worker", "-E", "-P", "prefork", "-c", "2", "-n", NODE, "-l", "info"
        )
        try:
            if not wait_for(lambda: "ready." in worker.output, 90):
                raise RuntimeError(f"the {side.transport} worker never got ready: {worker.log}")
            cells = measure_commands(bed)
            progress(side, cells)
            cells["`control revoke` of a countdown task"] = measure_revoke(bed, worker)
            cells["`control terminate` of a running task"] = measure_terminate(bed, worker)
            progress(side, cells)
            cells["`celery events --dump`"] = measure_events_dump(bed)
            cells.update(measure_flower(bed))
            progress(side, cells)
        finally:
            worker.stop(signal.SIGTERM, grace=30)
            bed.producer.close()
    return cells


def progress(side: Side, cells: dict[str, str]) -> None:
    print(f"[{side.transport}] {len(cells)} rows measured", file=sys.stderr, flush=True)


def table(columns: list[dict[str, str]]) -> str:
    lines = [
        "| | " + " | ".join(side.label for side in SIDES) + " |",
        "|---|" + "---|" * len(SIDES),
    ]
    for row in columns[0]:
        lines.append(f"| {row} | " + " | ".join(c.get(row, "-") for c in columns) + " |")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lease", type=int, default=10, help="visibility_timeout (s)")
    parser.add_argument(
        "--window", type=float, default=20.0, help="how long a row waits for what it looks for"
    )
    parser.add_argument(
        "--timeout", type=float, default=1.0, help="the commands' --timeout (Celery's default)"
    )
    parser.add_argument("--logs", type=Path, help="where the processes' logs go (a new folder)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    settings = Settings(args.lease, args.window, args.timeout)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="monitoring-compared-"))
    started = time.monotonic()
    columns = [
        measure_side(side, settings, logs / re.sub(r"\W", "_", side.transport)) for side in SIDES
    ]
    command = "python benchmarks/monitoring_compared.py " + " ".join(sys.argv[1:])
    print(table(columns))
    print()
    print(
        f"Prefork `-c 2 -E` worker, lease {settings.lease} s, commands' `--timeout "
        f"{settings.timeout:g}`, rows wait up to {settings.window:g} s; transport options "
        f"of both sides: `{json.dumps(settings.transport_options())}`."
    )
    print(environment(command.strip(), time.monotonic() - started))
    print(f"- flower {metadata.version('flower')}; logs in {logs}")


if __name__ == "__main__":
    main()
