"""The receive: kombu's loop kept alive, and each message taken through its steps."""
