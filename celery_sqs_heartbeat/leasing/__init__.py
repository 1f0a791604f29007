"""Leases from receive to confirmed delete: the book, the manager that renews them, its outbox."""
