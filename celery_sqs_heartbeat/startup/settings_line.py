"""The one INFO line a worker logs at start-up: what the transport does with its messages.

At INFO a worker showed nothing of the transport: whoever started one could not tell
from its log that leases were held and renewed, nor with which settings, without DEBUG
or ``celery inspect``. This line says it once, when Celery's worker is ready: the lease,
when it is renewed and for how long, what happens to a rejected message and at shutdown,
which ETA tasks are parked or sent delayed, where large bodies go, and how S3 objects are guarded.
Renewals themselves stay at DEBUG (one a lease every few seconds); a lease lost or a
message released is logged at INFO or above by :mod:`celery_sqs_heartbeat.leasing.reporting`.
"""

from __future__ import annotations

from ..aws.sqs_facts import SQS_MAX_DELAY_SECONDS
from ..leasing.leases import LeasePolicy
from ..options import HeartbeatOptions
from ..payloads.options import DEFAULT_MAX_READ_BYTES, LargePayloadOptions, PayloadAccess

__all__ = ["describe"]


def describe(
    options: HeartbeatOptions,
    payloads: LargePayloadOptions | None,
    access: PayloadAccess | None = None,
    tasks_run_on_the_loop: bool = False,
) -> str:
    """The settings in plain words, each with the option that sets it.

    ``tasks_run_on_the_loop``: the worker's pool runs tasks on its event loop (solo).
    """
    parts = [_leases(options), _releases(options), _parking(options), _large_payloads(payloads)]
    return "; ".join(
        [*parts, *_receives(options, tasks_run_on_the_loop), *_s3_guards(payloads, access)]
    )


def _receives(options: HeartbeatOptions, tasks_run_on_the_loop: bool) -> list[str]:
    """A solo worker's one receive per queue, when the option asked for more."""
    if tasks_run_on_the_loop and options.receives_in_flight > 1:
        return [
            "one receive per queue at a time, not receives_in_flight="
            f"{options.receives_in_flight}: tasks run on the event loop (solo pool)"
        ]
    return []


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
        parking = "ETA tasks are held until due (eta_parking off)"
    else:
        parking = (
            f"ETA tasks due in more than {options.eta_parking_threshold:g} s wait in SQS "
            "(eta_parking_threshold)"
        )
    return f"{parking}; {_send_delay(options)}"


def _send_delay(options: HeartbeatOptions) -> str:
    if not options.eta_send_delay:
        return "countdowns published here are sent at once (eta_send_delay off)"
    return (
        f"countdowns published here are sent with an SQS delay of up to "
        f"{SQS_MAX_DELAY_SECONDS} s (eta_send_delay)"
    )


def _large_payloads(payloads: LargePayloadOptions | None) -> str:
    if payloads is None:
        return "large payloads off: every body in SQS (large_payload_bucket)"
    where = f"s3://{payloads.bucket}/{payloads.prefix}"
    if payloads.threshold is None:
        return f"every body goes through {where} (large_payload_threshold)"
    return f"bodies over {payloads.threshold} bytes go through {where} (large_payload_threshold)"


def _s3_guards(payloads: LargePayloadOptions | None, access: PayloadAccess | None) -> list[str]:
    """What differs from the defaults in reading and writing S3 objects, if anything."""
    said = []
    others = sorted((access.readable if access else set()) - {payloads and payloads.bucket})
    if others:
        said.append(f"pointers also read from {', '.join(others)} (large_payload_read_buckets)")
    if access is not None and access.max_read_bytes != DEFAULT_MAX_READ_BYTES:
        said.append(
            f"bodies read up to {access.max_read_bytes} bytes (large_payload_max_read_bytes)"
        )
    if access is not None and access.expected_owner:
        said.append(f"S3 buckets expected of account {access.expected_owner}")
    elif access is not None and not access.owner_from_queue:
        said.append("no S3 bucket owner expected (large_payload_expected_bucket_owner off)")
    if payloads is not None and payloads.sse:
        said.append(f"objects put with {payloads.sse} encryption (large_payload_sse)")
    return said
