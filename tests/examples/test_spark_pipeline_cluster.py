"""The pipeline's Spark sessions on a real Spark cluster: a standalone master and worker
started on 127.0.0.1, the way the example's README points workers at a cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from tests.ports import free_port

pyspark = pytest.importorskip("pyspark")

pytestmark = [pytest.mark.spark, pytest.mark.integration]

REPO_ROOT = Path(__file__).resolve().parents[2]
SPARK_HOME = Path(pyspark.__file__).parent
#: Spark binds here rather than to the machine's outward address.
SPARK_ENV = {"SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1"}

#: A pool process's life in short: its first task starts the session and runs a job
#: with a shuffle, then the process waits for its next task with the session kept.
POOL_PROCESS = """
import sys, time
from pyspark.sql import functions as F
from examples.spark_pipeline.session import get_spark
groups = get_spark().range(100_000).groupBy(F.col("id") % 7).count().count()
print(f"job done: {groups} groups", flush=True)
time.sleep(float(sys.argv[1]))
"""


def _wait_for(path: Path, text: str, timeout: float, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if process.poll() is not None:
            break
        time.sleep(0.5)
    log = path.read_text(errors="replace") if path.exists() else "(no output)"
    raise AssertionError(f"{text!r} did not appear within {timeout:.0f} s:\n{log[-3000:]}")


def _start(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with log.open("wb") as output:
        return subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env},
            cwd=REPO_ROOT,
            start_new_session=True,
        )


def _stop(process: subprocess.Popen[bytes]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A standalone Spark cluster of one master and one 2-core worker; its master URL."""
    directory = tmp_path_factory.mktemp("spark-cluster")
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    master = _start(
        [
            spark_class,
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())),
        ],
        directory / "master.log",
        SPARK_ENV,
    )
    worker = _start(
        [
            spark_class,
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--cores", "2", "--memory", "2g"),
            *("--webui-port", str(free_port()), "--work-dir", str(directory / "work"), url),
        ],
        directory / "worker.log",
        SPARK_ENV,
    )
    try:
        _wait_for(directory / "master.log", "Registering worker", 90, master)
        yield url
    finally:
        _stop(worker)
        _stop(master)


def test_an_idle_pool_process_leaves_the_cluster_to_the_others(
    spark_cluster: str, tmp_path: Path
) -> None:
    """Two pool processes, each keeping its session between tasks: the second one's job
    must run while the first sits idle, not wait for the first process to exit."""
    env = {**SPARK_ENV, "SPARK_MASTER": spark_cluster, "PYTHONPATH": str(REPO_ROOT)}
    first = _start([sys.executable, "-c", POOL_PROCESS, "600"], tmp_path / "first.log", env)
    second = None
    try:
        _wait_for(tmp_path / "first.log", "job done: 7 groups", 120, first)
        second = _start([sys.executable, "-c", POOL_PROCESS, "0"], tmp_path / "second.log", env)
        # Without scaling down, the first session holds both cores until it exits.
        _wait_for(tmp_path / "second.log", "job done: 7 groups", 240, second)
        assert first.poll() is None, "the first process must still hold its session"
    finally:
        for process in (first, second):
            if process is not None:
                _stop(process)
