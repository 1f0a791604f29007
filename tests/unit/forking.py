"""Forking in a unit test: the child's answer through its exit status, under an alarm."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any

#: How long the child may take before it counts as hung; a client is made in well under.
CHILD_SECONDS = 5

#: The child's answers, by exit status.
OK, WRONG, RAISED = 0, 1, 2


def in_child(check: Callable[[], bool]) -> str:
    """Run ``check`` in a forked child under an alarm: "ok", "wrong", "raised" or "hung"."""
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status, never back into pytest
        code = RAISED
        try:
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the alarm ends the child
            signal.alarm(CHILD_SECONDS)
            code = OK if check() else WRONG
        except BaseException:
            traceback.print_exc()
            sys.stderr.flush()
        finally:
            os._exit(code)
    return wait_for_child(pid, CHILD_SECONDS)


def wait_for_child(pid: int, alarm_seconds: float) -> str:
    """The forked child's answer: "ok", "wrong", "raised" or "hung".

    A child whose alarm did not end it is ended here, a few seconds after the alarm.
    """
    deadline = time.monotonic() + alarm_seconds + 5
    done, status = os.waitpid(pid, os.WNOHANG)
    while not done:
        if time.monotonic() > deadline:  # the alarm did not end it: end it here
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "hung"
        time.sleep(0.01)
        done, status = os.waitpid(pid, os.WNOHANG)
    code = os.waitstatus_to_exitcode(status)
    answers = {OK: "ok", WRONG: "wrong", RAISED: "raised", -signal.SIGALRM: "hung"}
    return answers.get(code, f"exit status {code}")


@contextlib.contextmanager
def held_by_another_thread(lock: Any) -> Iterator[None]:
    """``lock`` held by a thread of this process for as long as the block runs."""
    taken, done = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            done.wait()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(5)
    try:
        yield
    finally:
        done.set()
        thread.join(5)
