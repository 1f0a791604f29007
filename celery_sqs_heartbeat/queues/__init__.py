"""Queues this transport declares and removes: retention, URL cache, clean-up."""
