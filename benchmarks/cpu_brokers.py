"""The brokers ``cpu_per_task.py`` compares: a backlog published, a worker's environment,
and whether every task is acked, for a local Redis and for the strict SQS server.

The SQS side reuses ``worker_throughput.py``'s runner (``bench_workers.Bench``), so its
queues, options and delete counting are the throughput scenarios'. Redis needs the
``redis`` package (the ``bench`` extra) and a ``redis-server`` on PATH.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from bench_runs import BASE_OPTIONS, LEASE, Side, backlog
from bench_workers import Bench, deletes_arrived, deletion_progress, worker_env
from celery import Celery

REDIS = Side("redis", "redis")
#: kombu's Redis transport keeps a delivered, not yet acked message in this hash.
UNACKED_KEY = "unacked"


class Broker(Protocol):
    side: Side

    def publish(self, count: int) -> tuple[str, set[str]]:
        """A fresh queue with ``count`` no-op tasks in it, and their ids."""

    def env(self, queue: str, records: Path) -> dict[str, str]:
        """What ``bench_app`` reads to serve ``queue``."""

    def drained(self, queue: str, count: int) -> bool:
        """Whether all ``count`` tasks of ``queue`` are acked."""


class SqsBroker:
    """The strict server, through the throughput scenarios' runner."""

    def __init__(self, bench: Bench, side: Side) -> None:
        self.side = side
        self._bench = bench
        self._options = {**BASE_OPTIONS, "visibility_timeout": LEASE, **side.options}

    def publish(self, count: int) -> tuple[str, set[str]]:
        return self._bench._backlog(backlog("cpu", count), self.side)

    def env(self, queue: str, records: Path) -> dict[str, str]:
        return self._bench._worker_env(self.side.transport, self._options, queue, records)

    def drained(self, queue: str, count: int) -> bool:
        server = self._bench.server
        if deletes_arrived(server.calls(), server.batch_entries()) < count:
            return False
        deleted, _, _ = deletion_progress(server.events(), queue)
        return deleted >= count


class RedisBroker:
    """kombu's Redis transport, with its default options."""

    side = REDIS

    def __init__(self, url: str) -> None:
        import redis

        self._url = url
        self._client: Any = redis.Redis.from_url(url)
        self._producer = Celery("bench-cpu-producer", set_as_current=False)
        self._producer.conf.update(broker_url=url, broker_connection_retry_on_startup=False)

    def publish(self, count: int) -> tuple[str, set[str]]:
        queue = f"bench-cpu-redis-{uuid.uuid4().hex[:8]}"
        with self._producer.producer_or_acquire() as producer:
            ids = {
                self._producer.send_task("bench_app.noop", queue=queue, producer=producer).id
                for _ in range(count)
            }
        return queue, ids

    def env(self, queue: str, records: Path) -> dict[str, str]:
        return worker_env(self._url, REDIS.transport, {}, queue, records)

    def drained(self, queue: str, count: int) -> bool:
        return bool(self._client.llen(queue) == 0 and self._client.hlen(UNACKED_KEY) == 0)

    def close(self) -> None:
        self._producer.close()
        self._client.close()


@contextmanager
def local_redis(directory: Path) -> Iterator[str]:
    """A ``redis-server`` on a free port of 127.0.0.1, persistence off; its URL."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not on PATH (apt-get install redis-server)")
    port = _free_port()
    command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(directory)]
    command += ["--save", "", "--appendonly", "no"]
    log = (directory / "redis-server.log").open("w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_listening(port, process)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _wait_listening(port: int, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError("redis-server exited at start-up")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"redis-server not listening on {port} after {timeout} s")
