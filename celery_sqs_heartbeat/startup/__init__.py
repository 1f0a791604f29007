"""What a worker says at start-up: the mistakes that stop it, and what the transport does."""
