"""The process's state: made once, afresh in a forked child, its parts made when asked."""

from __future__ import annotations

import logging
import os

import pytest

from celery_sqs_heartbeat import process
from celery_sqs_heartbeat.leasing.manager import EXIT_FLUSH_TIMEOUT
from celery_sqs_heartbeat.process import ProcessState, this_process
from tests.unit.forking import in_child

PROCESS_LOGGER = "celery_sqs_heartbeat.process"


@pytest.fixture
def no_state_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if nothing had asked for its state; the process's own comes back."""
    monkeypatch.setattr(process, "_state", None)


@pytest.mark.usefixtures("no_state_yet")
def test_the_state_is_made_once_per_process() -> None:
    first = this_process()

    assert this_process() is first
    assert first.pid == os.getpid()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
@pytest.mark.usefixtures("no_state_yet")
def test_a_forked_child_has_a_state_of_its_own_and_the_parent_keeps_its() -> None:
    parents = this_process()

    def state_of_its_own() -> bool:
        childs = this_process()
        return childs is not parents and childs.pid == os.getpid() and this_process() is childs

    assert in_child(state_of_its_own) == "ok"
    assert this_process() is parents


def test_the_manager_and_the_publisher_are_made_only_when_asked_for() -> None:
    """A producer never starts the manager's thread, nor a worker the publisher's."""
    state = ProcessState()
    assert (state._manager, state._publisher) == (None, None)

    manager = state.manager
    assert state.manager is manager
    assert state._publisher is None

    publisher = state.publisher
    assert state.publisher is publisher
    assert state.manager is manager
    manager.stop(0)


class Noting:
    """A manager's ``stop`` and the leftovers' ``remove``, noted in one timeline."""

    def __init__(self, left: int = 0) -> None:
        self.timeline: list[str] = []
        self.left = left

    def stop(self, timeout: float) -> int:
        self.timeline.append(f"manager.stop {timeout}")
        return self.left

    def flush(self, timeout: float) -> int:
        self.timeline.append(f"s3_cleanup.flush {timeout}")
        return self.left

    def remove(self, pid: int) -> None:
        self.timeline.append(f"leftovers.remove {pid}")


def test_leave_flushes_the_manager_then_removes_the_leftovers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deletes first: a message acked must not run again, whatever the queues' removal."""
    state, noting = ProcessState(), Noting()
    monkeypatch.setattr(state, "_manager", noting)
    monkeypatch.setattr(state.s3_cleanup, "flush", noting.flush)
    monkeypatch.setattr(state.leftovers, "remove", noting.remove)

    state.leave()

    assert noting.timeline == [
        f"manager.stop {EXIT_FLUSH_TIMEOUT}",
        f"s3_cleanup.flush {EXIT_FLUSH_TIMEOUT}",
        f"leftovers.remove {os.getpid()}",
    ]


def test_leave_without_a_manager_makes_none_and_still_removes_the_leftovers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state, noting = ProcessState(), Noting()
    monkeypatch.setattr(state.s3_cleanup, "flush", noting.flush)
    monkeypatch.setattr(state.leftovers, "remove", noting.remove)

    state.leave()

    assert state._manager is None
    assert noting.timeline == [
        f"s3_cleanup.flush {EXIT_FLUSH_TIMEOUT}",
        f"leftovers.remove {os.getpid()}",
    ]


def test_leave_warns_of_what_the_manager_could_not_send(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    state, noting = ProcessState(), Noting(left=3)
    monkeypatch.setattr(state, "_manager", noting)
    monkeypatch.setattr(state.s3_cleanup, "flush", noting.flush)
    monkeypatch.setattr(state.leftovers, "remove", noting.remove)

    with caplog.at_level(logging.WARNING, logger=PROCESS_LOGGER):
        state.leave()

    deletes, objects = [r.getMessage() for r in caplog.records if r.name == PROCESS_LOGGER]
    assert deletes.startswith("3 SQS delete(s) or release(s) could not be sent")
    assert objects.startswith("3 S3 object(s) of deleted messages could not be deleted")
    assert noting.timeline[-1] == f"leftovers.remove {os.getpid()}"


def test_at_exit_a_state_inherited_from_the_parent_is_not_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child forked without the fork hook (no ``os.register_at_fork``) leaves nothing
    of its parent's: the parent's leases and queues are the parent's."""
    inherited, noting = ProcessState(), Noting()
    inherited.pid = os.getpid() + 1
    monkeypatch.setattr(inherited.leftovers, "remove", noting.remove)
    monkeypatch.setattr(process, "_state", inherited)

    process._leave_at_exit()

    assert noting.timeline == []
