"""SQS's receive count as Celery's ``redelivered`` flag."""

from __future__ import annotations

from typing import Any

from celery_sqs_heartbeat.receiving.redelivery import mark_redelivered, receive_count


def _payload() -> dict[str, Any]:
    return {"body": "e30=", "properties": {"delivery_info": {"routing_key": "celery"}}}


def _received(count: str | None) -> dict[str, Any]:
    attributes = {} if count is None else {"ApproximateReceiveCount": count}
    return {"MessageId": "m", "ReceiptHandle": "h", "Attributes": attributes}


def test_a_message_received_before_is_redelivered() -> None:
    payload = mark_redelivered(_payload(), _received("2"))
    assert payload["properties"]["delivery_info"]["redelivered"] is True


def test_a_first_delivery_keeps_what_its_body_says() -> None:
    payload = mark_redelivered(_payload(), _received("1"))
    assert "redelivered" not in payload["properties"]["delivery_info"]


def test_without_a_receive_count_nothing_is_claimed() -> None:
    payload = mark_redelivered(_payload(), _received(None))
    assert "redelivered" not in payload["properties"]["delivery_info"]
    assert receive_count({"ApproximateReceiveCount": "many"}) == 1


def test_a_payload_without_kombus_envelope_is_left_alone() -> None:
    assert mark_redelivered("plain text", _received("3")) == "plain text"
    assert mark_redelivered({"body": "x"}, _received("3")) == {"body": "x"}
