"""The faults a test can ask the strict SQS server for, and how it asks.

A test asks over HTTP, with a JSON body. Every field is checked here, so that a typo in
a test is refused with a 400 at once instead of leaving a fault that never fires.

Faults come in five shapes, so that scenarios can simulate both blips and outages:

* a counted fault (``inject_fault``): the next N calls of one action fail (or are
  delayed);
* an outage: every call of some or all actions fails for N seconds of the server's
  monotonic clock (``end_outages`` ends them early);
* a failure fraction (``fail_fraction``): each call of some or all actions fails with
  probability p, from an optionally seeded generator so that a run can be repeated;
* a latency (``add_latency``): every call of some or all actions is answered that much
  later;
* entry faults (``fail_entries``): the next entries of DeleteMessageBatch,
  ChangeMessageVisibilityBatch or SendMessageBatch calls fail one by one with an error
  code, the rest of each call going through.

S3 calls through the same server (``s3:GetObject``, ``s3:PutObject``, ...) take every
shape but entry faults, answered in S3's XML: throttle as 503 ``SlowDown``,
invalid_credentials as 403 ``InvalidAccessKeyId``, the others with SQS's code.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, get_args

from .s3_protocol import is_s3_action

FaultKind = Literal[
    "throttle",
    "server_error",
    "drop_connection",
    "delay",
    "access_denied",
    "invalid_credentials",
    "garbage",
    "timeout",
]
FAULT_KINDS: tuple[FaultKind, ...] = get_args(FaultKind)
"""How a faulted call is answered; ``seconds`` is the fault's own duration (the
``seconds`` of ``inject_fault``, the ``fault_seconds`` of an outage or a fraction).

throttle: HTTP 400 ``ThrottlingException`` (query protocol: ``Throttling``).
server_error: HTTP 500 ``InternalError``.
drop_connection: the socket is closed without an answer.
delay: the call is served normally, ``seconds`` late.
access_denied: HTTP 403 ``AccessDenied``, as SQS answers an IAM denial.
invalid_credentials: HTTP 403 ``InvalidClientTokenId``, as for an unknown access key.
garbage: HTTP 200 with a body that is neither JSON nor XML, nor even UTF-8, because
botocore reads JSON text it cannot parse as an empty answer. botocore then raises
``UnicodeDecodeError`` (JSON protocol) or ``ResponseParserError`` (query protocol); over
JSON it never reads the body of an answer without fields (e.g. DeleteMessage), so there
the fault looks like success, as it would on the wire.
timeout: the call is held ``seconds`` and then dropped without an answer, which a
client whose read timeout is shorter sees as a read timeout.

