"""The lease counters: recording, snapshots, summary line, failure codes, fork, Prometheus."""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import threading
from typing import Any

import botocore.session
import prometheus_client
import pytest
from botocore.exceptions import ReadTimeoutError
from botocore.stub import Stubber
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from celery_sqs_heartbeat.aws.sqs_queue import SQSQueue
from celery_sqs_heartbeat.leasing.leases import Lease
from celery_sqs_heartbeat.monitoring import prometheus as prometheus_module
from celery_sqs_heartbeat.monitoring.metrics import MARGIN_BUCKETS, LeaseMetrics, failure_code
from celery_sqs_heartbeat.monitoring.prometheus import LeaseMetricsCollector, start_exporter
from celery_sqs_heartbeat.options import HeartbeatOptions, InvalidTransportOption
from celery_sqs_heartbeat.process import ProcessState, snapshot, this_process
from tests.unit.conftest import make_lease

PROMETHEUS_LOGGER = "celery_sqs_heartbeat.monitoring.prometheus"


@pytest.fixture
def counters() -> LeaseMetrics:
    return LeaseMetrics()


@pytest.fixture
def process_counters(process_state: ProcessState) -> LeaseMetrics:
    """The process-wide counters, of a state of the test's own: zero at the start."""
    return process_state.metrics


# --- recording and snapshots ------------------------------------------------------------------


def test_fresh_counters_are_all_zero(counters: LeaseMetrics) -> None:
    current = counters.snapshot()

    assert current.leases_held == 0
    assert current.renewal_calls == current.renewal_entries == 0
    assert current.renewal_failures == {}
    assert current.leases_lost == current.messages_released == 0
    assert current.receive_errors == {}
    assert current.renewal_margin.count == 0
    assert current.renewal_margin.min is None
    assert current.renewal_margin.max is None
    assert current.renewal_margin.quantile_bound(0.5) is None
    assert [seen for _, seen in current.renewal_margin.buckets] == [0] * len(MARGIN_BUCKETS)


def test_each_record_adds_to_its_own_counter(counters: LeaseMetrics) -> None:
    counters.record_renewal_call(10)
    counters.record_renewal_call(3)
    counters.record_renewal_failure("ThrottlingException")
    counters.record_renewal_failure("ThrottlingException", entries=2)
    counters.record_renewal_failure("MessageNotInflight")
    counters.record_lease_lost()
    counters.record_released(4)
    counters.record_receive_error("InternalError")
    counters.record_receive_error("InternalError")
    counters.set_leases_held(7)

    current = counters.snapshot()

    assert current.renewal_calls == 2
    assert current.renewal_entries == 13
    assert current.renewal_failures == {"ThrottlingException": 3, "MessageNotInflight": 1}
    assert current.renewal_failures_total == 4
    assert current.leases_lost == 1
    assert current.messages_released == 4
    assert current.receive_errors == {"InternalError": 2}
    assert current.receive_errors_total == 2
    assert current.leases_held == 7


def test_margins_fill_cumulative_buckets_with_count_sum_min_and_max(
    counters: LeaseMetrics,
) -> None:
    for seconds in (0.2, 0.5, 1.5, 9.0, 75.0):
        counters.record_renewal_margin(seconds)

    margin = counters.snapshot().renewal_margin

    assert dict(margin.buckets) == {
        0.5: 2,  # a bound counts as inside its bucket, as in Prometheus
        1.0: 2,
        2.0: 3,
        5.0: 3,
        10.0: 4,
        20.0: 4,
        30.0: 4,
        60.0: 4,
        math.inf: 5,
    }
    assert margin.count == 5
    assert margin.sum == pytest.approx(86.2)
    assert margin.min == 0.2
    assert margin.max == 75.0


def test_a_renewal_sent_after_the_lease_ran_out_counts_as_a_negative_margin(
    counters: LeaseMetrics,
) -> None:
    counters.record_renewal_margin(-0.3)

    margin = counters.snapshot().renewal_margin

    assert margin.min == -0.3
    assert margin.buckets[0] == (0.5, 1)


