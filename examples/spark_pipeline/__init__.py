"""A PySpark pipeline dispatched by Celery over SQS, kept invisible by the heartbeat transport.

See README.md in this directory. PySpark comes from the ``spark`` extra.
"""
