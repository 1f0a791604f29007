"""Test helpers: a local SQS server that enforces SQS's real visibility-timeout rules.

moto's SQS forgives what AWS refuses exactly where a lease-renewing transport can go
wrong. :class:`StrictSQSServer` runs moto with SQS's rules patched in (``rules``), in a
subprocess that it drives over HTTP; each of the server's modules has one job, which its
docstring gives.
"""

from __future__ import annotations

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
]