@pytest.mark.parametrize(
    ("margins", "quantile", "bound"),
    [
        ([1.5] * 3, 0.5, 1.5),  # the largest margin, when it is below the bucket's bound
        ([0.1, 1.5, 1.5, 8.0], 0.5, 2.0),
        ([0.1, 1.5, 8.0, 8.0], 0.5, 2.0),
        ([0.1, 1.5, 8.0, 8.0], 0.9, 8.0),
        ([0.1, 90.0], 1.0, 90.0),  # in the +Inf bucket: the largest margin
    ],
)
def test_quantile_bound_is_the_bucket_bound_or_the_largest_margin(
    counters: LeaseMetrics, margins: list[float], quantile: float, bound: float
) -> None:
    for seconds in margins:
        counters.record_renewal_margin(seconds)

    assert counters.snapshot().renewal_margin.quantile_bound(quantile) == bound


def test_a_snapshot_does_not_change_with_the_counters_nor_they_with_it(
    counters: LeaseMetrics,
) -> None:
    counters.record_renewal_failure("ThrottlingException")
    before = counters.snapshot()

    counters.record_renewal_failure("ThrottlingException")
    counters.record_renewal_call(1)

    assert before.renewal_failures == {"ThrottlingException": 1}
    assert before.renewal_calls == 0
    with pytest.raises(TypeError):
        before.renewal_failures["Other"] = 5  # type: ignore[index]
    with pytest.raises(AttributeError):
        before.renewal_calls = 3  # type: ignore[misc]
    assert counters.snapshot().renewal_failures == {"ThrottlingException": 2}


def test_snapshots_compare_equal_until_a_counter_moves(counters: LeaseMetrics) -> None:
    counters.record_renewal_margin(2.0)
    assert counters.snapshot() == counters.snapshot()

    first = counters.snapshot()
    counters.record_released(1)

    assert counters.snapshot() != first


def test_as_dict_is_plain_json_with_prometheus_bucket_labels(counters: LeaseMetrics) -> None:
    counters.set_leases_held(2)
    counters.record_renewal_call(2)
    counters.record_renewal_margin(1.25)
    counters.record_renewal_margin(7.0)
    counters.record_renewal_failure("ThrottlingException")
    counters.record_receive_error("ReadTimeoutError")
    counters.set_deletes_pending(4)
    counters.record_delete_call(deleted=9)
    counters.record_delete_failure("InternalError", retried=True)

    data = counters.snapshot().as_dict()

    assert json.loads(json.dumps(data)) == data
    assert data == {
        "leases_held": 2,
        "renewal_calls": 1,
        "renewal_entries": 2,
        "renewal_failures": {"ThrottlingException": 1},
        "leases_lost": 0,
        "messages_released": 0,
        "receive_errors": {"ReadTimeoutError": 1},
        "renewal_margin": {
            "count": 2,
            "sum": 8.25,
            "min": 1.25,
            "max": 7.0,
            "buckets": {
                "0.5": 0,
                "1.0": 0,
                "2.0": 1,
                "5.0": 1,
                "10.0": 2,
                "20.0": 2,
                "30.0": 2,
                "60.0": 2,
                "+Inf": 2,
            },
        },
        "deletes_pending": 4,
        "delete_calls": 1,
        "messages_deleted": 9,
        "delete_failures": {"InternalError": 1},
        "deletes_retried": 1,
    }


def test_reset_brings_every_counter_back_to_zero(counters: LeaseMetrics) -> None:
    counters.record_renewal_call(3)
    counters.record_renewal_margin(1.0)
    counters.record_receive_error("InternalError")
    counters.set_leases_held(3)

    counters.reset()

    assert counters.snapshot() == LeaseMetrics().snapshot()


