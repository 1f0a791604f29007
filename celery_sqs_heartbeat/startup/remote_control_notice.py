"""One line at a worker's start-up when remote control or events cannot reach it.

On SQS, ``celery inspect``, ``celery control``, ``celery events`` and Flower need SNS
(the transport options ``supports_fanout`` and ``events_through_sns``, kombu 5.7 or
later). Without them Celery switches remote control off without a word, and
``inspect`` only finds no nodes. The line is INFO: running without remote control is
the default and a sound choice (SNS costs requests), not a fault, and a WARNING at every
default start would teach people to skip warnings; it is there for whoever looks at a
worker's log (``-l info``, as Celery's documentation starts workers) to find out why
no node answered. A setting that asks for SNS but cannot have it is a WARNING, said
where the option is read.
"""

from __future__ import annotations

__all__ = ["notice"]

_HOW = "set the transport options supports_fanout=True and events_through_sns=True"


def notice(
    supports_fanout: bool,
    events_through_sns: bool,
    kombu_broadcasts_through_sns: bool,
    kombu_version: str,
) -> str | None:
    """What a worker started with these settings cannot be reached by, and the remedy."""
    if not kombu_broadcasts_through_sns:
        return (
            "Remote control is off on SQS: celery inspect, celery control and events "
            "(celery events, Flower) will not reach this worker; they need kombu 5.7 or "
            f"later (this is {kombu_version}), then {_HOW}"
        )
    if not supports_fanout:
        return (
            "Remote control is off on SQS: celery inspect, celery control and events "
            f"(celery events, Flower) will not reach this worker; to turn them on, {_HOW}"
        )
    if not events_through_sns:
        return (
            "Events are off on SQS: celery events and Flower will not see this worker or "
            "its tasks; to turn them on, set the transport option events_through_sns=True"
        )
    return None
