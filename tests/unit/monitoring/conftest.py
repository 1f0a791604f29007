"""What the monitoring tests share: lease counters with a known history."""

from __future__ import annotations

import pytest

from celery_sqs_heartbeat.monitoring.metrics import LeaseMetrics


@pytest.fixture
def history() -> LeaseMetrics:
    """Counters in which every counter moved, so that an exporter that drops or mixes up
    one shows it: two renewal calls, four margins over several buckets, failures of two
    kinds, a lost lease, releases, a receive error, deletes and two delete failures, one
    of them retried."""
    counters = LeaseMetrics()
    counters.set_leases_held(3)
    counters.record_renewal_call(entries=4)
    counters.record_renewal_call(entries=2)
    for margin in (0.3, 4.0, 4.5, 12.0):
        counters.record_renewal_margin(margin)
    counters.record_renewal_failure("ThrottlingException", entries=2)
    counters.record_renewal_failure("MessageNotInflight")
    counters.record_lease_lost()
    counters.record_released(5)
    counters.record_receive_error("ReadTimeoutError")
    counters.set_deletes_pending(1)
    counters.record_delete_call(deleted=7)
    counters.record_delete_failure("ReceiptHandleIsInvalid", retried=False)
    counters.record_delete_failure("InternalError", retried=True)
    return counters