def test_records_from_many_threads_are_all_counted(counters: LeaseMetrics) -> None:
    def record() -> None:
        for _ in range(500):
            counters.record_renewal_call(2)
            counters.record_renewal_margin(1.0)
            counters.record_receive_error("InternalError")

    threads = [threading.Thread(target=record) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    current = counters.snapshot()
    assert current.renewal_calls == 2000
    assert current.renewal_entries == 4000
    assert current.renewal_margin.count == 2000
    assert current.receive_errors == {"InternalError": 2000}


# --- the summary line ---------------------------------------------------------------------------


def test_the_summary_is_one_line_with_every_counter_and_the_margins(
    history: LeaseMetrics,
) -> None:
    line = history.snapshot().summary()

    assert "\n" not in line
    assert line == (
        "SQS lease summary: held=3 renewal_calls=2 renewal_entries=6 "
        "renewal_failures=3 (MessageNotInflight=1 ThrottlingException=2) lost=1 released=5 "
        "receive_errors=1 (ReadTimeoutError=1) deletes_pending=1 delete_calls=1 deleted=7 "
        "delete_failures=2 (InternalError=1 ReceiptHandleIsInvalid=1) deletes_retried=1 "
        "margin_seconds min=0.30 median<=5.00 max=12.00 (counts since the process started)"
    )


def test_the_summary_before_any_renewal_says_there_is_no_margin_yet(
    counters: LeaseMetrics,
) -> None:
    counters.set_leases_held(1)

    line = counters.snapshot().summary()

    assert line.startswith("SQS lease summary: held=1 renewal_calls=0 ")
    assert "renewal_failures=0 lost=0" in line
    assert "margin_seconds none" in line


# --- failure codes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        ("ThrottlingException: Rate exceeded", "ThrottlingException"),
        ("MessageNotInflight: The specified message isn't in flight.", "MessageNotInflight"),
        ("AWS.SimpleQueueService.MessageNotInflight: gone", "MessageNotInflight"),
        # Counted as it came: the suffix is dropped only to compare codes.
        ("InvalidParameterValueException: gone", "InvalidParameterValueException"),
        ("ReadTimeoutError('Read timeout on endpoint URL: \"https://x\"')", "ReadTimeoutError"),
        ("ConnectionResetError(104, 'Connection reset by peer')", "ConnectionResetError"),
        ("RuntimeError('bug in the queue')", "RuntimeError"),
        ("no answer", "NoAnswer"),
        ("", "Unknown"),
        ("something went wrong", "Unknown"),
    ],
)
def test_failure_code_is_the_code_or_error_name_a_reason_starts_with(
    reason: str, code: str
) -> None:
    assert failure_code(reason) == code


QUEUE_URL = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs"


@pytest.fixture(scope="module")
def source() -> Any:
    return botocore.session.Session().create_client(
        "sqs", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x"
    )


def renewals_of(source: Any) -> SQSQueue:
    """The queue as the process's lease targets make it: calls on the renewal client."""
    return SQSQueue("jobs", QUEUE_URL, lambda: this_process().clients.renewal(source))


def two_leases() -> list[tuple[Lease, int]]:
    return [(make_lease("jobs", task_id=f"t{i}", receipt_handle=f"h{i}"), 30) for i in range(2)]


def test_failure_codes_of_the_sqs_layers_per_entry_answers(source: Any) -> None:
    entries = two_leases()
    with Stubber(this_process().clients.renewal(source)) as stub:
        stub.add_response(
            "change_message_visibility_batch",
            {
                "Successful": [],
                "Failed": [
                    {"Id": "0", "SenderFault": True, "Code": "ThrottlingException", "Message": "x"},
                    {
                        "Id": "1",
                        "SenderFault": True,
                        "Code": "AWS.SimpleQueueService.MessageNotInflight",
                        "Message": "gone",
                    },
                ],
            },
        )
        results = renewals_of(source).change_visibility(entries)

    codes = [failure_code(results[lease][1]) for lease, _ in entries]
    assert codes == ["ThrottlingException", "MessageNotInflight"]


def test_failure_codes_of_the_sqs_layers_whole_call_errors(source: Any) -> None:
    entries = two_leases()
    with Stubber(this_process().clients.renewal(source)) as stub:
        stub.add_client_error("change_message_visibility_batch", "InternalError", "oops", 500)
        results = renewals_of(source).change_visibility(entries)

    assert {failure_code(reason) for _, reason in results.values()} == {"InternalError"}


def test_failure_codes_of_the_sqs_layers_network_faults(source: Any) -> None:
    def fail(**_: Any) -> None:
        raise ReadTimeoutError(endpoint_url=QUEUE_URL)

    event = "before-send.sqs.ChangeMessageVisibilityBatch"
    events = this_process().clients.renewal(source).meta.events
    events.register(event, fail, unique_id="metrics-network-fault")
    try:
        results = renewals_of(source).change_visibility(two_leases())
    finally:
        events.unregister(event, unique_id="metrics-network-fault")

    assert {failure_code(reason) for _, reason in results.values()} == {"ReadTimeoutError"}


# --- the process's counters ----------------------------------------------------------------


