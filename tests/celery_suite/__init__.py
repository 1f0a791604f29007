"""Celery's own integration suite (``t/integration``) with this transport as its broker."""
