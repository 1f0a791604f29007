"""How many ReceiveMessage calls a queue keeps in flight, and how many messages they ask for.

kombu's receive loop on a queue is one *chain*: a receive, its answer delivered, the next
receive. One chain bounds a queue at ten messages a round trip, about 330 a second at
SQS's 15 ms, however much room the prefetch window has and however many tasks wait.
Here a queue may run several chains side by side:

- The prefetch window is cut into full calls (ten messages, or half a small window),
  and a queue runs at most as many chains as it holds full calls, and at most
  ``receives_in_flight``: 2 for a window of 16 (receives of eight), 3 for 32, 4 for 40.
- A full answer (as many messages as were asked for) shows a backlog: its chain goes on,
  and another starts while the queue has fewer than that. A chain that finds the window
  short of room for its call waits for acks to free it, as kombu's one chain does
  (:class:`~celery_sqs_heartbeat.receiving.prefetch.PrefetchRoom`).
- A receive long-polls only while it is the queue's only one on the wire; beside others
  it asks with no wait, so an idle queue costs one long poll at a time, not several.
- An answer that is not full, or a failed receive, ends a chain unless it is the
  queue's last: a drained queue is back to kombu's one chain after one answer per extra
  chain, and a failing queue waits out its backoff with one.
- FIFO queues keep one chain: SQS's group lock then hands a group's messages over one at
  a time, in order (see :func:`receive_size`).

A queue's receives on the wire hold their room in the window: each is sized to what the
window has left after the queue's others, so a queue never asks for more messages than
the window takes (a message received but not started is a lease renewed for nothing).
The blocking receive loop (gevent, eventlet) runs its chains as rounds of calls side by
side (:meth:`ReceiveChains.round`). Pure; the event loop's chains are kept on the loop,
a blocking round is planned and settled in the loop's own greenlet, and only
:meth:`~ReceiveChains.free_room` is read from elsewhere (acks on pool threads: one dict
lookup).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..aws.sqs_facts import is_fifo

__all__ = [
    "DEFAULT_RECEIVES_IN_FLIGHT",
    "FAILED",
    "MAX_RECEIVES_IN_FLIGHT",
    "Receive",
    "ReceiveChains",
    "most_receives_in_flight",
    "receive_size",
]

#: Chains on one queue unless ``receives_in_flight`` says otherwise: enough for a
#: prefetch window of 40 to fill with full calls of ten.
DEFAULT_RECEIVES_IN_FLIGHT = 4

#: The most ``receives_in_flight`` may be: botocore keeps ten connections per client
#: (``max_pool_connections``) and kombu's event-loop HTTP client ten requests at a time
#: (``CurlClient(max_clients=10)``); more would wait for a connection, not be in flight.
MAX_RECEIVES_IN_FLIGHT = 10


def most_receives_in_flight(receives_in_flight: int, tasks_run_on_the_loop: bool) -> int:
    """The chains a queue may run: ``receives_in_flight``, or one on a worker whose tasks
    run on the event loop (the solo pool), where an answer that comes in during a task
    waits unread past its lease (:mod:`~celery_sqs_heartbeat.startup.solo_loop`)."""
    return 1 if tasks_run_on_the_loop else receives_in_flight


#: What an answer "returned" when its receive failed, or was not made (a queue in backoff).
FAILED = -1


@dataclass(frozen=True)
class Receive:
    """One ReceiveMessage to send: how many messages it asks for, and whether it waits.

    ``long_poll`` False sends ``WaitTimeSeconds`` 0: other receives of the queue are on
    the wire, and one of them waits for an idle queue already.
    """

    size: int
    long_poll: bool


class ReceiveChains:
    """One channel's receive chains, per queue, and the room their receives hold.

    ``room`` is how many more messages the prefetch window takes (None: unlimited);
    ``full_call`` how many make a full call on a queue (ten, or half a small window, one
    on FIFO queues); ``window`` is the window's size (0: unlimited); ``most`` is
    ``receives_in_flight``. Queues are named as SQS knows them (kombu's canonical names).
    """

    def __init__(
        self,
        room: Callable[[], int | None],
        full_call: Callable[[str], int],
        window: Callable[[], int],
        most: int,
    ) -> None:
        self._room = room
        self._full_call = full_call
        self._window = window
        self._most = most
        self._chains: dict[str, int] = {}
        #: Receives on the wire per queue, and the messages each queue's receives asked for.
        self._on_wire: dict[str, int] = {}
        self._asked: dict[str, int] = {}
        #: Per queue, how many calls the blocking loop's next round makes side by side.
        self._next_round: dict[str, int] = {}

    def free_room(self, queue: str) -> int | None:
        """The window's room less what ``queue``'s receives on the wire asked for.

        Per queue, as kombu sizes each queue's receive by the whole window: a worker on
        two queues keeps a long poll out on each, so that neither waits for the other's
        poll to end (kombu's own way of asking for more than the window across queues).
        """
        room = self._room()
        if room is None:
            return None
        return room - self._asked.get(queue, 0)

    def chains(self, queue: str) -> int:
        return self._chains.get(queue, 0)

    def turn(self, queue: str) -> None:
        """A chain's turn comes; the first turn of a queue with none starts one (kombu's,
        from ``basic_consume``)."""
        if not self.chains(queue):
            self._chains[queue] = 1

    def most_chains(self, queue: str) -> int:
        """As many chains as the window holds full calls, at most ``receives_in_flight``."""
        if is_fifo(queue):
            return 1
        window = self._window()
        if not window:
            return self._most
        return max(1, min(self._most, window // self._full_call(queue)))

    def may_end(self, queue: str) -> bool:
        """Whether a chain that has to wait (a failing queue's backoff) ends instead.

        One chain per queue waits; the others end, and the backlog starts them again.
        """
        if self.chains(queue) > 1:
            self.end(queue)
            return True
        return False

    def end(self, queue: str) -> None:
        """A chain ends: its queue is no longer consumed, or it is an extra one not needed."""
        left = self.chains(queue) - 1
        if left > 0:
            self._chains[queue] = left
        else:
            self._chains.pop(queue, None)

    def sending(self, queue: str, wanted: int) -> Receive:
        """A receive goes out on ``queue`` for at most ``wanted``: its size and its wait.

        At most a full call once a queue may run several chains (so that the window holds
        them), and at most what the window has left beside the receives on the wire (at
        least one: the loop only turns when the window has room). It holds that room
        until its answer.
        """
        if self._most > 1:
            wanted = min(wanted, self._full_call(queue))
        free = self.free_room(queue)
        size = wanted if free is None else max(1, min(wanted, free))
        long_poll = not self._on_wire.get(queue)
        self._on_wire[queue] = self._on_wire.get(queue, 0) + 1
        self._asked[queue] = self._asked.get(queue, 0) + size
        return Receive(size, long_poll)

    def answered(self, queue: str, asked: int) -> None:
        """A receive's answer (or its failure) came back: the room it held is the window's again.

        What it brought is in the window from now on (kombu's QoS, or the messages being
        read from S3), or was never received.
        """
        on_wire = self._on_wire.get(queue, 0) - 1
        if on_wire > 0:
            self._on_wire[queue] = on_wire
            self._asked[queue] = max(0, self._asked.get(queue, 0) - asked)
        else:
            self._on_wire.pop(queue, None)
            self._asked.pop(queue, None)

    def after_answer(self, queue: str, asked: int, returned: int) -> tuple[bool, bool]:
        """After an answer is delivered: whether its chain goes on, and whether another starts.

        ``returned`` is :data:`FAILED` for a failed receive. A full answer goes on, and
        starts another chain while the queue has fewer than :meth:`most_chains`; any
        other answer ends the chain unless it is the queue's last.
        """
        if returned < asked or returned <= 0:
            return (not self.may_end(queue), False)
        starts = self.chains(queue) < self.most_chains(queue)
        if starts:
            self._chains[queue] = self.chains(queue) + 1
        return (True, starts)

    def round(self, queue: str, wanted: int) -> list[Receive]:
        """The blocking loop's next receives on ``queue``, made side by side.

        One receive as kombu asks (``wanted``, a long poll) unless the last round's
        answers were full: then one call per chain that round kept, plus one, each a full
        call with no wait, as many as the window has room for and :meth:`most_chains`.
        """
        calls = min(self._next_round.get(queue, 1), self.most_chains(queue))
        full = self._full_call(queue)
        room = self._room()
        if room is not None:
            calls = min(calls, room // full)
        if calls <= 1:
            return [Receive(wanted, long_poll=True)]
        return [Receive(full, long_poll=False) for _ in range(calls)]

    def round_answered(self, queue: str, asked_and_returned: list[tuple[int, int]]) -> None:
        """A blocking round came back: its full answers set how many calls the next makes."""
        full_answers = sum(1 for asked, returned in asked_and_returned if 0 < asked == returned)
        if full_answers == 0:
            self._next_round.pop(queue, None)
            return
        grown = full_answers + 1 if full_answers == len(asked_and_returned) else full_answers
        self._next_round[queue] = max(1, min(self._most, grown))


def receive_size(queue_name: str, wanted: int) -> int:
    """How many messages one ReceiveMessage asks for.

    SQS answers with several messages of one FIFO group at once, and Celery would run them
    side by side in its pool. One at a time, SQS's group lock keeps the order: the next
    message of a group comes only after the one before it is deleted or released.
    """
    return 1 if is_fifo(queue_name) else wanted
