"""The settler on its own: a fake channel port and manager, kombu's steps as callables."""

from __future__ import annotations

from typing import Any

from celery_sqs_heartbeat.leasing.lease_table import LeaseTable
from celery_sqs_heartbeat.leasing.leases import Lease
from celery_sqs_heartbeat.options import HeartbeatOptions
from celery_sqs_heartbeat.settling.settler import Settler
from tests.unit.conftest import POLICY, FakeQueue


class Qos:
    def __init__(self, said: list[str]) -> None:
        self.said = said

    def ack(self, tag: str) -> None:
        self.said.append(f"qos.ack {tag}")

    def forget(self, tag: str) -> None:
        self.said.append(f"qos.forget {tag}")

    def _extract_backoff_policy_configuration_and_message(self, tag: str) -> Any:
        return None, None, None, None


class Port:
    connection: Any = None

    def __init__(self, said: list[str]) -> None:
        self.qos = Qos(said)

    def _has_redrive_policy(self, queue: str, queue_url: str) -> Any:
        return False


class Manager:
    def __init__(self, said: list[str]) -> None:
        self.said = said

    def delete(self, lease: Lease, wait: float) -> None:
        self.said.append(f"manager.delete {lease.receipt_handle} {wait}")

    def release(self, leases: Any, reason: str, wait: float = 0) -> None:
        handles = [(lease.receipt_handle, delay) for lease, delay in leases]
        self.said.append(f"manager.release {handles} {reason}")


def settler_holding(said: list[str], **options: Any) -> Settler:
    table = LeaseTable()
    lease = Lease(receipt_handle="rh-1", queue=FakeQueue(), policy=POLICY, received_at=0.0)
    table.admit(lease)
    table.claim("rh-1", "task-1", "tasks.crunch")
    settings = HeartbeatOptions.from_transport_options({"ack_batch_interval": 0.5, **options})
    return Settler(Port(said), settings, Manager(said), table, lambda url: 0)  # type: ignore[arg-type]


def test_an_ack_leaves_the_delete_in_the_outbox_and_kombu_only_forgets_the_delivery() -> None:
    said: list[str] = []
    settler = settler_holding(said)

    settler.ack("rh-1", False, lambda tag, multiple: said.append("kombu's SQS ack"))
    settler.ack("rh-unknown", False, lambda tag, multiple: said.append(f"kombu's SQS ack {tag}"))

    assert said == ["manager.delete rh-1 0.5", "qos.ack rh-1", "kombu's SQS ack rh-unknown"]


def test_a_reject_on_failure_is_a_release_and_kombu_only_forgets_the_delivery() -> None:
    said: list[str] = []
    settler = settler_holding(said, release_on_failure=True, release_delay=7)

    settler.reject("rh-1", False, lambda tag, requeue: said.append("kombu's reject"))

    assert said == ["manager.release [('rh-1', 7)] failure", "qos.forget rh-1"]
