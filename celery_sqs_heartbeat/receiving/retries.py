"""Failed receives: which ones retrying can fix, and when to ask SQS again. Pure, no I/O.

A worker that stops on the first failed ``ReceiveMessage`` turns a two-second blip of
SQS or of the network into an outage that lasts until someone restarts it. So every
failure that retrying can fix is retried with capped exponential backoff; only answers
that say the worker is misconfigured (denied, unknown credentials, no such queue) stop
it, because retrying those would only hide the mistake.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from botocore.exceptions import ClientError

from ..aws.sqs_facts import FATAL_CODES, QUEUE_MISSING_CODES, canonical_code, error_code
from ..compat import DoesNotExistQueueException, UndefinedQueueException

__all__ = [
    "NO_ANSWER",
    "ReceiveBackoff",
    "ReceiveFailure",
    "Recovery",
    "classify_receive_error",
    "ends_worker",
]

#: The first retry waits about this long; each failure in a row doubles it.
RECEIVE_RETRY_BASE = 0.25
#: The longest wait between two receives of a failing queue. Small on purpose: the
#: promise is that consuming resumes within a couple of seconds of SQS coming back,
#: and one receive per queue every couple of seconds is less than an idle worker's
#: long polls cost anyway.
RECEIVE_RETRY_CAP = 2.0

# kombu's asynchronous client reports an SQS error answer as a bare Exception whose text
# holds the HTTP status and the body; the code is in the body, in either protocol.
_HTTP_STATUS = re.compile(r"HTTP (\d{3})")
_QUERY_CODE = re.compile(r"<Code>([^<]+)</Code>")
_JSON_CODE = re.compile(r"""["']__type["']\s*:\s*["']([^"']+)["']""")
_QUERY_MESSAGE = re.compile(r"<Message>([^<]+)</Message>")
_JSON_MESSAGE = re.compile(r"""["'][Mm]essage["']\s*:\s*["']([^"']+)["']""")


@dataclass(frozen=True)
class ReceiveFailure:
    """One failed receive, reduced to what decides the worker's next step."""

    code: str
    detail: str
    fatal: bool

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}" if self.detail else self.code

    @property
    def queue_missing(self) -> bool:
        return canonical_code(self.code) in QUEUE_MISSING_CODES or self.code == "UndefinedQueue"


#: What kombu's asynchronous client answers a 5xx, a timeout or a dropped connection
#: with: an empty list instead of an answer, and no detail of which it was.
NO_ANSWER = ReceiveFailure("NoAnswer", "server error, timeout or dropped connection", False)


def classify_receive_error(error: BaseException) -> ReceiveFailure:
    """What an exception raised while receiving means for the worker."""
    if isinstance(error, ClientError):
        details = error.response.get("Error", {})
        code = error_code(details.get("Code"))
        return ReceiveFailure(code, str(details.get("Message") or ""), _fatal(code))
    queue_missing = _kombu_queue_missing_code(error)
    if queue_missing:
        return ReceiveFailure(queue_missing, str(error), fatal=True)
    text = str(error)
    status = _HTTP_STATUS.search(text)
    if status:
        found = _QUERY_CODE.search(text) or _JSON_CODE.search(text)
        code = error_code(found.group(1)) if found else f"HTTP {status.group(1)}"
        said = _QUERY_MESSAGE.search(text) or _JSON_MESSAGE.search(text)
        detail = said.group(1) if said else f"HTTP {status.group(1)}"
        return ReceiveFailure(code, detail, _fatal(code))
    return ReceiveFailure(type(error).__name__, text, fatal=False)


#: Remote control's queues, as SQS names them (kombu turns "." into "-"): a worker's
#: broadcast queue ``<node>.<namespace>.pidbox`` and a client's reply queue
#: ``<id>.reply.<namespace>.pidbox`` (kombu's ``Mailbox``).
_REMOTE_CONTROL_QUEUE = re.compile(r".+-pidbox(\.fifo)?")


def ends_worker(failure: ReceiveFailure, queue_name: str) -> bool:
    """Whether a failed receive from ``queue_name`` must stop the worker.

    A fatal answer does, for a task queue: the worker is misconfigured (a queue that is
    not there, or is not its to read), and retrying would only hide it. A remote-control
    queue that is missing does not: Celery and kombu create those and delete them
    themselves (a reply queue once the answers are in, a broadcast queue when its worker
    stops, expiry), so a receive that was on its way then is no misconfiguration. The
    channel stops receiving from that queue instead, and the worker goes on.
    """
    if not failure.fatal:
        return False
    return not (failure.queue_missing and _REMOTE_CONTROL_QUEUE.fullmatch(queue_name))


def _fatal(code: str) -> bool:
    return canonical_code(code) in FATAL_CODES


def _kombu_queue_missing_code(error: BaseException) -> str | None:
    # kombu raises these itself when it cannot find a queue's URL.
    if isinstance(error, DoesNotExistQueueException):
        return "QueueDoesNotExist"
    if isinstance(error, UndefinedQueueException):
        return "UndefinedQueue"
    return None


@dataclass
class _Streak:
    failures: int
    started_at: float
    retry_at: float


@dataclass(frozen=True)
class Recovery:
    """A streak of failures that has just ended, for the one log line saying so."""

    failures: int
    seconds: float


class ReceiveBackoff:
    """Per queue: when the next receive may go out after failures in a row.

    Equal jitter (half the delay fixed, half random) rather than full jitter: a retry
    never comes almost at once, which would turn an outage into a busy loop, and
    workers that failed together still spread out.
    """

    def __init__(
        self,
        base: float = RECEIVE_RETRY_BASE,
        cap: float = RECEIVE_RETRY_CAP,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.base = base
        self.cap = cap
        self._jitter = jitter
        self._streaks: dict[str, _Streak] = {}

    def failed(self, queue: str, now: float) -> bool:
        """Note a failed receive; True if it starts a streak (the one to log)."""
        streak = self._streaks.get(queue)
        first = streak is None
        if streak is None:
            streak = self._streaks[queue] = _Streak(0, now, now)
        streak.failures += 1
        delay = min(self.cap, self.base * 2 ** (streak.failures - 1))
        streak.retry_at = now + delay / 2 + self._jitter() * delay / 2
        return first

    def succeeded(self, queue: str, now: float, sent_at: float | None = None) -> Recovery | None:
        """Note a receive that worked; the streak it ends, if any.

        A receive sent before the streak began (one of several in flight on the queue)
        tells nothing of whether SQS works again: it ends no streak.
        """
        streak = self._streaks.get(queue)
        if streak is None or (sent_at is not None and sent_at < streak.started_at):
            return None
        del self._streaks[queue]
        return Recovery(streak.failures, now - streak.started_at)

    def wait(self, queue: str, now: float) -> float:
        """Seconds before the next receive of ``queue`` may go out (0: now)."""
        streak = self._streaks.get(queue)
        return 0.0 if streak is None else max(0.0, streak.retry_at - now)
