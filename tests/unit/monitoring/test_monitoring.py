"""The pure pieces of monitoring over SQS: topic routing, the option, the start-up line."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from kombu.transport.virtual.exchange import TopicExchange

from celery_sqs_heartbeat.compat import KOMBU_BROADCASTS_THROUGH_SNS
from celery_sqs_heartbeat.monitoring.event_fanout import EventFanout, events_through_sns, wanted
from celery_sqs_heartbeat.options import InvalidTransportOption
from celery_sqs_heartbeat.queues.cleanup import is_single_use
from celery_sqs_heartbeat.startup.remote_control_notice import notice


def binding(key: str, queue: str) -> tuple[str, str, str]:
    """A row of kombu's exchange table, as its topic exchange makes it."""
    return key, TopicExchange(None).key_to_pattern(key), queue


@pytest.mark.parametrize(
    ("key", "routing_key", "expected"),
    [
        ("#", "worker.heartbeat", True),
        ("task.#", "task.succeeded", True),
        ("task.#", "worker.heartbeat", False),
        ("*.heartbeat", "worker.heartbeat", True),
        ("*.heartbeat", "task.succeeded", False),
        ("task.succeeded", "task.succeeded", True),
        ("task.succeeded", "task.started", False),
    ],
)
def test_an_event_reaches_a_queue_whose_binding_pattern_matches_it(
    key: str, routing_key: str, expected: bool
) -> None:
    assert wanted([binding(key, "mine")], "mine", routing_key) is expected


def test_any_of_a_queues_bindings_may_match_and_other_queues_bindings_do_not_count() -> None:
    table = [binding("task.#", "mine"), binding("worker.#", "mine"), binding("#", "other")]

    assert wanted(table, "mine", "worker.online")
    assert not wanted(table, "mine", "custom.thing")


def test_a_queue_this_process_never_bound_gets_everything() -> None:
    assert wanted([binding("task.#", "other")], "mine", "worker.heartbeat")


def test_events_through_sns_is_off_unless_asked() -> None:
    assert events_through_sns({}) is False
    assert events_through_sns({"supports_fanout": True, "events_through_sns": True}) is True


def test_events_through_sns_without_supports_fanout_stops_with_both_names() -> None:
    with pytest.raises(InvalidTransportOption, match="events_through_sns=True: needs supports_fan"):
        events_through_sns({"events_through_sns": True})


def test_events_through_sns_must_be_a_boolean() -> None:
    with pytest.raises(InvalidTransportOption, match="events_through_sns='yes': must be True"):
        events_through_sns({"supports_fanout": True, "events_through_sns": "yes"})


def test_a_worker_without_remote_control_is_told_how_to_turn_it_on() -> None:
    line = notice(False, False, True, "5.7.0")

    assert line is not None
    assert "inspect, celery control and events" in line
    assert "supports_fanout=True and events_through_sns=True" in line


def test_on_a_kombu_without_sns_the_line_names_the_version_needed() -> None:
    line = notice(True, True, False, "5.5.4")

    assert line is not None
    assert "kombu 5.7 or later (this is 5.5.4)" in line


def test_remote_control_on_and_events_off_names_the_events_option() -> None:
    line = notice(True, False, True, "5.7.0")

    assert line is not None
    assert line.startswith("Events are off on SQS")
    assert "events_through_sns=True" in line


def test_with_both_on_nothing_is_said() -> None:
    assert notice(True, True, True, "5.7.0") is None


#: A receiver's queue as Celery names it: the prefix, then a fresh UUID.
MONITOR_QUEUE = "celeryev.0f6bd6e2-3c3b-4d4c-9c51-2a9b1a7e3c10"


def test_only_an_event_monitors_queue_is_single_use() -> None:
    assert is_single_use(MONITOR_QUEUE, ["celeryev"])
    assert not is_single_use("w1@host.celery.pidbox", ["celery.pidbox"])
    assert not is_single_use(f"{MONITOR_QUEUE[9:]}.reply.celery.pidbox", ["reply.celery.pidbox"])
    assert not is_single_use(MONITOR_QUEUE, [])


def test_an_event_queue_named_by_its_receivers_node_id_is_not_single_use() -> None:
    """``Receiver(node_id=...)`` names the queue alike in every process that passes it."""
    assert not is_single_use("celeryev.dashboard", ["celeryev"])


def test_an_event_the_queues_binding_does_not_match_is_acked_and_not_delivered() -> None:
    """The event fanout on its own: a fake channel port routing ``celeryev`` through SNS."""
    if not KOMBU_BROADCASTS_THROUGH_SNS:
        pytest.skip("kombu 5.7's SNS fanout carries the events")
    port = SimpleNamespace(
        transport_options={"supports_fanout": True, "events_through_sns": True},
        state=SimpleNamespace(exchanges={"celeryev": {"type": "topic"}}),
        get_table=lambda exchange: [("worker.#", r"^worker\..*", "monitor")],
    )
    delivered: list[str] = []
    acked: list[str] = []

    def event(routing_key: str) -> Any:
        info = {"exchange": "celeryev", "routing_key": routing_key}
        return SimpleNamespace(delivery_info=info, ack=lambda: acked.append(routing_key))

    callback = EventFanout(port).consumer_callback(  # type: ignore[arg-type]
        "monitor", False, lambda message: delivered.append(message.delivery_info["routing_key"])
    )
    callback(event("task.succeeded"))
    callback(event("worker.heartbeat"))

    assert delivered == ["worker.heartbeat"] and acked == ["task.succeeded"]
