"""Which pools run their tasks on the event loop's thread: the solo pool, as a class, by
name, or built on, and none of the others."""

from __future__ import annotations

import pytest
from celery import signals
from celery.concurrency.prefork import TaskPool as PreforkPool
from celery.concurrency.solo import TaskPool as SoloPool
from celery.concurrency.thread import TaskPool as ThreadsPool

from celery_sqs_heartbeat import process
from celery_sqs_heartbeat.startup.solo_loop import runs_tasks_on_the_loop


class InlinePool(SoloPool):
    """A pool of a user's, built on the solo pool."""


class StartingWorker:
    """What ``worker_init`` is sent with: a worker whose pool is named, not yet resolved."""

    def __init__(self, pool_cls: str) -> None:
        self.pool_cls = pool_cls


@pytest.mark.parametrize("pool", [SoloPool, "solo", InlinePool])
def test_the_solo_pool_runs_tasks_on_the_loop(pool: object) -> None:
    assert runs_tasks_on_the_loop(pool)


@pytest.mark.parametrize("pool", [PreforkPool, "prefork", ThreadsPool, "threads", "gevent"])
def test_the_other_pools_do_not(pool: object) -> None:
    assert not runs_tasks_on_the_loop(pool)


def test_a_pool_that_cannot_be_found_is_not_taken_for_solo() -> None:
    assert not runs_tasks_on_the_loop("no.such.module:Pool")


@pytest.mark.parametrize(("pool", "expected"), [("solo", True), ("prefork", False)])
def test_worker_init_notes_the_pool_in_the_process_state(
    monkeypatch: pytest.MonkeyPatch, pool: str, expected: bool
) -> None:
    monkeypatch.setattr(process, "_state", None)

    signals.worker_init.send(sender=StartingWorker(pool))

    assert process.this_process().tasks_run_on_the_loop is expected
