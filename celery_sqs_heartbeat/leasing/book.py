"""The book of the leases a process renews, and what becomes of each when SQS answers.

Pure, no I/O, time passed in; the caller (the manager) holds a lock around every call:
nothing here is thread-safe. The records it keeps are :mod:`celery_sqs_heartbeat.leasing.leases`';
when each comes due is :mod:`celery_sqs_heartbeat.leasing.schedule`'s job.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from .leases import AdaptiveMargin, EntryResult, Lease, Release
from .schedule import RenewalBatch, RenewalSchedule

__all__ = ["LeaseBook", "Settlement"]


@dataclass
class Settlement:
    """What the manager must report after a renewal batch came back."""

    renewed: list[tuple[Lease, int]] = field(default_factory=list)
    capped: list[Lease] = field(default_factory=list)
    lost: list[tuple[Lease, str]] = field(default_factory=list)
    releases: list[Release] = field(default_factory=list)


class LeaseBook:
    """The leases a process is renewing, and what becomes of each when SQS answers.

    Which lease is due when is the :class:`~celery_sqs_heartbeat.leasing.schedule.RenewalSchedule`'s
    job; the book decides a lease's life around it: a lease that ended stays ended, a
    release waits for a renewal on the wire to come back (:meth:`end`), a late answer's
    lease is confirmed before it is held (:meth:`confirming`), and an answer renews the
    lease, caps it at its hold limit, loses it or has it tried again (:meth:`settle`).

    A renewal that failed for a passing reason is tried again at the next check, one check
    interval (``margin.interval``) after it was sent, not at whatever check comes first.
    """

    def __init__(self, margin: AdaptiveMargin | None = None) -> None:
        self.margin = margin if margin is not None else AdaptiveMargin()
        self._schedule = RenewalSchedule(self.margin)
        self._releases_waiting: set[Lease] = set()

    def __len__(self) -> int:
        return len(self._schedule)

    def __iter__(self) -> Iterator[Lease]:
        """Every lease being renewed, queue by queue (for inspection, under the lock)."""
        return iter(self._schedule)

    @property
    def looked_at(self) -> int:
        """Leases the schedule looked at so far: what bounds a hold of the caller's lock."""
        return self._schedule.looked_at

    def add(self, lease: Lease) -> None:
        """Renew ``lease`` from now on, unless it ended or its connection renews none.

        A lease may end before it is added (a late answer's, released while its
        confirmation was out), and renewing it would hide a released or deleted message
        again, for as long as the process lives. A lease whose connection opted out of
        renewals is never added, whichever path asks (a delete retried after it failed):
        the manager has no check interval for it, and the user asked for none.
        """
        if not lease.ended and lease.policy.renewed:
            self._schedule.add(lease)

    def end(
        self, lease: Lease, release_delay: int | None = None, reason: str = ""
    ) -> Release | None:
        """Stop renewing ``lease`` (ack, reject or shutdown); maybe release it.

        A renewal already on the wire cannot be recalled, and if it landed after a
        release it would hide the message again. So a lease that is being renewed keeps
        its release until :meth:`settle` sees that renewal come back.
        """
        if lease.ended:
            return None
        lease.ended = True
        self._schedule.discard(lease)
        if release_delay is None:
            return None
        release = Release(lease, release_delay, reason)
        if lease.renewing:
            lease.pending_release = release
            self._releases_waiting.add(lease)
            return None
        return release

    def confirming(self, lease: Lease) -> bool:
        """Whether a renewal confirming ``lease`` may go out; if so, it is being renewed.

        The lease of an answer read late is confirmed before it is added. Marked as being
        renewed meanwhile, its release (the channel closing) waits for the confirmation
        to come back, as for a renewal of the book's own, so the release is the last word.
        """
        if lease.ended:
            return False
        lease.renewing = True
        return True

    def confirmed(self, lease: Lease, expires_at: float | None) -> Release | None:
        """The confirmation of ``lease`` came back, renewing it until ``expires_at``.

        None: SQS did not confirm it, and it is not added. A lease that ended meanwhile is
        not added either; the release it was waiting for, returned, can go out now.
        """
        lease.renewing = False
        if lease.ended:
            return self._take_pending_release(lease)
        if expires_at is not None:
            lease.expires_at = expires_at
            self.add(lease)
        return None

    def _take_pending_release(self, lease: Lease) -> Release | None:
        """The release that waited for a renewal of ``lease`` to come back, if any."""
        release, lease.pending_release = lease.pending_release, None
        self._releases_waiting.discard(lease)
        return release

    def suspend(self, lease: Lease) -> None:
        """Its delete is on the wire: still renewed, so that a slow delete cannot outlast it."""
        lease.deleting = True

    def resume(self, lease: Lease) -> None:
        """Renew ``lease`` again after its delete failed; due at once if it is overdue."""
        lease.deleting = False
        if not lease.ended and not self._schedule.holds(lease):
            self.add(lease)

    def releases_waiting(self) -> bool:
        """Whether a release still waits for a renewal on the wire to come back."""
        return bool(self._releases_waiting)

    def has_due(self, now: float) -> bool:
        """Whether a due or exhausted lease (or a stale entry) waits: O(queues)."""
        return self._schedule.has_due(now)

    def take_exhausted(self, now: float, limit: int | None = None) -> list[Lease]:
        """Due leases that cannot get another second: no longer renewed, nor held."""
        return self._schedule.take_exhausted(now, limit)

    def due_batches(self, now: float, limit: int | None = None) -> list[RenewalBatch]:
        """The renewal calls to make at ``now``: see :meth:`RenewalSchedule.due_batches`."""
        return self._schedule.due_batches(now, limit)

    def settle(
        self, batch: RenewalBatch, results: Mapping[Lease, tuple[EntryResult, str]], now: float
    ) -> Settlement:
        """Apply SQS's answer to ``batch``; ``now`` is when the answer arrived."""
        settlement = Settlement()
        for lease, length in batch.entries:
            lease.renewing = False
            outcome, reason = results.get(lease, (EntryResult.TRANSIENT, "no answer"))
            if lease.ended:
                # Acked or released meanwhile: whatever SQS said is moot now, except that
                # the release it was waiting for can go out.
                release = self._take_pending_release(lease)
                if release is not None:
                    settlement.releases.append(release)
            else:
                self._answered(lease, length, outcome, reason, batch, now, settlement)
        return settlement

    def _answered(
        self,
        lease: Lease,
        length: int,
        outcome: EntryResult,
        reason: str,
        batch: RenewalBatch,
        now: float,
        settlement: Settlement,
    ) -> None:
        """SQS's answer for ``lease``, held until now: renewed, capped, lost or retried."""
        if outcome is EntryResult.OK:
            # Counted from when the call was sent: SQS started the new lease at some
            # point after that, so this errs on the early side.
            lease.expires_at = batch.sent_at + length
            lease.renewals += 1
            settlement.renewed.append((lease, length))
            if length >= lease.policy.visibility_timeout:
                self._schedule.renewed(lease)
                return
            settlement.capped.append(lease)
        elif outcome is EntryResult.BEYOND_LIMIT:
            # At the hold limit by SQS's clock: its last renewal holds, and no more.
            settlement.capped.append(lease)
        elif outcome is EntryResult.LOST:
            # While deleting: the delete landed first, no loss.
            if not lease.deleting:
                settlement.lost.append((lease, reason))
        elif now >= lease.expires_at:
            settlement.lost.append((lease, f"lease ran out while renewals failed: {reason}"))
        else:
            self._schedule.retry_at(lease, batch.sent_at + self.margin.interval)
            return
        self._schedule.discard(lease)
