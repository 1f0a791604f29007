"""The strict SQS server's WSGI middleware in front of moto.

It sees every SQS call before moto does, so it can count and time them, fail them as a
test asked, and serve the ``/_strict/`` control endpoints (never called by boto3) that
:class:`~celery_sqs_heartbeat.testing.StrictSQSServer` wraps. A faulted call is counted
but never reaches moto, so it leaves nothing in the event log.
"""

from __future__ import annotations

import contextlib
import socket
import time
from typing import TYPE_CHECKING, Any

from .deleted_queues import deleted_names
from .faults import parse_entry_fault, parse_fault, parse_fraction, parse_latency, parse_outage
from .iam import enforce_iam
from .protocol import (
    FAULT_REPLIES,
    SQSCall,
    buffer_body,
    error_reply,
    garbage_reply,
    iam_refusal_reply,
    identify_call,
    json_reply,
    returned_messages,
)
from .recorder import Call

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from _typeshed.wsgi import StartResponse, WSGIApplication, WSGIEnvironment

    from .fault_plan import FaultPlan
    from .recorder import Recorder

CONTROL_PREFIX = "/_strict/"


class StrictApp:
    """Control endpoints, call counts and faults around moto's own WSGI app."""

    def __init__(self, moto_app: WSGIApplication, recorder: Recorder, faults: FaultPlan) -> None:
        self._moto_app = moto_app
        self._recorder = recorder
        self._faults = faults
        self._routes: dict[tuple[str, str], Callable[[bytes], object]] = {
            ("GET", "calls"): lambda _: recorder.calls(),
            ("POST", "calls/reset"): lambda _: recorder.reset_calls(),
            ("GET", "calls/log"): lambda _: recorder.call_log(),
            ("GET", "events"): lambda _: recorder.events(),
            ("DELETE", "events"): lambda _: recorder.clear_events(),
            ("GET", "faults"): lambda _: faults.pending(),
            ("POST", "faults"): lambda body: faults.add_fault(*parse_fault(body)),
            ("DELETE", "faults"): lambda _: faults.clear(),
            ("POST", "entry_faults"): lambda body: faults.add_entry_fault(*parse_entry_fault(body)),
            ("POST", "outages"): lambda body: faults.add_outage(parse_outage(body)),
            ("DELETE", "outages"): lambda _: faults.end_outages(),
            ("POST", "fractions"): lambda body: faults.add_fraction(parse_fraction(body)),
            ("POST", "latency"): lambda body: faults.add_latency(parse_latency(body)),
            ("POST", "iam/enforce"): lambda _: enforce_iam(),
            ("GET", "iam/refusals"): lambda _: recorder.refusals(),
            ("DELETE", "deleted_queues"): lambda _: deleted_names.forget(),
        }

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path: str = environ.get("PATH_INFO", "")
        if path.startswith(CONTROL_PREFIX):
            return self._control(environ, start_response, path[len(CONTROL_PREFIX) :])
        call = identify_call(environ)
        if call is None:
            return self._moto_app(environ, start_response)
        generation = self._recorder.count_call(call.action, call.entries)
        arrived = time.time()
        returned: int | None = None
        try:
            answer = self._answer(environ, start_response, call)
            if call.action == "ReceiveMessage":
                body = b"".join(answer)
                returned = returned_messages(body)
                answer = [body]
            return answer
        finally:
            self._recorder.log_call(
                Call(
                    action=call.action,
                    arrived=arrived,
                    answered=time.time(),
                    entries=call.entries,
                    asked=call.asked,
                    returned=returned,
                    delays=list(call.delays) if call.delays is not None else None,
                    queue=call.queue,
                    wait=call.wait,
                ),
                generation,
            )

    def _answer(
        self, environ: WSGIEnvironment, start_response: StartResponse, call: SQSCall
    ) -> Iterable[bytes]:
        """The answer to an SQS call: moto's, after any latency, or an injected fault."""
        fault = self._faults.take_fault(call.action)
        # Each request has its own thread, so these waits hold up no other call.
        latency = self._faults.latency(call.action)
        if latency:
            time.sleep(latency)
        if fault is None:
            return self._serve(environ, start_response, call)
        if fault.kind == "delay":
            time.sleep(fault.seconds)
            return self._serve(environ, start_response, call)
        if fault.kind == "timeout":
            time.sleep(fault.seconds)
        if fault.kind in ("drop_connection", "timeout"):
            # A client that timed out may have closed the socket already.
            with contextlib.suppress(OSError):
                environ["werkzeug.socket"].shutdown(socket.SHUT_RDWR)
            # Werkzeug treats ConnectionError as "client went away" and sends nothing.
            raise ConnectionAbortedError(f"injected {fault.kind} for {call.action}")
        if fault.kind == "garbage":
            return garbage_reply(start_response, call)
        return error_reply(start_response, call, FAULT_REPLIES[fault.kind])

    def _serve(
        self, environ: WSGIEnvironment, start_response: StartResponse, call: SQSCall
    ) -> Iterable[bytes]:
        """moto's answer, with an IAM refusal in the JSON protocol when the client used it."""
        if not call.json_protocol:
            return self._moto_app(environ, start_response)
        refused: list[tuple[str, list[tuple[str, str]]]] = []

        def hold_refusal(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], object]:
            if status.startswith("403 "):
                refused.append((status, headers))
                return lambda _: None
            return start_response(status, headers, exc_info)

        answer = self._moto_app(environ, hold_refusal)
        if not refused:
            return answer
        body = b"".join(answer)
        close = getattr(answer, "close", None)
        if close is not None:
            close()
        reply = iam_refusal_reply(body)
        if reply is None:
            start_response(*refused[0])
            return [body]
        return error_reply(start_response, call, reply)

    def _control(
        self, environ: WSGIEnvironment, start_response: StartResponse, route: str
    ) -> list[bytes]:
        handler = self._routes.get((environ.get("REQUEST_METHOD", ""), route.rstrip("/")))
        if handler is None:
            return json_reply(start_response, "404 Not Found", {"error": f"no route {route}"})
        try:
            result = handler(buffer_body(environ))
        except ValueError as err:
            return json_reply(start_response, "400 Bad Request", {"error": str(err)})
        return json_reply(start_response, "200 OK", {} if result is None else result)
