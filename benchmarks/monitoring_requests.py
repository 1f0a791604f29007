"""Remote control's answer time and monitoring's idle SQS/SNS requests, on the strict server.

One run against the tree given (``--tree``, default: this checkout), with kombu's default
long poll (``wait_time_seconds`` 10, ``polling_interval`` 1) and ``supports_fanout`` and
``events_through_sns`` on:

1. an idle prefork worker (``-E``, Celery's heartbeats) alone for ``--idle`` seconds: the
   requests the server counted, scaled to an hour;
2. the same with ``celery events --dump`` beside it (the stand-in for an idle Flower);
3. ``--pings`` runs of ``celery -A app inspect ping --timeout 1``, each a new process as a
   user runs it: wall time, p50 and max, and how many had the worker's answer;
4. as many ``app.control.inspect(timeout=1).ping()`` in one process: the same wait
   without the interpreter's start.

To compare with an earlier revision, export it to a directory (``git archive REV | tar -x
-C DIR``) and pass ``--tree DIR``.

    .venv/bin/python benchmarks/monitoring_requests.py [--tree DIR] [--pings 20] [--idle 60]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OPTIONS = {
    "region": "us-east-1",
    "is_secure": False,
    "supports_fanout": True,
    "events_through_sns": True,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, default=ROOT)
    parser.add_argument("--pings", type=int, default=20)
    parser.add_argument("--idle", type=float, default=60.0)
    args = parser.parse_args()
    tree = args.tree.resolve()
    sys.path.insert(0, str(tree))
    from celery_sqs_heartbeat.testing.server import StrictSQSServer

    with StrictSQSServer() as server, tempfile.TemporaryDirectory() as logs:
        env = _env(server, tree, Path(logs))
        worker = _start(
            tree,
            env,
            Path(logs) / "worker.log",
            "worker",
            "-E",
            "-P",
            "prefork",
            "-c",
            "1",
            "-n",
            "idle@%h",
            "-l",
            "info",
            "--without-mingle",
            "--without-gossip",
        )
        try:
            _wait_ready(Path(logs) / "worker.log")
            _report_idle(server, args.idle, "idle worker")
            monitor = _start(tree, env, Path(logs) / "events.log", "events", "--dump")
            try:
                time.sleep(8)  # its queue declared and subscribed
                _report_idle(server, args.idle, "idle worker + idle celery events")
                _report_cli_pings(tree, env, args.pings)
                _report_pings_in_process(env, args.pings)
            finally:
                monitor.terminate()
                monitor.wait(30)
        finally:
            worker.terminate()
            worker.wait(60)


def _env(server: Any, tree: Path, logs: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        IT_BROKER_URL=f"sqs://{server.ACCESS_KEY}:secret@127.0.0.1:{server.port}",
        IT_TRANSPORT_OPTIONS=json.dumps(OPTIONS),
        IT_QUEUE="monitoring-bench",
        IT_RECORD_FILE=str(logs / "records.jsonl"),
        PYTHONPATH=str(tree),
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="secret",
        AWS_DEFAULT_REGION="us-east-1",
    )
    return env


def _celery(*args: str) -> list[str]:
    return [sys.executable, "-m", "celery", "-A", "tests.integration.app", *args]


def _start(tree: Path, env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    out = log.open("w")
    return subprocess.Popen(_celery(*args), cwd=tree, env=env, stdout=out, stderr=out)


def _wait_ready(log: Path) -> None:
    deadline = time.monotonic() + 60
    while "ready." not in log.read_text():
        if time.monotonic() > deadline:
            raise SystemExit(f"the worker never got ready:\n{log.read_text()}")
        time.sleep(0.1)
    time.sleep(3)


def _report_idle(server: Any, seconds: float, what: str) -> None:
    server.reset_calls()
    time.sleep(seconds)
    calls = server.calls()
    per_hour = round(sum(calls.values()) * 3600 / seconds)
    print(f"{what}: {dict(sorted(calls.items()))} in {seconds:.0f} s, {per_hour} an hour")


def _report_cli_pings(tree: Path, env: dict[str, str], count: int) -> None:
    times, answered = [], 0
    for _ in range(count):
        started = time.monotonic()
        ping = subprocess.run(
            _celery("inspect", "ping", "--timeout", "1"),
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        times.append(time.monotonic() - started)
        answered += "pong" in ping.stdout
    started = time.monotonic()
    subprocess.run(_celery("--version"), cwd=tree, env=env, capture_output=True, timeout=60)
    start_only = time.monotonic() - started
    print(
        f"celery inspect ping --timeout 1: {_spread(times)}, answered {answered}/{count} "
        f"(celery --version alone: {start_only:.2f} s)"
    )


def _report_pings_in_process(env: dict[str, str], count: int) -> None:
    os.environ.update(env)
    from tests.integration.app import app

    times, answered = [], 0
    for _ in range(count):
        started = time.monotonic()
        replies = app.control.inspect(timeout=1).ping() or {}
        times.append(time.monotonic() - started)
        answered += bool(replies)
    print(
        f"inspect(timeout=1).ping() in one process: {_spread(times)}, answered {answered}/{count}"
    )


def _spread(times: list[float]) -> str:
    return f"p50 {statistics.median(times):.2f} s, max {max(times):.2f} s, min {min(times):.2f} s"


if __name__ == "__main__":
    main()
