"""Publishing in SendMessageBatch calls inside ``publishing_in_batches()``."""
