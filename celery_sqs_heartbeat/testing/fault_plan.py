"""Which configured fault, if any, a call arriving at the strict SQS server meets."""

from __future__ import annotations

import threading
import time
from typing import Any

from .faults import (
    CountedFault,
    EntryFault,
    Failure,
    FailureFraction,
    Latency,
    Outage,
    applies,
)


class FaultPlan:
    """Every fault configured on the server, shared by the request threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counted: dict[str, list[CountedFault]] = {}
        self._entries: dict[str, list[EntryFault]] = {}
        self._outages: list[Outage] = []
        self._fractions: list[FailureFraction] = []
        self._latencies: list[Latency] = []

    def add_fault(self, action: str, fault: CountedFault) -> None:
        with self._lock:
            self._counted.setdefault(action, []).append(fault)

    def add_entry_fault(self, action: str, fault: EntryFault) -> None:
        with self._lock:
            self._entries.setdefault(action, []).append(fault)

    def add_outage(self, outage: Outage) -> None:
        with self._lock:
            self._outages.append(outage)

    def end_outages(self) -> None:
        with self._lock:
            self._outages.clear()

    def add_fraction(self, fraction: FailureFraction) -> None:
        with self._lock:
            self._fractions.append(fraction)

    def add_latency(self, latency: Latency) -> None:
        with self._lock:
            self._latencies.append(latency)

    def clear(self) -> None:
        with self._lock:
            self._counted.clear()
            self._entries.clear()
            self._outages.clear()
            self._fractions.clear()
            self._latencies.clear()

    def latency(self, action: str) -> float:
        """The extra delay of a call of ``action``: the sum of every latency that applies."""
        with self._lock:
            return sum(lat.seconds for lat in self._latencies if applies(lat.actions, action))

    def take_fault(self, action: str) -> Failure | None:
        """How a call of ``action`` that arrives now fails, if it does.

        A fault planned for the next calls comes first, so that it hits exactly the calls
        a test meant; then an outage; the fractions draw last, so that their generators
        only advance for calls that nothing else failed.
        """
        with self._lock:
            planned = self._counted.get(action)
            if planned:
                fault = planned[0]
                fault.remaining -= 1
                if fault.remaining == 0:
                    planned.pop(0)
                return fault.failure
            self._drop_ended_outages()
            for outage in self._outages:
                if applies(outage.actions, action):
                    return outage.failure
            for fraction in self._fractions:
                if applies(fraction.actions, action) and (
                    fraction.rng.random() < fraction.probability
                ):
                    return fraction.failure
            return None

    def take_entry_fault(self, action: str) -> str | None:
        """The error code the next entry of a batch call of ``action`` fails with, if any."""
        with self._lock:
            planned = self._entries.get(action)
            if not planned:
                return None
            fault = planned[0]
            fault.remaining -= 1
            if fault.remaining == 0:
                planned.pop(0)
            return fault.code

    def pending(self) -> list[dict[str, Any]]:
        """What can still affect a call, shape by shape, each in the order it was added."""
        with self._lock:
            self._drop_ended_outages()
            now = time.monotonic()
            return [
                *(f.describe(action) for action, faults in self._counted.items() for f in faults),
                *(f.describe(action) for action, faults in self._entries.items() for f in faults),
                *(outage.describe(now) for outage in self._outages),
                *(fraction.describe() for fraction in self._fractions),
                *(latency.describe() for latency in self._latencies),
            ]

    def _drop_ended_outages(self) -> None:
        now = time.monotonic()
        self._outages = [outage for outage in self._outages if outage.until > now]
