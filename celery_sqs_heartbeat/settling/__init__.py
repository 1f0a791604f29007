"""Acks and rejects, settled through the lease manager, and which messages Celery will still run."""
