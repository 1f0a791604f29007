"""Parking: reading a task's ETA from an SQS body, and deciding to park or deliver it."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from celery import Celery

import celery_sqs_heartbeat.receiving.parking as parking_module
from celery_sqs_heartbeat.payloads.pointers import LEGACY_SIZE_ATTRIBUTE, SIZE_ATTRIBUTE, S3Pointer
from celery_sqs_heartbeat.receiving.parking import (
    RETURN_LEAD,
    Due,
    ParkingPolicy,
    copy_attributes,
    read_due,
)

#: A hand-driven "now", in seconds since the epoch.
NOW = datetime(2026, 11, 24, 12, 0, tzinfo=timezone.utc).timestamp()
POLICY = ParkingPolicy(threshold=900, longest_hide=43_140)


def envelope(**headers: Any) -> str:
    """A kombu envelope as the SQS body, the way kombu 5.5 sends it (base64)."""
    message = {"body": "W10=", "headers": {"task": "t", "id": "42", **headers}, "properties": {}}
    return base64.b64encode(json.dumps(message).encode()).decode()


def due(eta: float | None, expires: float | None = None) -> Due:
    return Due("42", "t", eta, expires)


def test_an_eta_written_by_celery_is_read_from_its_own_message() -> None:
    app = Celery(broker="memory://", set_as_current=False)
    message = app.amqp.as_task_v2("42", "tasks.add", countdown=3600, expires=7200)
    body = json.dumps({"body": "", "headers": message.headers, "properties": {}})

    read = read_due(body)

    assert read is not None and read.task_id == "42" and read.task_name == "tasks.add"
    assert read.eta is not None and read.expires is not None
    assert read.expires - read.eta == pytest.approx(3600, abs=0.01)


@pytest.mark.parametrize(
    "eta",
    ["2026-11-24T13:00:00+00:00", "2026-11-24T14:00:00+01:00", "2026-11-24T13:00:00Z",
     "2026-11-24T13:00:00"],
    ids=["utc", "offset", "zulu", "naive-as-utc"],
)
def test_eta_with_or_without_an_offset_is_one_instant(eta: str) -> None:
    read = read_due(envelope(eta=eta))

    assert read is not None and read.eta == NOW + 3600


def test_plain_json_bodies_are_read_as_well_as_base64_ones() -> None:
    body = json.dumps({"headers": {"task": "t", "eta": "2026-11-24T13:00:00+00:00"}})

    read = read_due(body)

    assert read is not None and read.eta == NOW + 3600


def test_padded_bodies_are_read_either_way() -> None:
    plain = json.dumps({"headers": {"task": "t", "eta": "2026-11-24T13:00:00+00:00"}})

    for body in ("\n " + plain, " " + envelope(eta="2026-11-24T13:00:00+00:00") + "\n"):
        read = read_due(body)
        assert read is not None and read.eta == NOW + 3600


def test_a_base64_body_is_parsed_once_not_first_tried_as_json(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed parse raises; kombu sends every body in base64 (docs/benchmarks.md)."""
    parsed: list[str] = []
    loads = json.loads

    def counted(text: str) -> Any:
        parsed.append(text)
        return loads(text)

    monkeypatch.setattr(parking_module.json, "loads", counted)

    assert read_due(envelope(eta="2026-11-24T13:00:00+00:00")) is not None
    assert len(parsed) == 1 and parsed[0].startswith("{")


@pytest.mark.parametrize(
    "body",
    [
        "not json at all",
        json.dumps(["a", "list"]),
        base64.b64encode(json.dumps(["a", "list"]).encode()).decode(),
        # Celery's protocol 1: no task header, the ETA sits in the (maybe pickled) body.
        json.dumps({"body": "...", "headers": {}, "properties": {}}),
        envelope(eta="next tuesday"),
        envelope(eta=1234),
    ],
    ids=["text", "list", "base64-list", "protocol-1", "bad-eta", "eta-not-a-string"],
)
def test_what_is_not_a_readable_protocol_2_task_is_delivered_as_before(body: str) -> None:
    assert POLICY.hide_for(read_due(body), NOW) is None


def test_no_eta_or_one_within_the_threshold_is_delivered() -> None:
    assert POLICY.hide_for(read_due(envelope()), NOW) is None
    assert POLICY.hide_for(due(None), NOW) is None
    assert POLICY.hide_for(due(NOW + 900), NOW) is None
    assert POLICY.hide_for(due(NOW - 5), NOW) is None


def test_an_eta_beyond_the_threshold_comes_back_the_lead_before_it() -> None:
    assert POLICY.hide_for(due(NOW + 901), NOW) == 901 - RETURN_LEAD
    assert POLICY.hide_for(due(NOW + 3600), NOW) == 3600 - RETURN_LEAD


