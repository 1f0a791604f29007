"""The strict SQS server's process: ``python -m celery_sqs_heartbeat.testing.strict_sqs``.

It serves moto, with the strict rules patched in, on 127.0.0.1 only: the server accepts
any credentials and takes orders from anyone who can reach it. It prints
``STRICT_SQS_READY http://127.0.0.1:PORT`` once it serves, so that whoever started it
learns the port it picked, and stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

from .app import StrictApp
from .fault_plan import FaultPlan
from .iam import install_iam_rules
from .recorder import Recorder
from .rules import DEFAULT_MAX_HOLD_SECONDS, install_strict_rules

if TYPE_CHECKING:
    from collections.abc import Sequence

    from werkzeug.serving import BaseWSGIServer

HOST = "127.0.0.1"
ENTRY_MODULE = "celery_sqs_heartbeat.testing.strict_sqs"
READY_PREFIX = "STRICT_SQS_READY "


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until SIGTERM or SIGINT."""
    args = _parse_args(argv)
    # One log line per request would flood the log of a long test session.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = _build_server(args.port, args.max_hold_seconds)
    # serve_forever() closes the server on KeyboardInterrupt, so treat SIGTERM alike.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.stop_at_stdin_eof:
        threading.Thread(target=_stop_at_stdin_eof, args=(server,), daemon=True).start()
    print(f"{READY_PREFIX}http://{HOST}:{server.port}", flush=True)
    server.serve_forever()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=f"python -m {ENTRY_MODULE}",
        description="moto's SQS with SQS's real visibility-timeout rules enforced.",
    )
    parser.add_argument("--host", default=HOST, help=f"must be {HOST} (the default)")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (default)")
    parser.add_argument(
        "--max-hold-seconds",
        type=float,
        default=DEFAULT_MAX_HOLD_SECONDS,
        help="how long after a receive a message may be kept invisible (default: 43200)",
    )
    parser.add_argument(
        "--stop-at-stdin-eof",
        action="store_true",
        help="stop when stdin closes, e.g. because the process that started the server died",
    )
    args = parser.parse_args(argv)
    if args.host != HOST:
        parser.error(f"refusing to bind {args.host!r}: the test bed only listens on {HOST}")
    if args.max_hold_seconds <= 0:
        parser.error("--max-hold-seconds must be positive")
    return args


def _build_server(port: int, max_hold_seconds: float) -> BaseWSGIServer:
    """Patch moto and bind a threaded WSGI server (long polls must not block each other)."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    recorder = Recorder()
    faults = FaultPlan()
    install_strict_rules(recorder, faults, max_hold_seconds)
    install_iam_rules(recorder)
    app = StrictApp(DomainDispatcherApplication(create_backend_app), recorder, faults)
    return make_server(HOST, port, app, threaded=True, request_handler=MotoRequestHandler)


def _stop_at_stdin_eof(server: BaseWSGIServer) -> None:
    """Stop serving once stdin is closed, so a killed test run leaves no server behind.

    os.read, not sys.stdin: a daemon thread blocked inside the buffered reader holds
    its lock, and the interpreter aborts when it cannot take that lock at exit.
    """
    while os.read(sys.stdin.fileno(), 4096):
        pass
    server.shutdown()
