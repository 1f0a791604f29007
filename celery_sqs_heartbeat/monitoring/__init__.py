"""Remote control, events and metrics over SQS and SNS: Flower, ``celery inspect``, Prometheus."""
