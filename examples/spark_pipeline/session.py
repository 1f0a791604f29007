"""The worker process's one SparkSession, started on first use and reused by every task.

Starting Spark costs seconds (a JVM, a driver, executors on a cluster); paying that
per task would dominate short steps and churn cluster resources. So the session
belongs to the process, not to the task: a prefork child creates it on its first
Spark task and keeps it until the child exits.

It is created lazily, never at import, because the Celery worker's parent process
imports the tasks and then forks: a JVM started before the fork would be shared by
children that cannot safely use it.

On a cluster, a session that lives as long as its pool process must not keep its
executors while the process waits for its next task, or the first process to start
Spark holds the cluster and the others' jobs wait for it to exit. So sessions on a
cluster scale their executors with their work (see :data:`CLUSTER_SETTINGS`).
"""

from __future__ import annotations

import os
import threading

from pyspark.sql import SparkSession

#: Where Spark runs unless told otherwise: every core of this machine.
DEFAULT_MASTER = "local[*]"

#: Shuffle partitions in local mode. Spark's default of 200 is sized for clusters;
#: on a laptop it turns every shuffle into hundreds of tiny tasks.
LOCAL_SHUFFLE_PARTITIONS = 8

#: Settings for a session on a cluster (any master but ``local``). Measured on a
#: standalone cluster without them: the second pool process's first job never got an
#: executor ("Initial job has not accepted any resources") for as long as the first
#: process lived, and the heartbeat kept renewing its message the whole time.
CLUSTER_SETTINGS: dict[str, str] = {
    "spark.dynamicAllocation.enabled": "true",
    # Tracks shuffle files itself, so no external shuffle service is needed.
    "spark.dynamicAllocation.shuffleTracking.enabled": "true",
    # Without it, an executor holding a finished job's shuffle files stays until the
    # driver's garbage collector frees them, which can take half an hour. Every step
    # writes its result to Parquet, so those files are never needed again.
    "spark.dynamicAllocation.shuffleTracking.timeout": "30s",
    "spark.dynamicAllocation.executorIdleTimeout": "30s",
}

_lock = threading.Lock()
_session: SparkSession | None = None


def spark_master() -> str:
    """The master URL: ``SPARK_MASTER`` (set by ``--spark-master``) or local mode."""
    return os.environ.get("SPARK_MASTER") or DEFAULT_MASTER


def get_spark() -> SparkSession:
    """Return this process's SparkSession, creating it on the first call."""
    global _session
    with _lock:
        if _session is None:
            _session = _build(spark_master())
        return _session


def session_started() -> bool:
    """Whether this process already has a session, so callers can tell reuse from start."""
    return _session is not None


def stop_spark() -> None:
    """Stop the session, if any, so the JVM exits with the worker process."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None


def _build(master: str) -> SparkSession:
    builder = (
        SparkSession.builder.appName(f"celery-spark-pipeline-{os.getpid()}")
        .master(master)
        # Dates and timestamps in the output must not depend on the worker's time zone.
        .config("spark.sql.session.timeZone", "UTC")
        # Worker logs are shared with Celery: no progress bars drawn into them.
        .config("spark.ui.showConsoleProgress", "false")
    )
    if master.startswith("local"):
        builder = builder.config(
            "spark.sql.shuffle.partitions", str(LOCAL_SHUFFLE_PARTITIONS)
        ).config("spark.ui.enabled", "false")
    else:
        for key, value in CLUSTER_SETTINGS.items():
            builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
