"""Reaping what killed monitors and workers left on SQS and SNS (``celery sqs-reap``)."""
