"""What the strict SQS server saw, kept for tests to read back.

The counts and the call log show what a client sent and how long it waited, which a
client cannot always tell itself (retries, dropped connections); the event log shows
what became of each message; the refusals show what an IAM policy lacks.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Literal, TypedDict

EventAction = Literal["receive", "change_visibility", "delete"]


class Event(TypedDict):
    """One per-message operation the server saw.

    ``result`` is ``"ok"``, an error code, or ``"stale"`` for a delete with a receipt
    handle from an earlier receive, which SQS answers with success without deleting.
    """

    t: float
    action: EventAction
    message_id: str | None
    queue: str
    visibility: int | None
    result: str


class Call(TypedDict):
    """One SQS call, as the server saw it: when it arrived and when it was answered.

    ``entries`` counts the entries of a batch call; for ReceiveMessage, ``asked`` is its
    MaxNumberOfMessages and ``returned`` how many messages the answer carried; a send's
    ``delays`` are the ``DelaySeconds`` it asked for, one per message. Latency
    and faults are inside the ``arrived``..``answered`` span, as a client sees them.
    """

    action: str
    arrived: float
    answered: float
    entries: int
    asked: int | None
    returned: int | None
    #: A SendMessage's or SendMessageBatch's ``DelaySeconds`` per message (0: none given).
    delays: list[int] | None
    #: The queue the call names by its URL ("" for none).
    queue: str
    #: A ReceiveMessage's ``WaitTimeSeconds``; None when not given (or another action).
    wait: int | None


class Refusal(TypedDict):
    """A call that IAM enforcement refused before the service saw it.

    ``code`` is ``AccessDenied`` (no policy allows it), ``InvalidClientTokenId`` (an
    unknown access key) or ``SignatureDoesNotMatch`` (a wrong secret key). ``action`` is
    the API call as sent, e.g. ``ChangeMessageVisibilityBatch``; an AccessDenied
    ``message`` names the user and the IAM action that was checked.
    """

    t: float
    service: str
    action: str
    access_key_id: str
    code: str
    message: str


@dataclass(frozen=True)
class Receipt:
    """What the server knows about a receipt handle it issued."""

    queue: str
    message_id: str
    received_at: float


class Recorder:
    """The server's records, shared by the request threads and moto's patched backend."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: Counter[str] = Counter()
        self._entries: Counter[str] = Counter()
        self._call_log: list[Call] = []
        self._generation = 0
        self._events: list[Event] = []
        self._receipts: dict[str, Receipt] = {}
        self._refusals: list[Refusal] = []

    def count_call(self, action: str, entries: int) -> int:
        """Count a call as it arrives, and return the generation to log it under.

        A call is logged when it is answered, which a long poll or a timeout fault puts
        seconds later, maybe after :meth:`reset_calls`: it then belongs to none of the
        calls since the reset, which it arrived before, and :meth:`log_call` drops it.
        """
        with self._lock:
            self._calls[action] += 1
            if entries:
                self._entries[action] += entries
            return self._generation

    def log_call(self, call: Call, generation: int) -> None:
        with self._lock:
            if generation == self._generation:
                self._call_log.append(call)

    def reset_calls(self) -> None:
        with self._lock:
            self._calls.clear()
            self._entries.clear()
            self._call_log.clear()
            self._generation += 1

    def calls(self) -> dict[str, dict[str, int]]:
        with self._lock:
            return {"calls": dict(self._calls), "batch_entries": dict(self._entries)}

    def call_log(self) -> list[Call]:
        with self._lock:
            return list(self._call_log)

    def remember_receipt(self, handle: str, receipt: Receipt) -> None:
        with self._lock:
            self._receipts[handle] = receipt

    def receipt(self, handle: str) -> Receipt | None:
        with self._lock:
            return self._receipts.get(handle)

    def log_event(
        self,
        action: EventAction,
        queue_name: str,
        handle: str,
        visibility: int | None,
        result: str,
    ) -> None:
        with self._lock:
            receipt = self._receipts.get(handle)
            self._events.append(
                Event(
                    t=time.time(),
                    action=action,
                    message_id=receipt.message_id if receipt else None,
                    queue=queue_name,
                    visibility=visibility,
                    result=result,
                )
            )

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def clear_events(self) -> None:
        with self._lock:
            self._events.clear()

    def record_refusal(self, refusal: Refusal) -> None:
        with self._lock:
            self._refusals.append(refusal)

    def refusals(self) -> list[Refusal]:
        with self._lock:
            return list(self._refusals)
