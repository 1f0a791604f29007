"""The thin layers that talk to SQS: its facts and limits, and one batch call each."""
