"""Remote control's answer time and monitoring's idle SQS/SNS requests, before and after.

Issue 25 asks that ``celery inspect ping`` against an idle worker answer within its
``--timeout``, without raising what idle workers and monitors cost in requests by more
than a stated amount. This script measures both, in one run, on two trees: *before*, a
git revision exported to a temporary directory (``--before``, by default ``c185ec0``, the
last commit without :mod:`celery_sqs_heartbeat.monitoring.timely_replies`), and *after*, this
checkout. Each side gets its own strict server (moto, 127.0.0.1), kombu's defaults
(``wait_time_seconds`` 10, ``polling_interval`` 1) and, in turn:

1. an idle prefork worker (``-c 1``) with ``supports_fanout`` and ``events_through_sns``
   and task events (``-E``, so Celery's heartbeats every 2 s): the requests the server
   counted in ``--idle`` seconds, scaled to an hour;
2. ``--pings`` runs of ``celery inspect ping --timeout 1`` against that worker, each a
   new process as an operator runs it: wall time (the interpreter's start included),
   p50 and max, and how many had the worker's answer;
3. an idle worker without ``supports_fanout`` (no remote control, no events);
4. an idle Flower (``celery flower``, ``supports_fanout`` and ``events_through_sns``),
   no worker beside it.

    .venv/bin/python benchmarks/monitoring_requests.py [--before REV] [--pings 20] [--idle 120]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench_report import environment

from celery_sqs_heartbeat.testing import StrictSQSServer

ROOT = Path(__file__).resolve().parent.parent
#: The last commit without ``celery_sqs_heartbeat.monitoring.timely_replies``.
DEFAULT_BEFORE = "c185ec0"
MONITORING = {"supports_fanout": True, "events_through_sns": True}
#: After a process is ready: its first polls sent, its subscriptions made.
SETTLE = 5.0


@dataclass
class Side:
    """One tree's figures."""

    name: str
    ping_seconds: list[float] = field(default_factory=list)
    answered: int = 0
    idle_calls: dict[str, dict[str, int]] = field(default_factory=dict)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=DEFAULT_BEFORE, help="git revision")
    parser.add_argument("--pings", type=int, default=20)
    parser.add_argument("--idle", type=float, default=120.0, help="seconds per idle window")
    args = parser.parse_args()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        before_tree = export(args.before, Path(scratch) / "before")
        sides = [
            measure(f"before ({args.before})", before_tree, args, Path(scratch)),
            measure("after (this checkout)", ROOT, args, Path(scratch)),
        ]
    command = "benchmarks/monitoring_requests.py " + shlex.join(sys.argv[1:])
    print(report(sides, args.idle))
    print(environment(command.strip(), time.monotonic() - started))


