"""Shared fakes for the unit tests: a hand-driven clock, a scriptable queue, signal taps."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import botocore.session
import pytest
from botocore.client import BaseClient

from celery_sqs_heartbeat import process, signals
from celery_sqs_heartbeat.leasing import manager as manager_module
from celery_sqs_heartbeat.leasing.leases import EntryResult, Lease, LeasePolicy
from celery_sqs_heartbeat.startup import checks as startup_checks

#: The policy most tests use: 30-second leases, due 10 seconds before they run out.
POLICY = LeasePolicy(visibility_timeout=30, threshold=10.0)

#: SQS's refusal of a visibility change that would end more than 12 hours after the receive.
BEYOND_THE_LIMIT = (
    "Value 43200 for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout "
    "for the message is beyond the limit [43200 seconds]"
)
#: SQS's answer, under the same code, for a receipt handle whose receive is over.
EXPIRED_HANDLE = (
    "Value AQEBxxxx for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired."
)


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeQueue:
    """A ``LeaseQueue`` that records every call and answers as scripted.

    ``events`` logs ``("sent", entries)`` when a call starts and ``("returned", entries)``
    when it comes back, so tests can see whether one call happened inside another.
    ``during_call`` runs while a call is on the wire (once, then it is cleared): it models
    an ack or a reject racing a renewal.
    """

    def __init__(self, name: str = "jobs") -> None:
        self.name = name
        self.calls: list[list[tuple[Lease, int]]] = []
        self.events: list[tuple[str, list[tuple[Lease, int]]]] = []
        self.default: tuple[EntryResult, str] = (EntryResult.OK, "")
        self.answers: dict[Lease, tuple[EntryResult, str]] = {}
        self.error: BaseException | None = None
        self.during_call: Callable[[list[tuple[Lease, int]]], None] | None = None
        #: Deletes, recorded and answered apart from visibility changes.
        self.deletes: list[list[Lease]] = []
        self.delete_default: tuple[EntryResult, str] = (EntryResult.OK, "")
        self.delete_answers: dict[Lease, tuple[EntryResult, str]] = {}

    def __repr__(self) -> str:
        return f"<FakeQueue {self.name}>"

    def answer(self, lease: Lease, result: EntryResult, reason: str = "") -> None:
        self.answers[lease] = (result, reason)

    def answer_all(self, result: EntryResult, reason: str = "") -> None:
        self.answers.clear()
        self.default = (result, reason)

    def change_visibility(
        self, entries: Sequence[tuple[Lease, int]]
    ) -> Mapping[Lease, tuple[EntryResult, str]]:
        entries = list(entries)
        self.calls.append(entries)
        self.events.append(("sent", entries))
        if self.during_call is not None:
            during, self.during_call = self.during_call, None
            during(entries)
        self.events.append(("returned", entries))
        if self.error is not None:
            raise self.error
        return {lease: self.answers.get(lease, self.default) for lease, _ in entries}

    def delete(self, leases: Sequence[Lease]) -> Mapping[Lease, tuple[EntryResult, str]]:
        self.deletes.append(list(leases))
        return {lease: self.delete_answers.get(lease, self.delete_default) for lease in leases}


def make_lease(
    queue: Any,
    received_at: float = 0.0,
    policy: LeasePolicy = POLICY,
    task_id: str = "id-1",
    task_name: str = "tasks.crunch",
    receipt_handle: str | None = None,
) -> Lease:
    return Lease(
        receipt_handle=receipt_handle or f"rh-{task_id}",
        queue=queue,
        policy=policy,
        received_at=received_at,
        task_id=task_id,
        task_name=task_name,
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def queue() -> FakeQueue:
    return FakeQueue()


@pytest.fixture
def manager(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> manager_module.VisibilityExtensionManager:
    """A manager driven by ``check()`` and the fake clock: ``track()`` starts no thread."""
    instance = manager_module.VisibilityExtensionManager(clock=clock)
    monkeypatch.setattr(instance, "_ensure_thread", lambda: None)
    return instance


@pytest.fixture
def process_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[process.ProcessState]:
    """A state of the test's own as ``this_process()``'s, so that nothing one test leaves
    (objects to delete, counters, a manager) is another's; the process's own comes back
    after. A manager made meanwhile is stopped, its thread with it."""
    state = process.ProcessState()
    monkeypatch.setattr(process, "_state", state)
    yield state
    if state._manager is not None:
        state._manager.stop(0)


def _tap(signal: Any) -> Iterator[list[dict[str, Any]]]:
    received: list[dict[str, Any]] = []

    def receiver(sender: Any = None, **kwargs: Any) -> None:
        kwargs.pop("signal", None)
        received.append({"sender": sender, **kwargs})

    signal.connect(receiver, weak=False)
    try:
        yield received
    finally:
        signal.disconnect(receiver)


@pytest.fixture
def renewed() -> Iterator[list[dict[str, Any]]]:
    """Every ``lease_renewed`` signal sent during the test, as keyword arguments."""
    yield from _tap(signals.lease_renewed)


@pytest.fixture
def lost() -> Iterator[list[dict[str, Any]]]:
    yield from _tap(signals.lease_lost)


@pytest.fixture
def released() -> Iterator[list[dict[str, Any]]]:
    yield from _tap(signals.lease_released)


@pytest.fixture(scope="module")
def source() -> BaseClient:
    """A kombu-like SQS client to derive the package's clients from; one a module, since
    making a client is slow. Its calls go to a botocore ``Stubber``, never the network."""
    return botocore.session.Session().create_client(
        "sqs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )


@pytest.fixture
def nowhere(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No AWS credentials anywhere botocore looks, and no instance metadata to ask."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    empty = tmp_path / "empty"
    empty.write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(empty))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setattr(startup_checks, "_found_keys", set())
    return empty


class PreforkPool:
    """A pool whose ``flush()`` drops what no child accepted, as Celery's prefork does."""

    def flush(self) -> None:
        pass


class Consumer:
    """What Celery's ``task_received`` is sent by: the consumer, with its pool."""

    pool = PreforkPool()


class Settle:
    """A request's ``on_ack`` or ``on_reject``: a promise, ready once Celery called it."""

    def __init__(self, ready: bool) -> None:
        self.ready = ready
