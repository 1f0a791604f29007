"""What Celery's integration harness needs over SQS, loaded into its pytest run (``-p``).

Celery's harness runs its worker in a thread of the test process
(``celery.contrib.testing.worker``), where a deployment runs it in a process of its own.
kombu keeps one event loop per process, not per thread, and its SQS channels adopt that
loop when they are made: so the channels the test itself opens in the main thread (the
reply queue of a ping or an inspect, a producer) were polled on the worker's loop, by
the worker's thread, as if they were the worker's own. When such a reply queue was
deleted under that poll, the worker ended (kombu's stock transport and this one alike).

Here a channel has an event loop only when the worker's own thread uses it: everywhere
else it receives by blocking calls, as ``celery inspect`` does in a process of its own.
The suite runs other clients in threads too: ``test_beat.py`` runs beat's remote control
(a consumer of its own, draining in its own thread), and before this rule covered it,
that consumer's channel took the worker's loop, deleted its no-ack messages through the
worker's HTTP client from beat's thread (``pycurl.error: cannot add/remove handle -
multi_perform() already running``), and the answer of a poll the loop had sent for it
reached a channel beat had closed meanwhile: the worker ended, and every later test
timed out. It is decided on use, not when the channel is made, because kombu's
connection pools are shared by the threads: a channel the worker's thread made may
serve the test next. The transports below are the broker's own with only that changed;
nothing of it reaches users.

This module also registers Celery's pytest fixtures (``celery.contrib.pytest``), which
the suite's conftest imports by name but which only the ``pytest-celery`` package would
otherwise register.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from celery.worker import WorkController
from kombu.transport import SQS

from celery_sqs_heartbeat import transport as heartbeat

pytest_plugins = ["celery.contrib.pytest"]


def _in_the_workers_thread() -> bool:
    """Whether this is the thread Celery's harness runs its worker in.

    The harness starts it as ``Thread(target=worker.start)`` (``celery.contrib.testing.
    worker``), and a thread keeps its target while it runs. A prefork child is not one:
    the fork leaves it only its main thread.
    """
    thread = threading.current_thread()
    if thread is threading.main_thread():
        return False
    target = getattr(thread, "_target", None)
    return isinstance(getattr(target, "__self__", None), WorkController)


class _ClientChannelsWithoutLoop:
    """A channel mixin: used outside the worker's thread, a channel has no event loop."""

    @property
    def hub(self) -> Any:
        if not _in_the_workers_thread():
            return None
        return self.__dict__.get("_hub")

    @hub.setter
    def hub(self, loop: Any) -> None:
        self.__dict__["_hub"] = loop


class HeartbeatChannel(_ClientChannelsWithoutLoop, heartbeat.Channel):
    pass


class HeartbeatTransport(heartbeat.Transport):
    """``celery_sqs_heartbeat:Transport`` as the suite runs it."""

    Channel = HeartbeatChannel


class StockChannel(_ClientChannelsWithoutLoop, SQS.Channel):
    pass


class StockTransport(SQS.Transport):
    """kombu's own SQS transport, for the comparison (``run.py --broker stock``)."""

    Channel = StockChannel


#: Tests that leave a task running for the next test to find. On Redis, test_scheduled ran
#: between test_active and test_query_task, and its wait outlasted test_active's 5-second
#: task; over SQS test_scheduled is deselected (deselected.txt), so test_query_task's task
#: waited behind that one, reserved rather than active, and each of its reruns queued
#: another behind it.
LEAVE_A_TASK_RUNNING = frozenset({"t/integration/test_inspect.py::test_Inspect::test_active"})
#: The longest the wait below waits for the worker to be idle.
IDLE_GUARD = 30.0


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """After a test that leaves a task running, the next starts once the worker is idle."""
    if item.nodeid in LEAVE_A_TASK_RUNNING:
        _wait_until_the_worker_is_idle()


def _wait_until_the_worker_is_idle() -> None:
    """Celery's harness runs the worker in this process: its state is this module's."""
    from celery.worker import state

    deadline = time.monotonic() + IDLE_GUARD
    while (state.active_requests or state.reserved_requests) and time.monotonic() < deadline:
        time.sleep(0.1)
