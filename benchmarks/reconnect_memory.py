"""A worker's memory across lost connections: a leak per reconnect, or a level it keeps?

One ``celery worker`` per pool (the chaos soak's app, ``soak_app.py``) on the strict
server, idle, loses its broker connection ``--drops`` times (SIGUSR2, the soak's own
drop), each once the reconnect of the one before is in its log; its resident memory
(main process and pool children, from ``/proc``) is read before the first drop and
1.5 s after each reconnect.

    .venv/bin/python benchmarks/reconnect_memory.py --pools prefork threads gevent solo --drops 30

A leak per lost connection grows the memory by about the same amount every drop (the
gevent worker's, before Celery's timer was mended: some 12 MiB a drop); a level that
the first drops reach and the later ones keep is the allocator's, not a leak. The table
gives the level before any drop, after 5 and 10, at the end, and the growth per drop
from the 10th to the last (a least-squares slope). The chaos soak judges memory from
after five lost connections for this reason (``soak_run.WARM_UP_RECONNECTS``).
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import boto3
from bench_workers import BENCH_DIR, local_server_env
from soak_workers import connections_made, process_parents, tree_rss

from celery_sqs_heartbeat.testing import StrictSQSServer

MIB = 1024 * 1024
QUEUE = "reconnect-memory"
#: Failure guards only.
READY_GUARD = 60.0
RECONNECT_GUARD = 30.0
#: After a reconnect, before the reading: the consumer's steps have started again.
SETTLE = 1.5


def measure(pool: str, drops: int, workdir: Path) -> list[float]:
    """The worker's memory in MiB: before the first drop, then after each reconnect."""
    with StrictSQSServer() as server:
        boto3.client(
            "sqs",
            endpoint_url=server.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_queue(QueueName=QUEUE, Attributes={"VisibilityTimeout": "10"})
        options = {"region": "us-east-1", "is_secure": False, "wait_time_seconds": 1}
        env = local_server_env(
            SOAK_BROKER_URL=server.broker_url,
            SOAK_QUEUES=QUEUE,
            SOAK_TRANSPORT_OPTIONS=json.dumps({**options, "visibility_timeout": 10}),
        )
        log = workdir / f"worker-{pool}.log"
        command = [sys.executable, "-m", "celery", "-A", "soak_app", "worker", "-P", pool]
        command += ["-c", "1" if pool == "solo" else "2", "-l", "info"]
        with log.open("wb") as out:
            worker = subprocess.Popen(
                command, cwd=BENCH_DIR, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            _wait(lambda: "ready." in log.read_text(errors="replace"), READY_GUARD, log)
            time.sleep(SETTLE)
            levels = [_rss_mib(worker.pid)]
            for drop in range(1, drops + 1):
                worker.send_signal(signal.SIGUSR2)
                # The first connection, then one more per drop.
                _wait(partial(_connected_more_than, log, drop), RECONNECT_GUARD, log)
                time.sleep(SETTLE)
                levels.append(_rss_mib(worker.pid))
            return levels
        finally:
            worker.terminate()
            worker.wait(60)


def _connected_more_than(log: Path, times: int) -> bool:
    return connections_made(log) > times


def _wait(done: Callable[[], bool], guard: float, log: Path) -> None:
    deadline = time.monotonic() + guard
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the worker did not get there in {guard:g} s; see {log}")
        time.sleep(0.2)


def _rss_mib(pid: int) -> float:
    return tree_rss(pid, process_parents()) / MIB


def slope(levels: list[float]) -> float:
    """MiB per drop, least squares, over ``levels`` (one a drop)."""
    if len(levels) < 2:
        return 0.0
    return statistics.linear_regression(range(len(levels)), levels).slope


def row(pool: str, levels: list[float]) -> str:
    def at(drop: int) -> str:
        return f"{levels[drop]:.0f}" if drop < len(levels) else "-"

    return (
        f"| {pool} | {len(levels) - 1} | {at(0)} | {at(5)} | {at(10)} | {levels[-1]:.0f} "
        f"| {slope(levels[10:]):+.2f} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pools", nargs="+", default=["prefork", "threads", "gevent", "solo"])
    parser.add_argument("--drops", type=int, default=30)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="reconnect-memory-"))
    print(
        "| pool | drops | MiB before | after 5 | after 10 | at the end "
        "| MiB per drop, 10th to last |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    for pool in args.pools:
        levels = measure(pool, args.drops, workdir)
        print(row(pool, levels), flush=True)
        (workdir / f"{pool}.json").write_text(json.dumps(levels))
    print(f"\nEvery reading: {workdir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
