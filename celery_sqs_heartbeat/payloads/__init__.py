"""Bodies too large for SQS, kept in S3: the pointer format, its options, the S3 calls."""