def test_a_far_eta_is_hidden_for_the_longest_hide_and_parked_again() -> None:
    eta = NOW + 3 * 86_400
    now = NOW
    hops = []
    while (hide := POLICY.hide_for(due(eta), now)) is not None:
        hops.append(hide)
        now += hide
    # The sixth hop is cut short so that the rest (901 s) is parked again, not held.
    assert hops == [43_140] * 5 + [42_599, 891]
    assert now == eta - RETURN_LEAD


def test_the_lead_is_at_most_half_a_small_threshold() -> None:
    policy = ParkingPolicy(threshold=6, longest_hide=10)

    assert policy.lead == 3
    assert policy.hide_for(due(NOW + 7), NOW) == 4
    assert policy.hide_for(due(NOW + 60), NOW) == 10
    # Back at 3 s before the ETA: within the threshold, delivered.
    assert policy.hide_for(due(NOW + 3), NOW) is None


def test_a_hide_is_whole_seconds_and_at_least_one() -> None:
    policy = ParkingPolicy(threshold=2, longest_hide=10)

    assert policy.hide_for(due(NOW + 2.2), NOW) == 1
    assert POLICY.hide_for(due(NOW + 1000.9), NOW) == 990


def test_a_task_expiring_before_its_eta_comes_back_just_after_it_expires() -> None:
    hide = POLICY.hide_for(due(NOW + 7200, expires=NOW + 3600), NOW)

    assert hide == 3601
    # Back after the expiry: delivered, so that Celery discards it.
    assert POLICY.hide_for(due(NOW + 7200, expires=NOW + 3600), NOW + 3601) is None


def test_an_expiry_after_the_eta_changes_nothing() -> None:
    assert POLICY.hide_for(due(NOW + 3600, expires=NOW + 7200), NOW) == 3590


def test_an_eta_in_the_past_after_a_long_park_is_delivered() -> None:
    late = datetime.fromtimestamp(NOW, timezone.utc) - timedelta(hours=1)

    assert POLICY.hide_for(read_due(envelope(eta=late.isoformat())), NOW) is None


def test_a_first_receive_is_hidden_not_copied() -> None:
    assert POLICY.fresh_copy_delay(due(NOW + 3600), 3580, 1, NOW) is None


def test_a_task_back_from_a_park_is_copied_at_most_15_minutes_ahead() -> None:
    assert POLICY.fresh_copy_delay(due(NOW + 86_400), 43_140, 2, NOW) == 900
    assert POLICY.fresh_copy_delay(due(NOW + 1000), 990, 5, NOW) == 900
    assert POLICY.fresh_copy_delay(due(NOW + 600), 580, 2, NOW) == 580


def test_a_task_back_before_its_eta_is_delivered_as_a_copy_due_at_the_eta() -> None:
    # Within the threshold: no park, but a copy that SQS first shows at the ETA.
    assert POLICY.fresh_copy_delay(due(NOW + 9.2), None, 2, NOW) == 10


@pytest.mark.parametrize(
    "back",
    [due(None), due(NOW + 0.5), due(NOW - 10), due(NOW + 9, expires=NOW - 1)],
    ids=["no-eta", "due-now", "overdue", "expired"],
)
def test_a_task_back_and_due_or_expired_is_delivered_as_it_is(back: Due) -> None:
    assert POLICY.fresh_copy_delay(back, POLICY.hide_for(back, NOW), 3, NOW) is None
    assert POLICY.fresh_copy_delay(None, None, 3, NOW) is None


def test_a_hide_that_may_wait_to_be_sent_is_reckoned_from_then() -> None:
    assert POLICY.hide_for(due(NOW + 3600), NOW, sent_within=15) == 3575
    # The decision is the receive's: an ETA just beyond the threshold is still parked.
    assert POLICY.hide_for(due(NOW + 901), NOW, sent_within=15) == 876


# --- a fresh copy's message attributes ----------------------------------------------------

POINTER = S3Pointer("tasks", "k-1").body()


def test_a_copy_of_a_body_not_read_from_s3_has_no_attributes() -> None:
    assert copy_attributes("body", "body", {}) == {}


def test_a_copy_of_a_body_read_from_s3_is_marked_with_the_objects_size() -> None:
    """Issue 31, item 8: a receive asks for no message attributes unless told, so the
    mark is rebuilt from the object, which holds the body the sender measured."""
    attributes = copy_attributes(POINTER, "é" * 10, {})

    assert attributes == {SIZE_ATTRIBUTE: {"DataType": "Number", "StringValue": "20"}}


@pytest.mark.parametrize("name", [SIZE_ATTRIBUTE, LEGACY_SIZE_ATTRIBUTE])
def test_a_copy_keeps_the_mark_the_sender_wrote_and_no_other_attribute(name: str) -> None:
    received = {
        name: {"DataType": "Number", "StringValue": "300000", "StringListValues": []},
        "tenant": {"DataType": "String", "StringValue": "acme"},
    }

    attributes = copy_attributes(POINTER, "the body", received)

    assert attributes == {name: {"DataType": "Number", "StringValue": "300000"}}
