"""Transport options: read, checked and frozen once, when the connection is made.

A wrong lease setting does not fail loudly at run time: it shows up hours later as
tasks that ran twice. So every option is checked at start-up and a bad one stops the
worker with an error naming the option, the value and what is allowed.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any

from celery.utils.log import get_logger
from kombu.transport import SQS

from .aws.sqs_facts import SQS_MAX_HOLD_SECONDS
from .leasing.leases import MARGIN_CEILING, LeasePolicy
from .receiving.chains import DEFAULT_RECEIVES_IN_FLIGHT, MAX_RECEIVES_IN_FLIGHT

logger = get_logger(__name__)

__all__ = ["HeartbeatOptions", "InvalidTransportOption", "warn_about_options"]

DEFAULT_VISIBILITY_TIMEOUT = 30
#: The lease without renewals, when ``visibility_timeout`` is not given: kombu's own.
#: Opting out of renewals is asking for kombu's behaviour, and a 30 s lease nothing
#: renews would hand any longer task to another worker while it still runs.
UNRENEWED_VISIBILITY_TIMEOUT = int(SQS.Channel.default_visibility_timeout)

#: Seconds an acked message's delete may wait for others to share its DeleteMessageBatch
#: call. Measured (benchmarks/README.md, section 3): 0.5 s fills every call from 20 acks
#: a second per worker, while with no wait calls carry 6 to 8. The wait is also how long
#: a worker killed right after a task leaves SQS free to hand that task out again.
DEFAULT_ACK_BATCH_INTERVAL = 0.5
#: Longer waits save no requests at any rate that fills a call in that time, and widen
#: the window in which a killed worker's finished tasks run again.
MAX_ACK_BATCH_INTERVAL = 10.0

#: Where the Prometheus exporter listens once ``metrics_port`` is set: every interface,
#: as Prometheus exporters do, because the scraper runs on another host or pod. Setting
#: the port is the opt-in, and the page holds counts and error codes, never task data.
DEFAULT_METRICS_ADDRESS = "0.0.0.0"

#: Seconds to an ETA beyond which a received task is parked in SQS instead of held
#: (:mod:`celery_sqs_heartbeat.receiving.parking`). Holding 15 minutes costs about 35 renewal
#: entries per task at the default 30 s lease, a park and its return about two entries'
#: worth of calls (docs/benchmarks.md, "Parking"); under it Celery's own timer keeps
#: the task, which leaves short countdowns exactly as they were before parking came.
DEFAULT_ETA_PARKING_THRESHOLD = 900.0
#: The shortest parking threshold: a parked task comes back half the threshold before
#: its ETA when that is under ``parking.RETURN_LEAD``, and SQS hides in whole seconds.
MIN_ETA_PARKING_THRESHOLD = 2.0

#: The options this package adds beside kombu's own SQS options.
OPTION_NAMES = (
    "visibility_timeout",
    "visibility_extension",
    "visibility_extension_threshold",
    "visibility_extension_interval",
    "visibility_extension_max",
    "release_on_failure",
    "release_delay",
    "release_on_shutdown",
    "metrics_port",
    "metrics_address",
    "ack_batching",
    "ack_batch_interval",
    # Read by celery_sqs_heartbeat.payloads.options.
    "large_payload_bucket",
    "large_payload_prefix",
    "large_payload_threshold",
    "large_payload_keep_objects",
    "large_payload_read_buckets",
    "large_payload_max_read_bytes",
    "large_payload_expected_bucket_owner",
    "large_payload_sse",
    "large_payload_kms_key_id",
    "eta_parking",
    "eta_parking_threshold",
    "eta_send_delay",
    "receives_in_flight",
    # Read by celery_sqs_heartbeat.monitoring.event_fanout.
    "events_through_sns",
)


class InvalidTransportOption(ValueError):
    """A transport option has a wrong type, is out of range, or contradicts another."""


@dataclass(frozen=True)
class HeartbeatOptions:
    """The validated lease settings of one connection."""

    visibility_timeout: int = DEFAULT_VISIBILITY_TIMEOUT
    visibility_extension: bool = True
    #: Seconds before expiry a lease is renewed. None (the default): a margin that
    #: follows how long renewals take, from about 4 s on a fast SQS up to
    #: ``min(10, visibility_timeout / 2)`` (see ``leases.AdaptiveMargin``). SQS bills
    #: calls, and a renewal 10 s before expiry buys 20 s of a 30 s lease, one 4 s
    #: before buys 26 s: the fixed 10 s cost about 1.3x the calls of renewing 5 s before.
    visibility_extension_threshold: float | None = None
    visibility_extension_interval: float = 1.0
    visibility_extension_max: float | None = None
    release_on_failure: bool = False
    release_delay: tuple[int, ...] = (0,)
    release_on_shutdown: bool = True
    #: TCP port of the Prometheus exporter of a worker's main process; None: no exporter.
    metrics_port: int | None = None
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    #: Acks go through the process's outbox as DeleteMessageBatch calls; False: kombu's
    #: own synchronous DeleteMessage per ack, on the worker's event loop.
    ack_batching: bool = True
    ack_batch_interval: float = DEFAULT_ACK_BATCH_INTERVAL
    #: Tasks whose ETA is further away than ``eta_parking_threshold`` wait hidden in
    #: SQS, not in the worker; False: every ETA task is held until due, as by Celery.
    eta_parking: bool = True
    eta_parking_threshold: float = DEFAULT_ETA_PARKING_THRESHOLD
    #: A task published with an ETA at least a second away is sent with ``DelaySeconds``
    #: (up to SQS's 15 minutes) on a standard queue, so that SQS holds the wait, not a
    #: worker (:mod:`celery_sqs_heartbeat.publishing.send_delay`); read where the task
    #: is published. False: sent at once, as by kombu.
    eta_send_delay: bool = True
    #: The most ReceiveMessage calls a worker keeps in flight on one queue while it has a
    #: backlog and room for full calls (:mod:`celery_sqs_heartbeat.receiving.chains`);
    #: 1: one at a time, as kombu does.
    receives_in_flight: int = DEFAULT_RECEIVES_IN_FLIGHT

    @classmethod
    def from_transport_options(cls, options: Mapping[str, Any]) -> HeartbeatOptions:
        """Validate the user's ``broker_transport_options``; what is only doubtful is
        said by :func:`warn_about_options`."""
        extension = _boolean(options, "visibility_extension", True)
        default_timeout = DEFAULT_VISIBILITY_TIMEOUT if extension else UNRENEWED_VISIBILITY_TIMEOUT
        visibility_timeout = _whole_seconds(
            options, "visibility_timeout", default_timeout, 0, SQS_MAX_HOLD_SECONDS
        )
        base = cls(
            visibility_timeout=visibility_timeout,
            visibility_extension=extension,
            release_on_failure=_boolean(options, "release_on_failure", False),
            release_delay=_release_delay(options),
            release_on_shutdown=_boolean(options, "release_on_shutdown", True),
            metrics_port=_metrics_port(options),
            metrics_address=_metrics_address(options),
            ack_batching=_boolean(options, "ack_batching", True),
            ack_batch_interval=_ack_batch_interval(options, visibility_timeout, extension),
            eta_parking=_boolean(options, "eta_parking", True),
            eta_send_delay=_boolean(options, "eta_send_delay", True),
            receives_in_flight=_count(
                options, "receives_in_flight", DEFAULT_RECEIVES_IN_FLIGHT, MAX_RECEIVES_IN_FLIGHT
            ),
        )
        if not extension:
            return replace(
                base,
                eta_parking_threshold=_parking_threshold(
                    options,
                    visibility_timeout,
                    f"visibility_timeout ({visibility_timeout}), not renewed while "
                    "visibility_extension is off",
                ),
            )
        if visibility_timeout < 2:
            raise InvalidTransportOption(
                f"visibility_timeout={visibility_timeout!r}: renewing leases needs at least 2 "
                f"seconds (allowed: 2 to {SQS_MAX_HOLD_SECONDS} while visibility_extension is on)"
            )
        threshold = _threshold(options, visibility_timeout)
        interval = _interval(options, visibility_timeout, threshold)
        maximum = _extension_max(options, visibility_timeout)
        hold = LeasePolicy(visibility_timeout, max_hold=maximum).hold_limit
        return replace(
            base,
            visibility_extension_threshold=threshold,
            visibility_extension_interval=interval,
            visibility_extension_max=maximum,
            eta_parking_threshold=_parking_threshold(
                options,
                hold,
                f"visibility_extension_max ({maximum:g})"
                if maximum == hold
                else f"SQS's 12 hours less 60 s ({hold:g})",
            ),
        )

    def release_delay_for(self, receive_count: int) -> int:
        """The visibility a released message gets on its ``receive_count``-th receive.

        Indexed by SQS's own ApproximateReceiveCount so that the backoff survives the
        worker: whichever worker fails the message next continues the schedule.
        """
        index = min(max(receive_count, 1), len(self.release_delay)) - 1
        return self.release_delay[index]


def _threshold(options: Mapping[str, Any], visibility_timeout: int) -> float | None:
    """The fixed threshold if one is given; None (not set) means the adaptive margin."""
    allowed = f"greater than 0 and less than visibility_timeout ({visibility_timeout})"
    if _given(options, "visibility_extension_threshold", None) is None:
        return None
    threshold = _seconds(options, "visibility_extension_threshold", 0.0, allowed)
    if not 0 < threshold < visibility_timeout:
        raise InvalidTransportOption(
            f"visibility_extension_threshold={threshold!r}: must be {allowed}"
        )
    return threshold


def _interval(
    options: Mapping[str, Any], visibility_timeout: int, threshold: float | None
) -> float:
    """At most the threshold (or the adaptive margin's ceiling): a lease must be seen due
    before its margin has gone by."""
    if threshold is None:
        ceiling = min(MARGIN_CEILING, visibility_timeout / 2)
        limit = (
            f"{ceiling:g} (half the visibility_timeout, {MARGIN_CEILING:g} at most: the "
            "widest adaptive margin while visibility_extension_threshold is not set)"
        )
    else:
        ceiling = threshold
        limit = f"visibility_extension_threshold ({threshold})"
    allowed = f"greater than 0 and at most {limit}"
    interval = _seconds(options, "visibility_extension_interval", min(1.0, ceiling / 2), allowed)
    if not 0 < interval <= ceiling:
        raise InvalidTransportOption(
            f"visibility_extension_interval={interval!r}: must be {allowed}"
        )
    return interval


def warn_about_options(options: Mapping[str, Any], parsed: HeartbeatOptions) -> None:
    """Warn, once per process, of what ``options`` (read as ``parsed``) may not mean.

    Called when a connection opens its first channel, not when the options are read: a
    Celery worker first reads them (building its transport to ask what it supports)
    before its logging is set up, and a warning given then was lost, for good once it
    was given only once.
    """
    _warn_about_near_misses(options)
    given_timeout = _given(options, "visibility_timeout", None)
    if not parsed.visibility_extension and given_timeout is not None:
        _warn_leases_not_renewed(parsed.visibility_timeout)


def _warn_about_near_misses(options: Mapping[str, Any]) -> None:
    """kombu passes transport options through untouched, so a misspelt name would be
    silently ignored; a near miss of one of ours names the option probably meant."""
    for name in options:
        if name in OPTION_NAMES:
            continue
        close = difflib.get_close_matches(str(name), OPTION_NAMES, n=1, cutoff=0.8)
        if close:
            _warn_near_miss(str(name), close[0])


@cache
def _warn_near_miss(name: str, meant: str) -> None:
    """Once per process and name: a worker connects several times (its consumer, remote
    control, a reconnect), and Celery builds its transport four times to start."""
    logger.warning("Unknown transport option %r, did you mean %r? It is ignored.", name, meant)


def _boolean(options: Mapping[str, Any], name: str, default: bool) -> bool:
    value = _given(options, name, default)
    if not isinstance(value, bool):
        raise InvalidTransportOption(f"{name}={value!r}: must be True or False")
    return value


def _count(options: Mapping[str, Any], name: str, default: int, most: int) -> int:
    given = _given(options, name, default)
    value = _numeric(given)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise InvalidTransportOption(f"{name}={given!r}: must be a whole number, 1 to {most}")
    return value


def _numeric(value: Any) -> Any:
    """A number given as text, as settings read from environment variables are.

    kombu reads ``visibility_timeout`` with ``float()``, so ``"21600"`` and ``"21600.0"``
    work there and must work here. Any other text is returned as it is, to be refused
    with the option's own message.
    """
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            return value
        if math.isfinite(number):
            return int(number) if number.is_integer() and "." not in value else number
    return value


def _given(options: Mapping[str, Any], name: str, default: Any) -> Any:
    # None or an empty string means "not set", as kombu reads its own options.
    value = options.get(name, default)
    return default if value is None or (isinstance(value, str) and not value.strip()) else value


def _seconds(options: Mapping[str, Any], name: str, default: float, allowed: str) -> float:
    given = _given(options, name, default)
    value = _numeric(given)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTransportOption(f"{name}={given!r}: must be a number of seconds, {allowed}")
    return float(value)


def _whole_seconds(options: Mapping[str, Any], name: str, default: int, low: int, high: int) -> int:
    return _checked_whole_seconds(name, _given(options, name, default), low, high)


def _checked_whole_seconds(name: str, given: Any, low: int, high: int) -> int:
    # SQS takes whole seconds only; 2.5 would be truncated by SQS, so it is refused here.
    value = _numeric(given)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTransportOption(f"{name}={given!r}: must be whole seconds, {low} to {high}")
    if not low <= value <= high:
        raise InvalidTransportOption(f"{name}={given!r}: allowed range is {low} to {high} seconds")
    return value


def _metrics_port(options: Mapping[str, Any]) -> int | None:
    given = _given(options, "metrics_port", None)
    value = _numeric(given)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InvalidTransportOption(
            f"metrics_port={given!r}: must be a TCP port, 1 to 65535, or None (no exporter)"
        )
    return value


def _metrics_address(options: Mapping[str, Any]) -> str:
    value = _given(options, "metrics_address", DEFAULT_METRICS_ADDRESS)
    if not isinstance(value, str) or not value.strip():
        raise InvalidTransportOption(
            f"metrics_address={value!r}: must be the address to listen on, such as "
            f"{DEFAULT_METRICS_ADDRESS!r} (every interface) or '127.0.0.1' (this host only)"
        )
    return value.strip()


def _ack_batch_interval(
    options: Mapping[str, Any], visibility_timeout: int, extension: bool
) -> float:
    # Without renewals nothing keeps a message hidden while its delete waits.
    high = (
        MAX_ACK_BATCH_INTERVAL if extension else min(MAX_ACK_BATCH_INTERVAL, visibility_timeout / 2)
    )
    allowed = f"0 (at once) to {high:g}"
    if not extension:
        allowed += " (half the visibility_timeout while visibility_extension is off)"
    value = _seconds(options, "ack_batch_interval", min(DEFAULT_ACK_BATCH_INTERVAL, high), allowed)
    if not 0 <= value <= high:
        raise InvalidTransportOption(
            f"ack_batch_interval={value!r}: allowed range is {allowed} seconds"
        )
    return value


def _extension_max(options: Mapping[str, Any], visibility_timeout: int) -> float | None:
    """``visibility_extension_max``: None (SQS's own limit) or a lease's worth up to it."""
    if _given(options, "visibility_extension_max", None) is None:
        return None
    maximum = _seconds(
        options,
        "visibility_extension_max",
        0.0,
        f"None or from visibility_timeout ({visibility_timeout}) to "
        f"{SQS_MAX_HOLD_SECONDS} seconds",
    )
    if not visibility_timeout <= maximum <= SQS_MAX_HOLD_SECONDS:
        raise InvalidTransportOption(
            f"visibility_extension_max={maximum!r}: must be None or from "
            f"visibility_timeout ({visibility_timeout}) to {SQS_MAX_HOLD_SECONDS} seconds"
        )
    return maximum


def _parking_threshold(options: Mapping[str, Any], hold: float, named: str) -> float:
    """At most half the ``hold``, the longest a delivered task stays hidden from others.

    A task delivered within the threshold is held until due, and then runs in what is
    left of the hold: a threshold near the hold starts it with almost nothing left, and
    it is handed out again mid-run. Half leaves the run at least as long as the longest
    wait, whatever the hold; the default is the same, or 15 minutes if less.
    """
    ceiling = max(MIN_ETA_PARKING_THRESHOLD, hold / 2)
    allowed = (
        f"from {MIN_ETA_PARKING_THRESHOLD:g} to {ceiling:g}, half the hold limit of {named}: "
        "a task held until its ETA must have at least as long again to run"
    )
    default = min(DEFAULT_ETA_PARKING_THRESHOLD, ceiling)
    threshold = _seconds(options, "eta_parking_threshold", default, allowed)
    if not MIN_ETA_PARKING_THRESHOLD <= threshold <= ceiling:
        raise InvalidTransportOption(f"eta_parking_threshold={threshold!r}: must be {allowed}")
    return threshold


@cache
def _warn_leases_not_renewed(visibility_timeout: int) -> None:
    """Once per process and value: every connection of a worker warns, and one setting
    warned about several times reads as several problems."""
    logger.warning(
        "visibility_extension is False: SQS leases are not renewed, so a task still "
        "running (or waiting for its ETA) visibility_timeout=%d s after its receive "
        "runs again elsewhere",
        visibility_timeout,
    )


def _release_delay(options: Mapping[str, Any]) -> tuple[int, ...]:
    value = _given(options, "release_delay", 0)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        if not value:
            raise InvalidTransportOption(
                "release_delay=[]: a backoff schedule needs at least one delay"
            )
        return tuple(
            _checked_whole_seconds("release_delay", item, 0, SQS_MAX_HOLD_SECONDS) for item in value
        )
    return (_checked_whole_seconds("release_delay", value, 0, SQS_MAX_HOLD_SECONDS),)