None of them reaches moto, except delay.
"""

BATCH_ACTIONS_WITH_ENTRY_FAULTS = (
    "DeleteMessageBatch",
    "ChangeMessageVisibilityBatch",
    "SendMessageBatch",
)
"""SQS answers these entry by entry, so only they can fail part of a call."""


class Failure(NamedTuple):
    kind: FaultKind
    seconds: float


@dataclass
class CountedFault:
    failure: Failure
    remaining: int

    def describe(self, action: str) -> dict[str, Any]:
        return {
            "type": "count",
            "action": action,
            "kind": self.failure.kind,
            "count": self.remaining,
            "seconds": self.failure.seconds,
        }


@dataclass
class EntryFault:
    code: str
    remaining: int

    def describe(self, action: str) -> dict[str, Any]:
        return {"type": "entries", "action": action, "code": self.code, "count": self.remaining}


@dataclass(frozen=True)
class Outage:
    actions: frozenset[str] | None
    failure: Failure
    until: float
    """Monotonic, so that a step of the wall clock neither ends nor stretches an outage."""

    def describe(self, now: float) -> dict[str, Any]:
        return {
            "type": "outage",
            "actions": _describe_actions(self.actions),
            "kind": self.failure.kind,
            "fault_seconds": self.failure.seconds,
            "remaining_seconds": self.until - now,
        }


@dataclass(frozen=True)
class FailureFraction:
    actions: frozenset[str] | None
    failure: Failure
    probability: float
    seed: int | None
    rng: random.Random

    def describe(self) -> dict[str, Any]:
        return {
            "type": "fraction",
            "actions": _describe_actions(self.actions),
            "kind": self.failure.kind,
            "fault_seconds": self.failure.seconds,
            "probability": self.probability,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class Latency:
    actions: frozenset[str] | None
    seconds: float

    def describe(self) -> dict[str, Any]:
        return {
            "type": "latency",
            "actions": _describe_actions(self.actions),
            "seconds": self.seconds,
        }


def applies(actions: frozenset[str] | None, action: str) -> bool:
    """``None`` stands for every SQS action, so that an outage needs no list of them.

    S3's actions (``s3:GetObject``) are hit only where a test names them: an SQS outage
    is not an S3 outage.
    """
    if actions is None:
        return not is_s3_action(action)
    return action in actions


def _describe_actions(actions: frozenset[str] | None) -> list[str] | None:
    return None if actions is None else sorted(actions)


def parse_fault(body: bytes) -> tuple[str, CountedFault]:
    payload = _json_object(body)
    action = payload.get("action")
    if not isinstance(action, str) or not action:
        raise ValueError(
            "'action' must be an SQS action name, e.g. ChangeMessageVisibility, or an S3 "
            "one, e.g. s3:GetObject"
        )
    failure = _parse_failure(payload, "seconds")
    return action, CountedFault(failure, _count(payload))


def parse_entry_fault(body: bytes) -> tuple[str, EntryFault]:
    payload = _json_object(body)
    action, code = payload.get("action"), payload.get("code")
    if action not in BATCH_ACTIONS_WITH_ENTRY_FAULTS:
        raise ValueError(f"'action' must be one of {', '.join(BATCH_ACTIONS_WITH_ENTRY_FAULTS)}")
    if not isinstance(code, str) or not code:
        raise ValueError("'code' must be an SQS error code, e.g. InternalError")
    return action, EntryFault(code, _count(payload))


def parse_outage(body: bytes) -> Outage:
    payload = _json_object(body)
    seconds = _number(payload, "seconds", 0, positive=True)
    return Outage(
        _parse_actions(payload),
        _parse_failure(payload, "fault_seconds"),
        time.monotonic() + seconds,
    )


def parse_fraction(body: bytes) -> FailureFraction:
    payload = _json_object(body)
    probability = payload.get("probability")
    if (
        isinstance(probability, bool)
        or not isinstance(probability, (int, float))
        or not 0 <= probability <= 1
    ):
        raise ValueError("'probability' must be a number from 0 to 1")
    seed = payload.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError("'seed' must be null or an integer")
    return FailureFraction(
        _parse_actions(payload),
        _parse_failure(payload, "fault_seconds"),
        float(probability),
        seed,
        random.Random(seed),
    )


def parse_latency(body: bytes) -> Latency:
    payload = _json_object(body)
    return Latency(_parse_actions(payload), _number(payload, "seconds", 0, positive=True))


def _json_object(body: bytes) -> dict[str, Any]:
    payload = json.loads(body or b"null")
    if not isinstance(payload, dict):
        raise ValueError("expected a JSON object")
    return payload


def _count(payload: dict[str, Any]) -> int:
    count = payload.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError("'count' must be a positive integer")
    return count


def _number(payload: dict[str, Any], key: str, default: float, *, positive: bool) -> float:
    value = payload.get(key, default)
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        raise ValueError(f"'{key}' must be a {'positive' if positive else 'non-negative'} number")
    return float(value)


def _parse_failure(payload: dict[str, Any], seconds_key: str) -> Failure:
    kind = payload.get("kind")
    if kind not in FAULT_KINDS:
        raise ValueError(f"'kind' must be one of {', '.join(FAULT_KINDS)}")
    seconds = _number(payload, seconds_key, 0, positive=False)
    if kind in ("delay", "timeout") and seconds <= 0:
        raise ValueError(f"a '{kind}' fault needs '{seconds_key}' > 0")
    return Failure(kind, seconds)


def _parse_actions(payload: dict[str, Any]) -> frozenset[str] | None:
    """An empty list is refused: a rule that matches no call is surely a mistake."""
    actions = payload.get("actions")
    if actions is None:
        return None
    if (
        not isinstance(actions, list)
        or not actions
        or not all(isinstance(action, str) and action for action in actions)
    ):
        raise ValueError("'actions' must be null (every action) or a list of SQS action names")
    return frozenset(actions)
