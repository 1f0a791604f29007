"""What a process removes at its exit, and what it leaves to others."""

from __future__ import annotations

import gc
import logging
import os

import pytest
from celery import signals

from celery_sqs_heartbeat.process import ProcessState
from celery_sqs_heartbeat.queues.exit_cleanup import Leftovers, delete_reply_queues

PARENT, CHILD = 100, 101


class Channel:
    def __init__(self) -> None:
        self.removals = 0

    def remove_queues_still_consumed(self) -> None:
        self.removals += 1


def test_at_exit_a_process_removes_its_reply_queues_and_its_channels_queues() -> None:
    leftovers, deleted, channel = Leftovers(), [], Channel()
    leftovers.add_channel(channel, PARENT)
    leftovers.reply_queues.used("url-a", lambda: deleted.append("url-a"), PARENT, now=0.0)

    leftovers.remove(PARENT)
    leftovers.remove(PARENT)

    assert deleted == ["url-a"]
    assert channel.removals == 2  # a channel's own removal forgets what it removed


def test_a_forked_child_leaves_its_parents_queues_alone() -> None:
    leftovers, deleted, channel = Leftovers(), [], Channel()
    leftovers.add_channel(channel, PARENT)
    leftovers.reply_queues.used("url-a", lambda: deleted.append("url-a"), PARENT, now=0.0)

    leftovers.remove(CHILD)

    assert deleted == []
    assert channel.removals == 0


def test_a_failed_delete_is_logged_and_the_others_still_go(
    caplog: pytest.LogCaptureFixture,
) -> None:
    deleted: list[str] = []

    def refused() -> None:
        raise ConnectionError("no network")

    with caplog.at_level(logging.WARNING):
        delete_reply_queues({"url-a": refused, "url-b": lambda: deleted.append("url-b")})

    assert deleted == ["url-b"]
    assert "Could not delete the reply queue url-a" in caplog.text


def test_a_channel_gone_before_the_exit_is_forgotten() -> None:
    leftovers = Leftovers()
    leftovers.add_channel(Channel(), PARENT)
    gc.collect()

    leftovers.remove(PARENT)  # nothing to call, nothing raised


def test_a_channel_that_fails_its_removal_is_logged_and_the_others_still_remove(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(Channel):
        def remove_queues_still_consumed(self) -> None:
            raise AttributeError("closed")

    leftovers, broken, channel = Leftovers(), Broken(), Channel()
    leftovers.add_channel(broken, PARENT)
    leftovers.add_channel(channel, PARENT)
    with caplog.at_level(logging.WARNING):
        leftovers.remove(PARENT)

    assert channel.removals == 1
    assert "Could not remove the queues" in caplog.text


def test_a_pool_child_removes_its_reply_queues_as_it_leaves(process_state: ProcessState) -> None:
    """billiard ends a pool child with ``os._exit``, which runs no exit handler; Celery
    sends ``worker_process_shutdown`` in the child just before."""
    deleted: list[str] = []
    leftovers = process_state.leftovers
    leftovers.reply_queues.used("url-child", lambda: deleted.append("url-child"), os.getpid(), 0.0)
    try:
        signals.worker_process_shutdown.send(sender="w1@host", pid=os.getpid(), exitcode=0)
    finally:
        leftovers.reply_queues.take_all(os.getpid())

    assert deleted == ["url-child"]
