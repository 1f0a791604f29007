"""The strict SQS server's process: ``celery-sqs-heartbeat-server``, or
``python -m celery_sqs_heartbeat.testing.strict_sqs``.

It serves moto, with the strict rules patched in, on 127.0.0.1 only: the server accepts
any credentials and takes orders from anyone who can reach it. It prints
``STRICT_SQS_READY http://127.0.0.1:PORT`` once it serves, so that whoever started it
learns the port it picked, then a line for the person who did, and stops on SIGTERM or
SIGINT. Everything it holds (queues, messages, users, faults) lives in its memory and
ends with it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

from .app import StrictApp
from .endpoint import ACCESS_KEY, CONSOLE_SCRIPT, DEFAULT_PORT, ENTRY_MODULE, HOST, READY_PREFIX
from .fault_plan import FaultPlan
from .faults import FAULT_KINDS, parse_fraction, parse_latency
from .iam import install_iam_rules
from .recorder import Recorder
from .rules import DEFAULT_MAX_HOLD_SECONDS, install_strict_rules

if TYPE_CHECKING:
    from collections.abc import Sequence

    from werkzeug.serving import BaseWSGIServer

MOTO_MISSING = (
    "install the package's testing extra (from a checkout: pip install -e '.[testing]'), "
    "or moto[server] beside it"
)


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until SIGTERM or SIGINT."""
    parser = _parser()
    args = parser.parse_args(argv)
    faults = _checked_faults(parser, args)
    # One log line per request would flood the log of a long test session.
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    # werkzeug itself reports a port in use (or any failure to bind) and exits with 1.
    server = _build_server(args.port, args.max_hold_seconds, faults)
    greeting = _greeting(server.port)
    # serve_forever() closes the server on KeyboardInterrupt, so treat SIGTERM alike.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.stop_at_stdin_eof:
        threading.Thread(target=_stop_at_stdin_eof, args=(server,), daemon=True).start()
    try:
        print(f"{READY_PREFIX}http://{HOST}:{server.port}", flush=True)
        print(greeting, flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        # A stop that came before serve_forever() began: it ends as cleanly.
        server.server_close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_program_name(),
        description="A local SQS (and S3) with SQS's real visibility-timeout rules enforced: "
        "moto, made strict, on 127.0.0.1. State is kept in memory until it stops.",
    )
    parser.add_argument("--host", default=HOST, help=f"must be {HOST} (the default)")
    parser.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"the port to serve on (default {DEFAULT_PORT}); 0 picks a free one",
    )
    parser.add_argument(
        "--max-hold-seconds",
        type=float,
        default=DEFAULT_MAX_HOLD_SECONDS,
        help="how long after a receive a message may be kept invisible (default: 43200)",
    )
    faults = parser.add_argument_group(
        "faults from the start, on every SQS call (more at run time: docs/local-sqs.md)"
    )
    faults.add_argument(
        "--latency", type=float, metavar="SECONDS", help="answer every call this much later"
    )
    faults.add_argument(
        "--fail-fraction",
        type=float,
        metavar="P",
        help="fail each call with probability P (0 to 1), as --fault-kind",
    )
    faults.add_argument(
        "--fault-kind",
        choices=FAULT_KINDS,
        default="server_error",
        help="how --fail-fraction fails a call (default: server_error)",
    )
    faults.add_argument(
        "--fault-seconds",
        type=float,
        default=0.0,
        help="how long a delay or timeout fault holds the call",
    )
    faults.add_argument("--seed", type=int, help="make --fail-fraction repeat its pattern")
    parser.add_argument(
        "--stop-at-stdin-eof",
        action="store_true",
        help="stop when stdin closes, e.g. because the process that started the server died",
    )
    return parser


def _program_name() -> str:
    """What the user typed: the console script, or ``python -m`` and the module."""
    if os.path.basename(sys.argv[0]) == CONSOLE_SCRIPT:
        return CONSOLE_SCRIPT
    return f"python -m {ENTRY_MODULE}"


def _checked_faults(parser: argparse.ArgumentParser, args: argparse.Namespace) -> FaultPlan:
    """The faults the options ask for, checked by the same rules as the control endpoints'."""
    if args.host != HOST:
        parser.error(f"refusing to bind {args.host!r}: the test bed only listens on {HOST}")
    if args.max_hold_seconds <= 0:
        parser.error("--max-hold-seconds must be positive")
    if importlib.util.find_spec("moto") is None:
        parser.exit(1, f"{parser.prog}: the local server is moto's; {MOTO_MISSING}\n")
    faults = FaultPlan()
    # The control endpoints' parsers hold the rules (and their messages), so the options
    # go through them as the JSON a test would send.
    try:
        if args.latency is not None:
            faults.add_latency(parse_latency(_json({"seconds": args.latency})))
        if args.fail_fraction is not None:
            fraction = {
                "probability": args.fail_fraction,
                "kind": args.fault_kind,
                "fault_seconds": args.fault_seconds,
                "seed": args.seed,
            }
            faults.add_fraction(parse_fraction(_json(fraction)))
    except ValueError as err:
        parser.error(f"fault options: {err}")
    return faults


def _json(payload: dict[str, object]) -> bytes:
    return json.dumps(payload).encode()


def _greeting(port: int) -> str:
    """How to point an app at the server, for whoever started it by hand."""
    key = ACCESS_KEY
    return (
        f"Serving SQS and S3 on http://{HOST}:{port} (any credentials; state in memory). "
        f'Celery: broker_url = "sqs://{key}:{key}@{HOST}:{port}". Ctrl-C stops it.'
    )


def _build_server(port: int, max_hold_seconds: float, faults: FaultPlan) -> BaseWSGIServer:
    """Patch moto and bind a threaded WSGI server (long polls must not block each other)."""
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    recorder = Recorder()
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
