"""Celery's events (``celery events``, Flower) through SNS, routed as a topic exchange.

Celery sends every event to ``celeryev``, a topic exchange, and each monitor binds a
queue of its own to it with a routing-key pattern (``#``, ``task.#``, ``worker.#``).
On SQS a binding lives only in the memory of the process that declared it, so a worker
published its events to nobody: ``celery events`` and Flower saw nothing, and said
nothing. Celery switches the exchange to fanout only for Redis and Pub/Sub
(``celery.events.event.get_exchange``), by the transport's name.

With the transport option ``events_through_sns`` (which needs ``supports_fanout``, and
kombu 5.7's SNS fanout), the channel routes ``celeryev`` through the SNS topic kombu makes
for a fanout exchange: a published event goes to the topic, each monitor's queue is
subscribed to it when its consumer starts, and the pattern of the queue's binding is
applied where the event arrives (:func:`wanted`), since SNS knows nothing of routing
keys. kombu's virtual transport looks an exchange's behaviour up by its declared type
(``Channel.typeof``); the channel answers with :class:`SnsTopicExchange` for this one
exchange only, so other topic exchanges (task routing) keep their in-process routing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any, Protocol

import kombu
from celery.events.event import EVENT_EXCHANGE_NAME
from celery.utils.log import get_logger
from kombu.transport.virtual.exchange import TopicExchange
from kombu.utils.objects import cached_property

from ..compat import KOMBU_BROADCASTS_THROUGH_SNS
from ..options import InvalidTransportOption, _boolean

__all__ = ["EventFanout", "FanoutPort", "SnsTopicExchange", "events_through_sns", "wanted"]

logger = get_logger(__name__)

#: A binding row of kombu's virtual exchange table: (routing key, regex pattern, queue).
Binding = tuple[str, "str | None", str]


def events_through_sns(options: Mapping[str, Any]) -> bool:
    """The ``events_through_sns`` option, checked: it needs ``supports_fanout``."""
    wanted_on = _boolean(options, "events_through_sns", False)
    if wanted_on and options.get("supports_fanout") is not True:
        raise InvalidTransportOption(
            "events_through_sns=True: needs supports_fanout=True as well, which makes the "
            "SNS topics that carry events and remote control"
        )
    return wanted_on


def wanted(bindings: Iterable[Binding], queue: str, routing_key: str) -> bool:
    """Whether an event with ``routing_key`` is for ``queue``, by its topic bindings.

    A queue this process never bound (no row names it) takes everything: there is no
    pattern to judge by, and dropping would lose what it asked for elsewhere.
    """
    patterns = [pattern for _, pattern, bound in bindings if bound == queue]
    if not patterns:
        return True
    return any(pattern is None or re.match(pattern, routing_key) for pattern in patterns)


class SnsTopicExchange(TopicExchange):
    """A topic exchange whose messages go to every subscribed queue through SNS.

    Bindings keep their patterns (:meth:`prepare_bind` is the topic exchange's); the
    filtering happens on the receiving side, in :meth:`EventFanout.consumer_callback`.
    """

    type = "topic"

    def deliver(self, message: Any, exchange: str, routing_key: str, **kwargs: Any) -> None:
        self.channel._put_fanout(exchange, message, routing_key, **kwargs)


class FanoutPort(Protocol):
    """What the event fanout reads of its kombu channel."""

    @property
    def transport_options(self) -> Mapping[str, Any]: ...

    @property
    def state(self) -> Any: ...

    def get_table(self, exchange: Any) -> list[Binding]: ...


class EventFanout:
    """Routes Celery's event exchange through SNS when asked to, for one channel."""

    def __init__(self, channel: FanoutPort) -> None:
        self._channel = channel

    @cached_property
    def through_sns(self) -> bool:
        """Whether the options ask for it and this kombu can."""
        asked = events_through_sns(self._channel.transport_options)
        if asked and not KOMBU_BROADCASTS_THROUGH_SNS:
            _warn_events_need_sns()
        return asked and KOMBU_BROADCASTS_THROUGH_SNS

    @cached_property
    def _sns_topic_exchange(self) -> SnsTopicExchange:
        return SnsTopicExchange(self._channel)

    def routes(self, exchange: str | None) -> bool:
        """Whether ``exchange`` is Celery's event exchange, declared as a topic, and routed."""
        if exchange != EVENT_EXCHANGE_NAME or not self.through_sns:
            return False
        declared = self._channel.state.exchanges.get(exchange)
        return declared is not None and declared["type"] == "topic"

    def exchange_type(self, exchange: str) -> SnsTopicExchange | None:
        """The exchange type that delivers ``exchange`` through SNS; None: kombu's own."""
        return self._sns_topic_exchange if self.routes(exchange) else None

    def consumer_callback(
        self, queue: str, no_ack: bool, callback: Callable[[Any], Any]
    ) -> Callable[[Any], Any]:
        """``callback``, given only the events the queue's binding patterns match.

        SNS hands a queue every event on the topic; one the queue did not ask for is
        dropped here (acked first, if the consumer acks). Any callback as it is, unless
        events go through SNS.
        """
        if not self.through_sns:
            return callback

        def deliver_if_wanted(message: Any) -> Any:
            info = message.delivery_info or {}
            exchange = info.get("exchange")
            if self.routes(exchange) and not wanted(
                self._channel.get_table(exchange), queue, info.get("routing_key") or ""
            ):
                if not no_ack:
                    message.ack()
                return None
            return callback(message)

        return deliver_if_wanted


@cache
def _warn_events_need_sns() -> None:
    logger.warning(
        "events_through_sns is set, but this kombu (%s) has no SNS fanout for SQS, which "
        "came in kombu 5.7: events (celery events, Flower) stay in the worker",
        kombu.__version__,
    )
