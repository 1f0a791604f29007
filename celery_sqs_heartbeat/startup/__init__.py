"""What a worker says at start-up: the mistakes that stop it, the outages of AWS it waits
out, and what the transport does."""
