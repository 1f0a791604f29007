"""The one INFO line a worker logs at start-up: what the transport does with its messages.

At INFO a worker showed nothing of the transport: whoever started one could not tell
from its log that leases were held and renewed, nor with which settings, without DEBUG
or ``celery inspect``. This line says it once, when Celery's worker is ready: the lease,
when it is renewed and for how long, what happens to a rejected message and at shutdown,
which ETA tasks are parked, and where large bodies go. Renewals themselves stay at DEBUG
(one a lease every few seconds); a lease lost or a message released is logged at INFO
or above by :mod:`celery_sqs_heartbeat.reporting`.
"""

from __future__ import annotations

from .leases import LeasePolicy
from .options import HeartbeatOptions
from .payload_options import LargePayloadOptions

__all__ = ["describe"]


def describe(options: HeartbeatOptions, payloads: LargePayloadOptions | None) -> str:
    """The settings in plain words, each with the option that sets it."""
    return "; ".join(
        [_leases(options), _releases(options), _parking(options), _large_payloads(payloads)]
    )


def _leases(options: HeartbeatOptions) -> str:
    lease = f"SQS leases of {options.visibility_timeout} s (visibility_timeout)"
    if not options.visibility_extension:
        return f"{lease}, not renewed (visibility_extension off)"
    policy = LeasePolicy(
        options.visibility_timeout,
        options.visibility_extension_threshold,
        options.visibility_extension_max,
    )
    if policy.threshold is None:
        when = f"when at most {policy.margin_ceiling:g} s are left (adaptive margin)"
    else:
        when = f"when {policy.threshold:g} s are left (visibility_extension_threshold)"
    limit = (
        "visibility_extension_max"
        if options.visibility_extension_max is not None
        else "SQS's 12 hours less a minute"
    )
    return (
        f"{lease}, renewed {when}, checked every {options.visibility_extension_interval:g} s, "
        f"until the ack or {policy.hold_limit:g} s after the receive ({limit})"
    )


def _releases(options: HeartbeatOptions) -> str:
    if options.release_on_failure:
        delays = ", ".join(str(delay) for delay in options.release_delay)
        schedule = " by receive count" if len(options.release_delay) > 1 else ""
        rejected = (
            f"a rejected message is released, visible again after {delays} s{schedule} "
            "(release_on_failure, release_delay)"
        )
    else:
        rejected = (
            "a rejected message is deleted, or left to the queue's redrive policy "
            "(release_on_failure off)"
        )
    shutdown = (
        "released at shutdown"
        if options.release_on_shutdown
        else "left to their lease at shutdown (release_on_shutdown off)"
    )
    return f"{rejected}; messages not started are {shutdown}"


def _parking(options: HeartbeatOptions) -> str:
    if not options.eta_parking:
        return "ETA tasks are held until due (eta_parking off)"
    return (
        f"ETA tasks due in more than {options.eta_parking_threshold:g} s wait in SQS "
        "(eta_parking_threshold)"
    )


def _large_payloads(payloads: LargePayloadOptions | None) -> str:
    if payloads is None:
        return "large payloads off: every body in SQS (large_payload_bucket)"
    where = f"s3://{payloads.bucket}/{payloads.prefix}"
    if payloads.threshold is None:
        return f"every body goes through {where} (large_payload_threshold)"
    return f"bodies over {payloads.threshold} bytes go through {where} (large_payload_threshold)"