def test_the_snapshot_function_reads_the_process_counters(process_counters: LeaseMetrics) -> None:
    this_process().metrics.record_receive_error("AccessDenied")
    process_counters.record_renewal_call(1)

    assert snapshot().receive_errors == {"AccessDenied": 1}
    assert snapshot().renewal_calls == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_starts_from_zero(process_counters: LeaseMetrics) -> None:
    this_process().metrics.record_receive_error("InternalError")
    process_counters.set_leases_held(3)

    pid = os.fork()
    if pid == 0:  # the child: report through the exit status, never back into pytest
        code = 2
        try:
            fresh = snapshot()
            code = 0 if fresh.receive_errors == {} and fresh.leases_held == 0 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)

    assert os.waitstatus_to_exitcode(status) == 0
    assert snapshot().receive_errors == {"InternalError": 1}


# --- the Prometheus collector and exporter -------------------------------------------------


def scrape(collector: LeaseMetricsCollector) -> dict[str, float]:
    """Every sample a private registry with the collector exposes, by name and labels."""
    registry = CollectorRegistry()
    registry.register(collector)
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def test_the_collector_exposes_every_counter_in_prometheus_terms(history: LeaseMetrics) -> None:
    samples = scrape(LeaseMetricsCollector(history.snapshot))

    margin = "celery_sqs_heartbeat_renewal_margin_seconds"
    assert samples == {
        "celery_sqs_heartbeat_leases_held": 3,
        "celery_sqs_heartbeat_renewal_calls_total": 2,
        "celery_sqs_heartbeat_renewal_entries_total": 6,
        "celery_sqs_heartbeat_renewal_failures_total{code=MessageNotInflight}": 1,
        "celery_sqs_heartbeat_renewal_failures_total{code=ThrottlingException}": 2,
        "celery_sqs_heartbeat_leases_lost_total": 1,
        "celery_sqs_heartbeat_messages_released_total": 5,
        "celery_sqs_heartbeat_receive_errors_total{code=ReadTimeoutError}": 1,
        "celery_sqs_heartbeat_deletes_pending": 1,
        "celery_sqs_heartbeat_delete_calls_total": 1,
        "celery_sqs_heartbeat_messages_deleted_total": 7,
        "celery_sqs_heartbeat_delete_failures_total{code=InternalError}": 1,
        "celery_sqs_heartbeat_delete_failures_total{code=ReceiptHandleIsInvalid}": 1,
        "celery_sqs_heartbeat_deletes_retried_total": 1,
        f"{margin}_bucket{{le=0.5}}": 1,
        f"{margin}_bucket{{le=1.0}}": 1,
        f"{margin}_bucket{{le=2.0}}": 1,
        f"{margin}_bucket{{le=5.0}}": 3,
        f"{margin}_bucket{{le=10.0}}": 3,
        f"{margin}_bucket{{le=20.0}}": 4,
        f"{margin}_bucket{{le=30.0}}": 4,
        f"{margin}_bucket{{le=60.0}}": 4,
        f"{margin}_bucket{{le=+Inf}}": 4,
        f"{margin}_count": 4,
        f"{margin}_sum": pytest.approx(20.8),
    }


#: Every family of the Prometheus page, in its order: name, type and HELP text.
FAMILIES = [
    ("leases_held", "gauge", "SQS leases this process is renewing now."),
    ("renewal_calls_total", "counter", "ChangeMessageVisibilityBatch calls made to renew leases."),
    ("renewal_entries_total", "counter", "Lease renewals sent (entries of the renewal calls)."),
    (
        "renewal_failures_total",
        "counter",
        "Lease renewals that failed, by SQS error code or network error.",
    ),
    (
        "leases_lost_total",
        "counter",
        "Leases lost while their task was pending: SQS may deliver those messages again.",
    ),
    (
        "messages_released_total",
        "counter",
        "Messages made visible again on reject, requeue or shutdown.",
    ),
    (
        "receive_errors_total",
        "counter",
        "Failed ReceiveMessage calls, by SQS error code or network error.",
    ),
    (
        "deletes_pending",
        "gauge",
        "Acked messages whose delete SQS has not confirmed yet; their leases are held.",
    ),
    ("delete_calls_total", "counter", "DeleteMessageBatch calls made for acked messages."),
    ("messages_deleted_total", "counter", "Acked messages whose delete SQS confirmed."),
    (
        "delete_failures_total",
        "counter",
        "Deletes that failed, by SQS error code or network error.",
    ),
    ("deletes_retried_total", "counter", "Failed deletes tried again while their lease held."),
    (
        "renewal_margin_seconds",
        "histogram",
        "Seconds a lease still had when its renewal was sent; near 0 means renewals are late "
        "(tune visibility_extension_threshold).",
    ),
]


