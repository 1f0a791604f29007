"""The Celery application: three PySpark steps chained into a pipeline over SQS.

Every step takes the previous step's result (paths and row counts under one shared
output directory) and returns its own, so the pipeline is a plain Celery chain and
any worker on any machine can run any step, as long as it sees the output directory
(a shared disk, or an ``s3a://``/``hdfs://`` URI on a cluster).

The worker is configured from environment variables (see ``PipelineSettings``), so
scaling out is the same command on another machine::

    SPARK_PIPELINE_QUEUE=spark-pipeline SPARK_MASTER=spark://master:7077 \\
        celery -A examples.spark_pipeline.app worker --concurrency 2
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from celery import Celery, Task, chain
from celery.signals import task_received, worker_process_shutdown, worker_ready
from celery.worker.request import Request
from pyspark.sql import DataFrame

from celery_sqs_heartbeat.signals import lease_lost, lease_released, lease_renewed
from examples.spark_pipeline import records, transforms
from examples.spark_pipeline.session import get_spark, session_started, stop_spark

#: The pipeline's steps, in order; the report and the timeline list them this way.
STEPS: tuple[str, ...] = ("generate", "transform", "aggregate")

#: ``broker_transport`` per ``SPARK_PIPELINE_TRANSPORT``: the lease-renewing
#: transport, or kombu's own SQS transport for comparison.
TRANSPORTS: Mapping[str, str] = {
    "heartbeat": "celery_sqs_heartbeat:Transport",
    "stock": "sqs",
}

ENV_PREFIX = "SPARK_PIPELINE_"


@dataclass(frozen=True)
class PipelineSettings:
    """Everything the worker and the sender must agree on, carried in the environment.

    The demo builds one, hands ``to_env()`` to the worker subprocess and applies
    ``celery_config()`` to its own copy of the app, so both ends cannot drift apart.
    """

    transport: str = "heartbeat"
    queue: str = "spark-pipeline"
    #: The SQS lease in seconds. With the heartbeat transport it can stay short even
    #: for hour-long jobs: it only bounds how late a crashed worker's task is retried.
    lease: int = 60
    region: str = "us-east-1"
    #: ``None`` means AWS itself; otherwise an SQS-compatible endpoint URL.
    endpoint_url: str | None = None
    #: Access key and secret for a local endpoint. For AWS leave them out and let
    #: boto3 find credentials the usual way (environment, profile, instance role).
    credentials: tuple[str, str] | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> PipelineSettings:
        """Read the settings a worker was started with."""
        key = env.get(ENV_PREFIX + "ACCESS_KEY")
        secret = env.get(ENV_PREFIX + "SECRET_KEY")
        return cls(
            transport=env.get(ENV_PREFIX + "TRANSPORT", cls.transport),
            queue=env.get(ENV_PREFIX + "QUEUE", cls.queue),
            lease=int(env.get(ENV_PREFIX + "LEASE", cls.lease)),
            region=env.get(ENV_PREFIX + "REGION")
            or env.get("AWS_REGION")
            or env.get("AWS_DEFAULT_REGION")
            or cls.region,
            endpoint_url=env.get(ENV_PREFIX + "ENDPOINT_URL") or None,
            credentials=(key, secret) if key and secret else None,
        )

    def to_env(self) -> dict[str, str]:
        """The environment variables that make ``from_env`` return these settings."""
        env = {
            ENV_PREFIX + "TRANSPORT": self.transport,
            ENV_PREFIX + "QUEUE": self.queue,
            ENV_PREFIX + "LEASE": str(self.lease),
            ENV_PREFIX + "REGION": self.region,
        }
        if self.endpoint_url:
            env[ENV_PREFIX + "ENDPOINT_URL"] = self.endpoint_url
        if self.credentials:
            env[ENV_PREFIX + "ACCESS_KEY"], env[ENV_PREFIX + "SECRET_KEY"] = self.credentials
        return env

    def broker_url(self) -> str:
        """kombu's SQS URL: the endpoint's host and port, or bare ``sqs://`` for AWS.

        Credentials go into the URL only for a local endpoint; real AWS keys stay in
        boto3's own credential chain rather than in a URL that ends up in logs.
        """
        if not self.endpoint_url:
            return "sqs://"
        netloc = urlsplit(self.endpoint_url).netloc
        if self.credentials:
            key, secret = self.credentials
            return f"sqs://{key}:{secret}@{netloc}"
        return f"sqs://{netloc}"

    def celery_config(self) -> dict[str, Any]:
        """The Celery settings for this transport, lease and queue."""
        options: dict[str, Any] = {
            "region": self.region,
            "visibility_timeout": self.lease,
            # Short long-polls: a message whose lease ran out is picked up again
            # promptly, which is exactly what the stock transport must be seen doing.
            "wait_time_seconds": 2,
        }
        if self.endpoint_url:
            options["is_secure"] = urlsplit(self.endpoint_url).scheme == "https"
        return {
            "broker_url": self.broker_url(),
            "broker_transport": TRANSPORTS[self.transport],
            "broker_transport_options": options,
            "broker_connection_retry_on_startup": True,
            "task_default_queue": self.queue,
            # Ack after the task, so a crash mid-job retries it; that is what makes a
            # lease necessary in the first place.
            "task_acks_late": True,
            "worker_prefetch_multiplier": 1,
            "task_serializer": "json",
            "accept_content": ["json"],
            # Remote control would declare a fanout exchange, which kombu's SQS
            # transport implements with SNS topics: nothing this pipeline needs.
            "worker_enable_remote_control": False,
        }


class AckRecordingRequest(Request):
    """A task request that records its ack, in the worker's main process that sends it.

    On real SQS there is no server log, so the worker's own ack is the only record of
    when a message was deleted (the report and the timeline take it from here). Celery
    has no signal for the ack; a task's ``Request`` class is its extension point.
    """

    def acknowledge(self) -> None:
        first = not self.acknowledged
        super().acknowledge()
        if first:
            sqs_message = self.message.delivery_info.get("sqs_message") or {}
            _record_worker_event(
                {
                    "event": "ack",
                    "task_id": self.id,
                    "task_name": self.name,
                    "message_id": sqs_message.get("MessageId"),
                }
            )


class PipelineTask(Task):
    """The pipeline's task class: Celery's, with acks recorded."""

    Request = AckRecordingRequest


app = Celery("spark_pipeline", task_cls=PipelineTask)
app.conf.update(PipelineSettings.from_env().celery_config())


Tables = dict[str, dict[str, Any]]


@contextmanager
def _recorded(task: Task, step: str) -> Iterator[Tables]:
    """Record one execution of ``step``: who ran it, when, and what it wrote.

    Yields the dict the step fills with the tables it wrote, so the end record
    carries the row counts the report prints.
    """
    directory = records.record_dir()
    tables: Tables = {}
    base = {
        "task_id": task.request.id,
        "step": step,
        "worker": task.request.hostname or socket.gethostname(),
        "pid": os.getpid(),
    }
    if directory is not None:
        records.append(
            directory / records.EXECUTIONS,
            {**base, "event": "start", "time": time.time(), "session_reused": session_started()},
        )
    status = "failed"
    try:
        yield tables
        status = "ok"
    finally:
        if directory is not None:
            records.append(
                directory / records.EXECUTIONS,
                {**base, "event": "end", "time": time.time(), "status": status, "tables": tables},
            )


def _write(df: DataFrame, path: str) -> dict[str, Any]:
    """Write ``df`` as Parquet, replacing any earlier attempt, and count what landed.

    Counting the written files (Parquet keeps row counts in its footers) reports what
    is on disk, not what the plan was expected to produce.
    """
    df.write.mode("overwrite").parquet(path)
    return {"path": path, "rows": get_spark().read.parquet(path).count()}


@app.task(bind=True, name="spark_pipeline.generate")
def generate(self: Task, out_dir: str, rows: int, seed: int = 7) -> dict[str, Any]:
    """Step 1: generate the raw orders and their customer and product dimensions."""
    with _recorded(self, "generate") as tables:
        spark = get_spark()
        customers = transforms.customer_count(rows)
        products = transforms.product_count(rows)
        tables["customers"] = _write(
            transforms.generate_customers(spark, customers, seed), f"{out_dir}/customers"
        )
        tables["products"] = _write(
            transforms.generate_products(spark, products, seed), f"{out_dir}/products"
        )
        tables["orders_raw"] = _write(
            transforms.generate_orders(spark, rows, seed, customers, products),
            f"{out_dir}/orders_raw",
        )
    return {"out_dir": out_dir, "tables": tables}


@app.task(bind=True, name="spark_pipeline.transform")
def transform(self: Task, previous: dict[str, Any]) -> dict[str, Any]:
    """Step 2: clean and enrich the raw orders."""
    with _recorded(self, "transform") as tables:
        spark = get_spark()
        inputs = previous["tables"]
        clean = transforms.clean_orders(
            spark.read.parquet(inputs["orders_raw"]["path"]),
            spark.read.parquet(inputs["customers"]["path"]),
            spark.read.parquet(inputs["products"]["path"]),
        )
        tables["orders_clean"] = _write(clean, f"{previous['out_dir']}/orders_clean")
    return {"out_dir": previous["out_dir"], "tables": {**inputs, **tables}}


@app.task(bind=True, name="spark_pipeline.aggregate")
def aggregate(self: Task, previous: dict[str, Any]) -> dict[str, Any]:
    """Step 3: daily revenue per region, top products per region, value per customer."""
    with _recorded(self, "aggregate") as tables:
        spark = get_spark()
        inputs = previous["tables"]
        out_dir = previous["out_dir"]
        clean = spark.read.parquet(inputs["orders_clean"]["path"])
        tables["daily_region_revenue"] = _write(
            transforms.daily_region_revenue(clean), f"{out_dir}/daily_region_revenue"
        )
        tables["top_products"] = _write(transforms.top_products(clean), f"{out_dir}/top_products")
        tables["customer_summary"] = _write(
            transforms.customer_summary(clean), f"{out_dir}/customer_summary"
        )
    return {"out_dir": out_dir, "tables": {**inputs, **tables}}


def pipeline(out_dir: str, rows: int, seed: int = 7, sender: Celery = app) -> chain:
    """The whole pipeline as one Celery chain, ready to ``apply_async``.

    The steps are named rather than imported, so ``sender`` can be any app
    configured for the target queue: the demo sends each run through a fresh app,
    because a Celery app caches its broker connection and routes on first use.
    """
    return chain(
        sender.signature(generate.name, args=(out_dir, rows, seed)),
        sender.signature(transform.name),
        sender.signature(aggregate.name),
    )


def _record_worker_event(record: dict[str, Any]) -> None:
    directory = records.record_dir()
    if directory is not None:
        records.append(directory / records.WORKER_EVENTS, {**record, "time": time.time()})


@worker_ready.connect
def _on_ready(sender: Any, **_: Any) -> None:
    """Tell the demo the worker consumes, so it knows when to start the clock."""
    _record_worker_event({"event": "worker_ready", "worker": sender.hostname, "pid": os.getpid()})


@task_received.connect
def _on_received(request: Any, **_: Any) -> None:
    """Record every delivery, duplicates included, with its SQS message id."""
    sqs_message = request.message.delivery_info.get("sqs_message") or {}
    _record_worker_event(
        {
            "event": "receive",
            "task_id": request.id,
            "task_name": request.name,
            "message_id": sqs_message.get("MessageId"),
        }
    )


@lease_renewed.connect
def _on_renewed(task_id: str, task_name: str, renewals: int, **_: Any) -> None:
    _record_worker_event(
        {"event": "renew", "task_id": task_id, "task_name": task_name, "renewals": renewals}
    )


@lease_released.connect
def _on_released(task_id: str, task_name: str, reason: str, **_: Any) -> None:
    _record_worker_event(
        {"event": "release", "task_id": task_id, "task_name": task_name, "reason": reason}
    )


@lease_lost.connect
def _on_lost(task_id: str, task_name: str, reason: str, **_: Any) -> None:
    _record_worker_event(
        {"event": "lost", "task_id": task_id, "task_name": task_name, "reason": reason}
    )


@worker_process_shutdown.connect
def _stop_spark(**_: Any) -> None:
    """Stop the pool process's Spark session so its JVM exits cleanly with it."""
    stop_spark()
