"""The strict SQS server's command: ``python -m celery_sqs_heartbeat.testing.strict_sqs``.

The server was once this one module; its public names stay importable from here, so
that code written against it keeps working.
"""

from __future__ import annotations

from .cli import main
from .faults import FAULT_KINDS, FaultKind
from .recorder import Call, Event, Refusal
from .rules import DEFAULT_MAX_HOLD_SECONDS
from .server import StrictSQSServer

__all__ = [
    "DEFAULT_MAX_HOLD_SECONDS",
    "FAULT_KINDS",
    "Call",
    "Event",
    "FaultKind",
    "Refusal",
    "StrictSQSServer",
    "main",
]

if __name__ == "__main__":
    main()
