"""Test helpers: a local SQS server that enforces SQS's real visibility-timeout rules.

The names are loaded lazily so that ``python -m celery_sqs_heartbeat.testing.strict_sqs``
does not import that module twice (once via this package, once as ``__main__``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .strict_sqs import (
        DEFAULT_MAX_HOLD_SECONDS,
        FAULT_KINDS,
        Call,
        Event,
        FaultKind,
        StrictSQSServer,
    )

__all__ = [
    "DEFAULT_MAX_HOLD_SECONDS",
    "FAULT_KINDS",
    "Call",
    "Event",
    "FaultKind",
    "StrictSQSServer",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import strict_sqs

        return getattr(strict_sqs, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
