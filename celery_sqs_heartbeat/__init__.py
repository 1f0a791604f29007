"""Celery on Amazon SQS, safe for tasks that outlive the visibility timeout.

Turn it on with configuration alone::

    app.conf.broker_url = "sqs://"
    app.conf.broker_transport = "celery_sqs_heartbeat:Transport"
    app.conf.broker_transport_options = {"region": "eu-west-1", "visibility_timeout": 30}
"""

from __future__ import annotations

from .options import HeartbeatOptions, InvalidTransportOption
from .publishing.scope import PublishingFailed, publishing_in_batches
from .transport import Channel, QoS, Transport

__all__ = [
    "Channel",
    "HeartbeatOptions",
    "InvalidTransportOption",
    "PublishingFailed",
    "QoS",
    "Transport",
    "publishing_in_batches",
]
__version__ = "0.1.0"