def export(revision: str, into: Path) -> Path:
    into.mkdir()
    archive = subprocess.run(
        ["git", "archive", revision], cwd=ROOT, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def measure(name: str, tree: Path, args: argparse.Namespace, scratch: Path) -> Side:
    side = Side(name)
    logs = scratch / f"logs-{name.split()[0]}"
    logs.mkdir()
    with StrictSQSServer() as server:
        run = Runner(server, tree, logs)
        with run.worker("monitored", MONITORING, "-E"):
            side.idle_calls["idle worker, fanout + events_through_sns, -E"] = run.idle(args.idle)
            for _ in range(args.pings):
                seconds, answered = run.ping()
                side.ping_seconds.append(seconds)
                side.answered += answered
        with run.worker("plain", {}):
            side.idle_calls["idle worker, no supports_fanout"] = run.idle(args.idle)
        with run.flower():
            side.idle_calls["idle Flower, fanout + events_through_sns"] = run.idle(args.idle)
    print(f"{name}: measured", file=sys.stderr)
    return side


class Runner:
    """``celery`` processes of the integration tests' app, from one tree, on one server."""

    def __init__(self, server: StrictSQSServer, tree: Path, logs: Path) -> None:
        self.server = server
        self.tree = tree
        self.logs = logs

    def env(self, options: Mapping[str, object]) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            IT_BROKER_URL=f"sqs://{self.server.ACCESS_KEY}:secret@127.0.0.1:{self.server.port}",
            IT_TRANSPORT_OPTIONS=json.dumps({"region": "us-east-1", "is_secure": False, **options}),
            IT_QUEUE="monitoring-bench",
            IT_RECORD_FILE=str(self.logs / "records.jsonl"),
            PYTHONPATH=str(self.tree),
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="secret",
            AWS_DEFAULT_REGION="us-east-1",
        )
        return env

    @contextmanager
    def process(self, name: str, options: Mapping[str, object], *args: str) -> Iterator[Path]:
        log = self.logs / f"{name}.log"
        with log.open("w") as out:
            process = subprocess.Popen(
                celery(*args), cwd=self.tree, env=self.env(options), stdout=out, stderr=out
            )
            try:
                yield log
            finally:
                process.terminate()
                process.wait(60)

    @contextmanager
    def worker(self, name: str, options: Mapping[str, object], *flags: str) -> Iterator[None]:
        worker = ("worker", "-P", "prefork", "-c", "1", "-n", f"{name}@%h", "-l", "info")
        quiet = ("--without-mingle", "--without-gossip", *flags)
        with self.process(name, options, *worker, *quiet) as log:
            wait_until(lambda: "ready." in log.read_text(), f"the worker ready ({log})")
            time.sleep(SETTLE)
            yield

    @contextmanager
    def flower(self) -> Iterator[None]:
        port = free_port()
        flower = ("flower", f"--port={port}", "--address=127.0.0.1")
        with self.process("flower", MONITORING, *flower):
            wait_until(lambda: answers(f"http://127.0.0.1:{port}/healthcheck"), "Flower serving")
            time.sleep(SETTLE)
            yield

    def idle(self, seconds: float) -> dict[str, int]:
        """The calls the server counted in ``seconds`` of nothing asked."""
        self.server.reset_calls()
        time.sleep(seconds)
        return self.server.calls()

    def ping(self) -> tuple[float, bool]:
        started = time.monotonic()
        ping = subprocess.run(
            celery("inspect", "ping", "--timeout", "1"),
            cwd=self.tree,
            env=self.env(MONITORING),
            capture_output=True,
            text=True,
            timeout=120,
        )
        return time.monotonic() - started, "monitored@" in ping.stdout


def celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "tests.integration.app", *args]


def wait_until(done: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def report(sides: list[Side], idle: float) -> str:
    before, after = sides
    lines = [
        f"| | {before.name} | {after.name} | after / before |",
        "|---|---|---|---|",
    ]
    for figure, pick in (("p50", statistics.median), ("max", max)):
        was, now = pick(before.ping_seconds), pick(after.ping_seconds)
        row = f"{was:.2f} s | {now:.2f} s | {now / was:.2f}"
        lines.append(f"| `celery inspect ping --timeout 1`, {figure} | {row} |")
    count = len(after.ping_seconds)
    lines.append(f"| answered | {before.answered}/{count} | {after.answered}/{count} | |")
    for what in before.idle_calls:
        was, now = per_hour(before.idle_calls[what], idle), per_hour(after.idle_calls[what], idle)
        ratio = f"{now / was:.2f}" if was else ""
        lines.append(f"| {what}: requests an hour | {was} | {now} | {ratio} |")
    lines.append("")
    lines.append(f"Requests counted in {idle:.0f} s, by action (scaled to an hour above):")
    for side in sides:
        for what, calls in side.idle_calls.items():
            lines.append(f"- {side.name}, {what}: {dict(sorted(calls.items()))}")
    return "\n".join(lines)


def per_hour(calls: dict[str, int], seconds: float) -> int:
    return round(sum(calls.values()) * 3600 / seconds)


if __name__ == "__main__":
    main()
