"""Call slots: a thread a call, at most a limit of them on the wire."""

from __future__ import annotations

import threading

from celery_sqs_heartbeat.aws.calls import CallSlots


class Held:
    """A call that stays on the wire until released."""

    def __init__(self) -> None:
        self.on_wire = threading.Event()
        self.gate = threading.Event()

    def __call__(self) -> None:
        self.on_wire.set()
        assert self.gate.wait(10)


def test_without_a_stagger_every_slot_is_open_until_the_limit() -> None:
    ended: list[int] = []
    slots = CallSlots("renewal", 2, lambda: ended.append(1))
    calls = [Held(), Held()]
    for call in calls:
        slots.start(call)

    assert slots.free == 0
    for call in calls:
        call.gate.set()
    slots.wait_until_idle()
    assert slots.free == 2
    assert len(ended) == 2