def test_the_page_describes_every_family_in_order(counters: LeaseMetrics) -> None:
    registry = CollectorRegistry()
    registry.register(LeaseMetricsCollector(counters.snapshot))

    page = generate_latest(registry).decode()

    described = [line for line in page.splitlines() if line.startswith("# ")]
    expected = []
    for name, kind, documentation in FAMILIES:
        expected.append(f"# HELP celery_sqs_heartbeat_{name} {documentation}")
        expected.append(f"# TYPE celery_sqs_heartbeat_{name} {kind}")
    assert described == expected


def test_the_collector_reads_the_counters_at_every_scrape(counters: LeaseMetrics) -> None:
    registry = CollectorRegistry()
    registry.register(LeaseMetricsCollector(counters.snapshot))
    assert registry.get_sample_value("celery_sqs_heartbeat_renewal_calls_total") == 0

    counters.record_renewal_call(1)

    assert registry.get_sample_value("celery_sqs_heartbeat_renewal_calls_total") == 1


def test_the_collector_reads_the_process_counters_by_default(
    process_counters: LeaseMetrics,
) -> None:
    process_counters.record_receive_error("ReadTimeoutError")

    samples = scrape(LeaseMetricsCollector())

    assert samples["celery_sqs_heartbeat_receive_errors_total{code=ReadTimeoutError}"] == 1


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Calls of prometheus-client's start_http_server, which binds nothing here."""
    monkeypatch.setattr(prometheus_module, "_exporter_started", False)
    calls: list[dict[str, Any]] = []

    def start_http_server(port: int, addr: str, registry: CollectorRegistry) -> None:
        calls.append({"port": port, "addr": addr, "registry": registry})

    monkeypatch.setattr(prometheus_client, "start_http_server", start_http_server)
    return calls


def test_no_exporter_starts_while_metrics_port_is_unset(servers: list[dict[str, Any]]) -> None:
    start_exporter(HeartbeatOptions())

    assert servers == []


def test_the_exporter_starts_once_per_process_with_its_own_registry(
    servers: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    options = HeartbeatOptions(metrics_port=9464, metrics_address="127.0.0.1")

    with caplog.at_level(logging.INFO, logger=PROMETHEUS_LOGGER):
        start_exporter(options)
        start_exporter(options)  # every consumer of the worker calls it

    (server,) = servers
    assert (server["port"], server["addr"]) == (9464, "127.0.0.1")
    page = generate_latest(server["registry"]).decode()
    assert "celery_sqs_heartbeat_renewal_calls_total" in page
    assert "python_gc" not in page  # not prometheus-client's global registry
    (info,) = [r.getMessage() for r in caplog.records if r.name == PROMETHEUS_LOGGER]
    assert "http://127.0.0.1:9464/metrics" in info


def test_without_prometheus_client_the_exporter_names_the_extra_to_install(
    servers: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails

    with pytest.raises(InvalidTransportOption) as raised:
        start_exporter(HeartbeatOptions(metrics_port=9464))

    assert str(raised.value) == (
        "metrics_port=9464: the Prometheus exporter needs prometheus-client; "
        "install it with: pip install 'celery-sqs-heartbeat[prometheus]'"
    )


def test_a_port_in_use_logs_one_error_and_the_worker_goes_on(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(prometheus_module, "_exporter_started", False)
    attempts: list[int] = []

    def start_http_server(port: int, addr: str, registry: CollectorRegistry) -> None:
        attempts.append(port)
        raise OSError(98, "Address already in use")

    monkeypatch.setattr(prometheus_client, "start_http_server", start_http_server)
    options = HeartbeatOptions(metrics_port=9464)

    with caplog.at_level(logging.INFO, logger=PROMETHEUS_LOGGER):
        start_exporter(options)
        start_exporter(options)

    assert attempts == [9464]  # not retried by every consumer
    (error,) = [r for r in caplog.records if r.name == PROMETHEUS_LOGGER]
    assert error.levelno == logging.ERROR
    assert "0.0.0.0 port 9464" in error.getMessage()
    assert "Address already in use" in error.getMessage()
