"""The strict SQS server, seen from the tests: its subprocess, and its control endpoints."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import TYPE_CHECKING, Any

from botocore.config import Config

from . import endpoint
from .app import CONTROL_PREFIX
from .endpoint import HOST
from .process import ServerProcess
from .rules import DEFAULT_MAX_HOLD_SECONDS

if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import TracebackType

    from .faults import FaultKind
    from .recorder import Call, Event, Refusal


class StrictSQSServer:
    """A strict SQS server in a subprocess, and the client of its control endpoints.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. The server
    accepts any credentials until :meth:`enforce_iam`; :attr:`boto3_kwargs` has the ones
    the tests use.
    """

    REGION = "us-east-1"
    ACCESS_KEY = endpoint.ACCESS_KEY

    def __init__(
        self,
        *,
        max_hold_seconds: float = DEFAULT_MAX_HOLD_SECONDS,
        startup_timeout: float = 30.0,
    ) -> None:
        self.max_hold_seconds = max_hold_seconds
        self.startup_timeout = startup_timeout
        self._process = ServerProcess()
        self._port: int | None = None
        # The server only talks to 127.0.0.1, so never go through a configured proxy.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def __enter__(self) -> StrictSQSServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> StrictSQSServer:
        """Start the subprocess and wait until it answers; its stderr is inherited.

        The server also stops by itself when this process dies (its stdin closes).
        """
        if self._process.running:
            raise RuntimeError("the strict SQS server is already running")
        deadline = time.monotonic() + self.startup_timeout
        try:
            self._port = self._process.start(self.max_hold_seconds, deadline)
            self._wait_answers(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_answers(self, deadline: float) -> None:
        """The port is announced once bound; its first answers may still come a bit later."""
        while True:
            try:
                self.calls()
                return
            except (urllib.error.URLError, ConnectionError):
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        """Terminate the server, killing it if it does not exit within 5 s."""
        self._port = None
        self._process.stop()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the strict SQS server is not running")
        return self._port

    @property
    def endpoint_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def broker_url(self) -> str:
        """A kombu/Celery broker URL (kombu derives ``http://`` unless ``is_secure`` is set)."""
        return f"sqs://{self.ACCESS_KEY}:{self.ACCESS_KEY}@{HOST}:{self.port}"

    @property
    def s3_config(self) -> Config:
        """The client configuration S3 needs here: path-style addressing (no bucket hosts)."""
        return Config(s3={"addressing_style": "path"})

    @property
    def boto3_kwargs(self) -> dict[str, str]:
        """Keyword arguments for ``boto3.client("sqs", ...)`` talking to this server."""
        return {
            "endpoint_url": self.endpoint_url,
            "region_name": self.REGION,
            "aws_access_key_id": self.ACCESS_KEY,
            "aws_secret_access_key": self.ACCESS_KEY,
        }

    def calls(self) -> dict[str, int]:
        """How many calls of each action arrived (faulted ones included).

        S3's calls are counted as ``s3:<Operation>``, e.g. ``s3:GetObject``.
        """
        counts: dict[str, int] = self._control("GET", "calls")["calls"]
        return counts

    def batch_entries(self) -> dict[str, int]:
        """How many batch entries arrived, per batch action."""
        entries: dict[str, int] = self._control("GET", "calls")["batch_entries"]
        return entries

    def reset_calls(self) -> None:
        """Zero the counts and empty the call log."""
        self._control("POST", "calls/reset")

    def call_log(self) -> list[Call]:
        """Every SQS call since the last :meth:`reset_calls`, in the order they ended."""
        log: list[Call] = self._control("GET", "calls/log")
        return log

    def inject_fault(
        self, action: str, kind: FaultKind, count: int = 1, seconds: float = 0.0
    ) -> None:
        """Make the next ``count`` calls of ``action`` fail as ``kind``.

        ``action`` is an SQS action (``ReceiveMessage``) or an S3 one (``s3:GetObject``).

        ``seconds`` is how long a delay or timeout holds each call (see
        :data:`FAULT_KINDS`). Faults for the same action queue up in order, and come
        before any outage or fraction. Raises ValueError if the server rejects them.
        """
        self._control(
            "POST", "faults", {"action": action, "kind": kind, "count": count, "seconds": seconds}
        )

    def outage(
        self,
        seconds: float,
        kind: FaultKind,
        actions: Iterable[str] | None = None,
        *,
        fault_seconds: float = 0.0,
    ) -> None:
        """Fail every call of ``actions`` (None: every SQS action) as ``kind`` for ``seconds``.

        The window starts when the server gets this request and is timed by its monotonic
        clock. ``fault_seconds`` is how long a delay or timeout holds each call.
        """
        self._control(
            "POST",
            "outages",
            {
                "seconds": seconds,
                "kind": kind,
                "actions": _action_list(actions),
                "fault_seconds": fault_seconds,
            },
        )

    def end_outages(self) -> None:
        """End every outage now; other faults stay."""
        self._control("DELETE", "outages")

    def fail_fraction(
        self,
        probability: float,
        kind: FaultKind,
        actions: Iterable[str] | None = None,
        *,
        seed: int | None = None,
        fault_seconds: float = 0.0,
    ) -> None:
        """Fail each call of ``actions`` (None: every SQS action) as ``kind`` with ``probability``.

        It lasts until :meth:`clear_faults`. With a ``seed`` the same sequence of calls
        fails the same way in every run; each fraction draws from its own generator.
        """
        self._control(
            "POST",
            "fractions",
            {
                "probability": probability,
                "kind": kind,
                "actions": _action_list(actions),
                "seed": seed,
                "fault_seconds": fault_seconds,
            },
        )

    def fail_entries(self, action: str, code: str, count: int = 1) -> None:
        """Fail the next ``count`` entries of ``action`` batch calls with ``code``.

        The rest of each call goes through: SQS answers a batch entry by entry, and a
        client must retry just the entries that failed. ``action`` is
        ``DeleteMessageBatch``, ``ChangeMessageVisibilityBatch`` or ``SendMessageBatch``
        (whose failed entries are not sent); ``InternalError`` and
        ``ServiceUnavailable`` come as SQS's fault, any other code as the sender's.
        """
        self._control("POST", "entry_faults", {"action": action, "code": code, "count": count})

    def add_latency(self, seconds: float, actions: Iterable[str] | None = None) -> None:
        """Answer every call of ``actions`` (None: every SQS action) ``seconds`` later.

        It lasts until :meth:`clear_faults`; latencies that apply to the same call add
        up. Faulted calls wait too, like any answer crossing a slow network.
        """
        self._control("POST", "latency", {"seconds": seconds, "actions": _action_list(actions)})

    def pending_faults(self) -> list[dict[str, Any]]:
        """Everything configured that can still affect a call, by ``type``.

        ``count``: a fault not yet consumed, with its remaining ``count``; ``outage``:
        with its ``remaining_seconds``; ``fraction`` and ``latency``. ``actions`` is
        None for the rules that apply to every SQS action.
        """
        pending: list[dict[str, Any]] = self._control("GET", "faults")
        return pending

    def clear_faults(self) -> None:
        """Remove every fault, outage, fraction and latency."""
        self._control("DELETE", "faults")

    def events(self) -> list[Event]:
        """Every receive, visibility change and delete the server saw, oldest first."""
        events: list[Event] = self._control("GET", "events")
        return events

    def clear_events(self) -> None:
        self._control("DELETE", "events")

    def forget_deleted_queues(self) -> None:
        """Let ``CreateQueue`` take the names of queues deleted in the last minute.

        The server refuses them for a minute after the delete, as SQS does
        (``QueueDeletedRecently``); a test of what happens a minute later skips the wait.
        """
        self._control("DELETE", "deleted_queues")

    def enforce_iam(self) -> None:
        """From now on, authenticate and authorise every AWS call, as AWS does.

        Until then the server accepts any credentials, which is what most tests want.
        After it, each call must be signed with an access key of an IAM user of this
        server (account 123456789012), and that user's policies must allow the action on
        the resource: the queue's ARN, or "*" for ListQueues. So create the users, their
        policies and access keys first, with boto3 and :attr:`boto3_kwargs` against this
        server, which also serves IAM: IAM calls are checked too, and the credentials of
        :attr:`boto3_kwargs` belong to no user. There is no way back, so a test that
        enforces IAM needs a server of its own. :meth:`refused_calls` lists what was
        refused.

        moto's evaluation is simpler than AWS's. It reads Effect, Action, NotAction and
        Resource, with ``*`` wildcards only and action names case-sensitive; it treats
        every Condition as met, and knows no queue policy, permission boundary or SCP. A
        policy that passes here may still be refused by AWS for a condition or a boundary,
        and one refused here may pass on AWS if it spells an action in other case or uses
        ``?``.
        """
        self._control("POST", "iam/enforce")

    def refused_calls(self) -> list[Refusal]:
        """Every call refused since :meth:`enforce_iam`, oldest first, IAM calls included."""
        refused: list[Refusal] = self._control("GET", "iam/refusals")
        return refused

    def _control(self, method: str, route: str, payload: object = None) -> Any:
        request = urllib.request.Request(
            f"{self.endpoint_url}{CONTROL_PREFIX}{route}",
            data=None if payload is None else json.dumps(payload).encode(),
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with self._opener.open(request, timeout=10) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as err:
            if err.code == 400:
                raise ValueError(json.loads(err.read())["error"]) from None
            raise


def _action_list(actions: Iterable[str] | None) -> list[str] | None:
    """A lone action name would otherwise be taken for its letters."""
    if actions is None:
        return None
    return [actions] if isinstance(actions, str) else list(actions)
