"""How the worker and the demo agree on broker, transport, lease and queue."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from examples.spark_pipeline.app import PipelineSettings, pipeline


def test_settings_survive_the_trip_through_the_environment() -> None:
    settings = PipelineSettings(
        transport="stock",
        queue="q-1",
        lease=7,
        region="eu-west-1",
        endpoint_url="http://127.0.0.1:9324",
        credentials=("key", "secret"),
    )
    assert PipelineSettings.from_env(settings.to_env()) == settings


def test_local_endpoint_goes_into_the_broker_url_with_its_keys() -> None:
    settings = PipelineSettings(endpoint_url="http://127.0.0.1:9324", credentials=("k", "s"))
    config = settings.celery_config()
    assert config["broker_url"] == "sqs://k:s@127.0.0.1:9324"
    assert config["broker_transport_options"]["is_secure"] is False


def test_aws_uses_boto3_credentials_and_the_region() -> None:
    settings = PipelineSettings.from_env({"AWS_DEFAULT_REGION": "ap-south-1"})
    config = settings.celery_config()
    assert config["broker_url"] == "sqs://"
    assert config["broker_transport_options"]["region"] == "ap-south-1"
    assert "is_secure" not in config["broker_transport_options"]


@pytest.mark.parametrize(
    ("transport", "broker_transport"),
    [("heartbeat", "celery_sqs_heartbeat:Transport"), ("stock", "sqs")],
)
def test_both_transports_get_the_same_lease_and_ack_settings(
    transport: str, broker_transport: str
) -> None:
    config = PipelineSettings(transport=transport, lease=10, queue="q").celery_config()
    assert config["broker_transport"] == broker_transport
    assert config["broker_transport_options"]["visibility_timeout"] == 10
    assert config["task_acks_late"] is True
    assert config["worker_prefetch_multiplier"] == 1
    assert config["task_default_queue"] == "q"


def test_pipeline_is_a_chain_of_the_three_steps_by_name() -> None:
    chain = pipeline("/data", 1_000, seed=3)
    assert [task.task for task in chain.tasks] == [
        "spark_pipeline.generate",
        "spark_pipeline.transform",
        "spark_pipeline.aggregate",
    ]
    assert chain.tasks[0].args == ("/data", 1_000, 3)
