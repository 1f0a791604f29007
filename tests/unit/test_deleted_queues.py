"""The strict server's book of queue names deleted within SQS's minute."""

from __future__ import annotations

from celery_sqs_heartbeat.aws.sqs_facts import SQS_QUEUE_NAME_REUSE_SECONDS
from celery_sqs_heartbeat.testing.deleted_queues import RecentlyDeletedNames


def test_a_name_deleted_less_than_a_minute_ago_is_refused_then_accepted() -> None:
    names = RecentlyDeletedNames()
    names.deleted("reply", now=100.0)

    assert names.refuses("reply", now=100.0)
    assert names.refuses("reply", now=100.0 + SQS_QUEUE_NAME_REUSE_SECONDS - 0.5)
    assert not names.refuses("reply", now=100.0 + SQS_QUEUE_NAME_REUSE_SECONDS)


def test_other_names_and_names_never_deleted_are_accepted() -> None:
    names = RecentlyDeletedNames()
    names.deleted("reply", now=100.0)

    assert not names.refuses("other", now=100.0)
    assert not RecentlyDeletedNames().refuses("reply", now=0.0)


def test_a_second_delete_starts_the_minute_again() -> None:
    names = RecentlyDeletedNames(reuse_seconds=60)
    names.deleted("reply", now=0.0)
    names.deleted("reply", now=50.0)

    assert names.refuses("reply", now=100.0)
    assert not names.refuses("reply", now=110.0)
