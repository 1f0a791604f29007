"""Transport options: defaults, validation messages, near-miss warnings, backoff schedule."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kombu.transport import SQS

from celery_sqs_heartbeat import options as options_module
from celery_sqs_heartbeat.options import (
    OPTION_NAMES,
    HeartbeatOptions,
    InvalidTransportOption,
    warn_about_options,
)

OPTIONS_LOGGER = "celery_sqs_heartbeat.options"
KOMBU_DEFAULT_LEASE = SQS.Channel.default_visibility_timeout


@pytest.fixture(autouse=True)
def fresh_warnings() -> None:
    """The option warnings are logged once per process; each test starts afresh."""
    options_module._warn_leases_not_renewed.cache_clear()
    options_module._warn_near_miss.cache_clear()


def parse(**options: Any) -> HeartbeatOptions:
    """The options read, and warned about, as a connection does."""
    parsed = HeartbeatOptions.from_transport_options(options)
    warn_about_options(options, parsed)
    return parsed


def test_defaults_when_no_option_is_given() -> None:
    options = parse()

    assert options.visibility_timeout == 30
    assert options.visibility_extension is True
    assert options.visibility_extension_threshold is None  # the adaptive margin
    assert options.visibility_extension_interval == 1
    assert options.visibility_extension_max is None
    assert options.release_delay == (0,)
    assert options.release_on_shutdown is True
    assert options.release_on_failure is False
    assert options.ack_batching is True
    assert options.ack_batch_interval == 0.5


@pytest.mark.parametrize(
    ("given", "threshold", "interval"),
    [
        ({"visibility_timeout": 600}, None, 1),
        ({"visibility_timeout": 8}, None, 1),
        ({"visibility_timeout": 2}, None, 0.5),
        ({"visibility_timeout": 30, "visibility_extension_threshold": 1}, 1, 0.5),
        ({"visibility_timeout": 30, "visibility_extension_threshold": 15}, 15, 1),
    ],
)
def test_threshold_is_adaptive_unless_given_and_interval_half_the_margin_ceiling_up_to_1(
    given: dict[str, Any], threshold: float, interval: float
) -> None:
    options = parse(**given)

    assert options.visibility_extension_threshold == threshold
    assert options.visibility_extension_interval == interval


def test_given_values_are_kept() -> None:
    options = parse(
        visibility_timeout=120,
        visibility_extension_threshold=40,
        visibility_extension_interval=5,
        visibility_extension_max=3600,
        release_on_failure=True,
        release_delay=[10, 60, 600],
        release_on_shutdown=False,
    )

    assert options == HeartbeatOptions(
        visibility_timeout=120,
        visibility_extension=True,
        visibility_extension_threshold=40.0,
        visibility_extension_interval=5.0,
        visibility_extension_max=3600.0,
        release_on_failure=True,
        release_delay=(10, 60, 600),
        release_on_shutdown=False,
    )


def test_whole_floats_are_accepted_as_integers() -> None:
    options = parse(visibility_timeout=30.0, release_delay=[5.0, 60.0])

    assert options.visibility_timeout == 30
    assert type(options.visibility_timeout) is int
    assert options.release_delay == (5, 60)
    assert all(type(delay) is int for delay in options.release_delay)


def test_a_single_release_delay_becomes_a_one_step_schedule() -> None:
    assert parse(release_delay=45).release_delay == (45,)


@pytest.mark.parametrize(
    ("given", "expected_in_message"),
    [
        # visibility_timeout: whole seconds from 0 to 43200 (2 while extending).
        ({"visibility_timeout": -1}, ["visibility_timeout=-1", "0 to 43200"]),
        ({"visibility_timeout": 43201}, ["visibility_timeout=43201", "0 to 43200"]),
        ({"visibility_timeout": "thirty"}, ["visibility_timeout='thirty'", "0 to 43200"]),
        ({"visibility_timeout": "2.5"}, ["visibility_timeout='2.5'", "0 to 43200"]),
        ({"visibility_timeout": "50000"}, ["visibility_timeout='50000'", "0 to 43200"]),
        ({"visibility_timeout": 2.5}, ["visibility_timeout=2.5", "0 to 43200"]),
        ({"visibility_timeout": True}, ["visibility_timeout=True", "0 to 43200"]),
        ({"visibility_timeout": 1}, ["visibility_timeout=1", "2 to 43200"]),
        ({"visibility_timeout": 0}, ["visibility_timeout=0", "2 to 43200"]),
        # threshold: greater than 0, less than the timeout.
        (
            {"visibility_extension_threshold": 0},
            ["visibility_extension_threshold=0", "greater than 0", "visibility_timeout (30)"],
        ),
        (
            {"visibility_extension_threshold": -5},
            ["visibility_extension_threshold=-5", "greater than 0", "visibility_timeout (30)"],
        ),
        (
            {"visibility_extension_threshold": 30},
            ["visibility_extension_threshold=30", "less than visibility_timeout (30)"],
        ),
        (
            {"visibility_timeout": 60, "visibility_extension_threshold": 75},
            ["visibility_extension_threshold=75", "less than visibility_timeout (60)"],
        ),
        # interval: greater than 0, at most the threshold.
        (
            {"visibility_extension_interval": 0},
            [
                "visibility_extension_interval=0",
                "greater than 0",
                "at most 10 (half the visibility_timeout, 10 at most",
                "visibility_extension_threshold is not set",
            ],
        ),
        (
            {"visibility_timeout": 8, "visibility_extension_interval": 4.5},
            ["visibility_extension_interval=4.5", "at most 4 (half the visibility_timeout"],
        ),
        (
            {"visibility_extension_threshold": 4, "visibility_extension_interval": 4.5},
            ["visibility_extension_interval=4.5", "at most visibility_extension_threshold (4.0)"],
        ),
        # max: from the timeout to 43200.
        (
            {"visibility_extension_max": 29},
            ["visibility_extension_max=29", "visibility_timeout (30) to 43200"],
        ),
        (
            {"visibility_timeout": 600, "visibility_extension_max": 599},
            ["visibility_extension_max=599", "visibility_timeout (600) to 43200"],
        ),
        (
            {"visibility_extension_max": 43201},
            ["visibility_extension_max=43201", "visibility_timeout (30) to 43200"],
        ),
        ({"visibility_extension_max": "x"}, ["visibility_extension_max='x'", "seconds"]),
        ({"visibility_extension_threshold": "ten"}, ["visibility_extension_threshold='ten'"]),
        ({"visibility_extension_threshold": "nan"}, ["visibility_extension_threshold='nan'"]),
        ({"visibility_extension_interval": True}, ["visibility_extension_interval=True"]),
        # release_delay: whole seconds from 0 to 43200, or a non-empty list of them.
        ({"release_delay": -1}, ["release_delay=-1", "0 to 43200"]),
        ({"release_delay": 43201}, ["release_delay=43201", "0 to 43200"]),
        ({"release_delay": [5, 43201]}, ["release_delay=43201", "0 to 43200"]),
        ({"release_delay": ["a"]}, ["release_delay='a'", "0 to 43200"]),
        ({"release_delay": "5s"}, ["release_delay='5s'", "0 to 43200"]),
        ({"release_delay": 1.5}, ["release_delay=1.5", "0 to 43200"]),
        ({"release_delay": []}, ["release_delay=[]", "at least one delay"]),
        # booleans: True or False, nothing truthy.
        ({"visibility_extension": 1}, ["visibility_extension=1", "True or False"]),
        ({"release_on_failure": "yes"}, ["release_on_failure='yes'", "True or False"]),
        ({"release_on_failure": 1}, ["release_on_failure=1", "True or False"]),
        ({"release_on_shutdown": "yes"}, ["release_on_shutdown='yes'", "True or False"]),
        ({"release_on_shutdown": 0}, ["release_on_shutdown=0", "True or False"]),
        ({"ack_batching": "no"}, ["ack_batching='no'", "True or False"]),
        # ack_batch_interval: 0 to 10 s, and under half the lease without renewals.
        ({"ack_batch_interval": -0.1}, ["ack_batch_interval=-0.1", "0 (at once) to 10"]),
        ({"ack_batch_interval": 10.5}, ["ack_batch_interval=10.5", "0 (at once) to 10"]),
        ({"ack_batch_interval": "soon"}, ["ack_batch_interval='soon'", "0 (at once) to 10"]),
        (
            {"visibility_extension": False, "visibility_timeout": 4, "ack_batch_interval": 3},
            ["ack_batch_interval=3", "0 (at once) to 2", "visibility_extension is off"],
        ),
    ],
)
def test_a_bad_option_is_refused_with_its_name_value_and_what_is_allowed(
    given: dict[str, Any], expected_in_message: list[str]
) -> None:
    with pytest.raises(InvalidTransportOption) as raised:
        parse(**given)

    message = str(raised.value)
    for expected in expected_in_message:
        assert expected in message


@pytest.mark.parametrize(
    ("given", "allowed"),
    [
        ({"visibility_extension_max": "x"}, "visibility_timeout (30) to 43200"),
        ({"visibility_extension_threshold": "x"}, "less than visibility_timeout (30)"),
    ],
)
def test_a_seconds_option_of_the_wrong_type_is_refused_with_the_allowed_range(
    given: dict[str, Any], allowed: str
) -> None:
    with pytest.raises(InvalidTransportOption) as raised:
        parse(**given)

    assert allowed in str(raised.value)


def test_invalid_transport_option_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse(visibility_timeout=-1)


def test_extension_off_skips_the_extension_checks() -> None:
    options = parse(
        visibility_extension=False,
        visibility_timeout=0,
        visibility_extension_threshold="x",
        visibility_extension_interval=-1,
        visibility_extension_max=1,
    )

    assert options.visibility_extension is False
    assert options.visibility_timeout == 0
    assert options.visibility_extension_max is None


@pytest.mark.parametrize(
    "given",
    [
        {"visibility_timeout": -1},
        {"visibility_timeout": 43201},
        {"release_delay": -1},
        {"release_on_failure": "yes"},
    ],
)
def test_extension_off_still_checks_the_other_options(given: dict[str, Any]) -> None:
    with pytest.raises(InvalidTransportOption):
        parse(visibility_extension=False, **given)


def test_visibility_extension_max_of_none_means_no_limit() -> None:
    assert parse(visibility_extension_max=None).visibility_extension_max is None


@pytest.mark.parametrize(("low", "high"), [(30, 30), (30, 43200)])
def test_visibility_extension_max_bounds_are_inclusive(low: int, high: int) -> None:
    options = parse(visibility_timeout=low, visibility_extension_max=high)

    assert options.visibility_extension_max == high


def test_visibility_timeout_bounds_are_inclusive() -> None:
    assert parse(visibility_timeout=43200).visibility_timeout == 43200
    assert parse(visibility_timeout=0, visibility_extension=False).visibility_timeout == 0


@pytest.mark.parametrize(
    ("misspelt", "meant"),
    [
        ("visiblity_timeout", "visibility_timeout"),
        ("release_on_failur", "release_on_failure"),
        ("visibility_extention_threshold", "visibility_extension_threshold"),
        ("release_delays", "release_delay"),
        ("visibility_extension_intervall", "visibility_extension_interval"),
    ],
)
def test_a_near_miss_of_an_option_name_warns_naming_the_intended_option(
    caplog: pytest.LogCaptureFixture, misspelt: str, meant: str
) -> None:
    with caplog.at_level(logging.WARNING, logger=OPTIONS_LOGGER):
        options = parse(**{misspelt: 300})

    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert repr(misspelt) in warnings[0].getMessage()
    assert repr(meant) in warnings[0].getMessage()
    # Ignored, not applied.
    assert options == HeartbeatOptions()


def test_a_near_miss_is_warned_about_once_however_often_the_options_are_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=OPTIONS_LOGGER):
        # A worker builds its transport four times: for Celery's questions, its banner
        # and its consumer; each build reads the options.
        for _ in range(4):
            parse(visiblity_timeout=300)
        parse(release_on_failur=True)

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "'visiblity_timeout'" in warnings[0]
    assert "'release_on_failur'" in warnings[1]


def test_reading_the_options_warns_of_nothing(caplog: pytest.LogCaptureFixture) -> None:
    """A Celery worker reads them before its logging is set up: a warning then is lost."""
    with caplog.at_level(logging.DEBUG, logger=OPTIONS_LOGGER):
        HeartbeatOptions.from_transport_options(
            {"visiblity_timeout": 300, "visibility_extension": False, "visibility_timeout": 60}
        )

    assert caplog.records == []


def test_kombus_own_sqs_options_do_not_warn(caplog: pytest.LogCaptureFixture) -> None:
    kombu_options = {
        "region": "eu-west-1",
        "wait_time_seconds": 20,
        "predefined_queues": {"celery": {"url": "https://sqs.example/celery"}},
        "polling_interval": 1,
        "queue_name_prefix": "dev-",
        "sts_role_arn": "arn:aws:iam::123:role/x",
        "sts_token_timeout": 900,
        "backoff_policy": {1: 10},
        "backoff_tasks": ["tasks.crunch"],
        "fetch_message_attributes": ["All"],
        "is_secure": True,
        "supports_fanout": False,
        "queue_tags": {},
        "client-config": {},
    }
    with caplog.at_level(logging.DEBUG, logger=OPTIONS_LOGGER):
        options = parse(visibility_timeout=60, **kombu_options)

    assert [r for r in caplog.records if r.name == OPTIONS_LOGGER] == []
    assert options.visibility_timeout == 60


@pytest.mark.parametrize(
    ("receive_count", "delay"),
    [(0, 5), (1, 5), (2, 60), (3, 600), (4, 600), (1000, 600), (-3, 5)],
)
def test_release_delay_for_follows_the_schedule_and_repeats_its_last_step(
    receive_count: int, delay: int
) -> None:
    options = parse(release_delay=[5, 60, 600])

    assert options.release_delay_for(receive_count) == delay


@pytest.mark.parametrize("receive_count", [0, 1, 2, 50])
def test_release_delay_for_a_single_delay_is_always_that_delay(receive_count: int) -> None:
    assert parse(release_delay=45).release_delay_for(receive_count) == 45


# --- the Prometheus exporter's options ----------------------------------------------------


def test_the_exporter_is_off_by_default_and_listens_on_every_interface_when_on() -> None:
    assert parse().metrics_port is None
    assert parse().metrics_address == "0.0.0.0"


@pytest.mark.parametrize("port", [1, 9100, 65535])
def test_a_metrics_port_and_address_are_kept(port: int) -> None:
    options = parse(metrics_port=port, metrics_address=" 127.0.0.1 ")

    assert options.metrics_port == port
    assert options.metrics_address == "127.0.0.1"


def test_a_metrics_port_of_none_means_no_exporter() -> None:
    assert parse(metrics_port=None).metrics_port is None


@pytest.mark.parametrize("port", [0, -1, 65536, "9100.0", "http", 9100.0, True])
def test_a_bad_metrics_port_is_refused_with_the_allowed_range(port: Any) -> None:
    with pytest.raises(InvalidTransportOption) as raised:
        parse(metrics_port=port)

    assert str(raised.value) == (
        f"metrics_port={port!r}: must be a TCP port, 1 to 65535, or None (no exporter)"
    )


@pytest.mark.parametrize("address", [127001, ["0.0.0.0"]])
def test_a_bad_metrics_address_is_refused_with_examples(address: Any) -> None:
    with pytest.raises(InvalidTransportOption) as raised:
        parse(metrics_port=9100, metrics_address=address)

    message = str(raised.value)
    assert message.startswith(f"metrics_address={address!r}: must be the address to listen on")
    assert "'127.0.0.1'" in message


def test_extension_off_still_checks_the_metrics_options() -> None:
    with pytest.raises(InvalidTransportOption, match="metrics_port=0"):
        parse(visibility_extension=False, metrics_port=0)

    assert parse(visibility_extension=False, metrics_port=9100).metrics_port == 9100


def test_a_near_miss_of_metrics_port_warns(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=OPTIONS_LOGGER):
        parse(metric_port=9100)

    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "'metric_port'" in warning
    assert "'metrics_port'" in warning


@pytest.mark.parametrize("interval", [0, 0.25, 10])
def test_an_ack_batch_interval_in_range_is_kept(interval: float) -> None:
    assert parse(ack_batch_interval=interval).ack_batch_interval == interval


def test_without_renewals_the_default_ack_wait_stays_under_half_a_short_lease() -> None:
    options = parse(visibility_extension=False, visibility_timeout=0)

    assert options.ack_batch_interval == 0


def test_the_ack_pipeline_can_be_turned_off() -> None:
    assert parse(ack_batching=False).ack_batching is False


def test_numbers_given_as_text_are_read_as_kombu_reads_them() -> None:
    """Settings read from environment variables arrive as text: "21600" or "21600.0"."""
    options = parse(
        visibility_timeout="600",
        visibility_extension_threshold=" 20.5 ",
        visibility_extension_interval="2",
        visibility_extension_max="3600.0",
        release_delay=["10", "60.0"],
        ack_batch_interval="0.25",
        metrics_port="9464",
    )

    assert options.visibility_timeout == 600
    assert options.visibility_extension_threshold == 20.5
    assert options.visibility_extension_interval == 2.0
    assert options.visibility_extension_max == 3600.0
    assert options.release_delay == (10, 60)
    assert options.ack_batch_interval == 0.25
    assert options.metrics_port == 9464


@pytest.mark.parametrize("unset", [None, "", "  "])
def test_an_option_set_to_nothing_takes_its_default_as_in_kombu(unset: Any) -> None:
    """Every option, as settings templated from unset environment variables arrive."""
    options = parse(**dict.fromkeys(OPTION_NAMES, unset))

    assert options == parse()


def test_eta_parking_is_on_with_a_15_minute_threshold_by_default() -> None:
    options = parse()

    assert options.eta_parking is True
    assert options.eta_parking_threshold == 900


def test_countdowns_are_sent_delayed_unless_eta_send_delay_is_off() -> None:
    assert parse().eta_send_delay is True
    assert parse(eta_send_delay=False).eta_send_delay is False


@pytest.mark.parametrize(
    ("given", "threshold"),
    [
        # Half the hold limit when that is under 15 minutes: a task held until its ETA
        # keeps as long to run as it waited, instead of starting with no hold left.
        ({"visibility_extension_max": 600}, 300),
        ({"visibility_extension_max": 1800}, 900),
        ({"visibility_extension_max": 43200}, 900),
        # Without renewals the hold is the lease itself.
        ({"visibility_extension": False, "visibility_timeout": 60}, 30),
        ({"visibility_extension": False}, 900),
        # Never under the shortest threshold, however short the hold.
        ({"visibility_timeout": 2, "visibility_extension_max": 2}, 2),
        ({"visibility_extension": False, "visibility_timeout": 0}, 2),
    ],
)
def test_the_parking_threshold_defaults_to_at_most_half_the_hold(
    given: dict[str, Any], threshold: float
) -> None:
    assert parse(**given).eta_parking_threshold == threshold


@pytest.mark.parametrize(
    ("given", "expected_in_message"),
    [
        ({"eta_parking": "yes"}, ["eta_parking='yes'", "True or False"]),
        ({"eta_send_delay": "no"}, ["eta_send_delay='no'", "True or False"]),
        ({"eta_parking_threshold": 1}, ["eta_parking_threshold=1", "from 2 to 21570"]),
        (
            {"eta_parking_threshold": 21571},
            ["eta_parking_threshold=21571", "from 2 to 21570", "half", "43140"],
        ),
        ({"eta_parking_threshold": "soon"}, ["eta_parking_threshold='soon'", "from 2 to 21570"]),
        (
            {"visibility_extension_max": 600, "eta_parking_threshold": 301},
            [
                "eta_parking_threshold=301",
                "from 2 to 300",
                "half",
                "visibility_extension_max (600)",
            ],
        ),
        (
            {"visibility_extension_max": 600, "eta_parking_threshold": 600},
            ["eta_parking_threshold=600", "from 2 to 300", "visibility_extension_max (600)"],
        ),
        (
            {"visibility_extension": False, "visibility_timeout": 60, "eta_parking_threshold": 31},
            [
                "eta_parking_threshold=31",
                "from 2 to 30",
                "visibility_timeout (60)",
                "visibility_extension is off",
            ],
        ),
    ],
)
def test_a_bad_parking_option_is_refused_naming_it_and_the_range(
    given: dict[str, Any], expected_in_message: list[str]
) -> None:
    with pytest.raises(InvalidTransportOption) as raised:
        parse(**given)
    for text in expected_in_message:
        assert text in str(raised.value)


@pytest.mark.parametrize("threshold", [2, "3600", 21570])
def test_parking_threshold_bounds_are_inclusive_and_text_is_read(threshold: Any) -> None:
    assert parse(eta_parking_threshold=threshold).eta_parking_threshold == float(threshold)


def test_a_parking_threshold_of_half_the_extension_max_is_kept() -> None:
    options = parse(visibility_extension_max=600, eta_parking_threshold=300)

    assert options.eta_parking_threshold == 300


# --- receives_in_flight -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "kept"), [({}, 4), ({"receives_in_flight": 1}, 1), ({"receives_in_flight": "10"}, 10)]
)
def test_receives_in_flight_defaults_to_four_and_reads_text(
    given: dict[str, Any], kept: int
) -> None:
    assert parse(**given).receives_in_flight == kept


@pytest.mark.parametrize("bad", [0, 11, 2.5, True, "many"])
def test_a_bad_receives_in_flight_is_refused_naming_it_and_the_range(bad: Any) -> None:
    with pytest.raises(InvalidTransportOption) as raised:
        parse(receives_in_flight=bad)
    assert f"receives_in_flight={bad!r}" in str(raised.value)
    assert "1 to 10" in str(raised.value)


# --- visibility_extension: False ----------------------------------------------------------


@pytest.mark.parametrize("unset", [{}, {"visibility_timeout": None}, {"visibility_timeout": ""}])
def test_without_renewals_the_lease_defaults_to_kombus_own(unset: dict[str, Any]) -> None:
    """Opting out of renewals gets kombu's lease, not a 30 s one nothing renews."""
    options = parse(visibility_extension=False, **unset)

    assert options.visibility_timeout == KOMBU_DEFAULT_LEASE == 1800


def test_with_renewals_the_lease_still_defaults_to_30_seconds() -> None:
    assert parse(visibility_extension=True).visibility_timeout == 30


def test_without_renewals_a_given_lease_is_kept_and_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger=OPTIONS_LOGGER):
        # Every connection of a worker parses the options again.
        first = parse(visibility_extension=False, visibility_timeout=120)
        second = parse(visibility_extension=False, visibility_timeout="120")

    assert first.visibility_timeout == second.visibility_timeout == 120
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "not renewed" in warning
    assert "visibility_timeout=120 s" in warning
    assert "runs again" in warning


@pytest.mark.parametrize(
    "given",
    [
        {"visibility_extension": False},
        {"visibility_extension": False, "visibility_timeout": None},
        {"visibility_timeout": 120},
        {},
    ],
)
def test_no_lease_warning_for_kombus_lease_or_with_renewals(
    caplog: pytest.LogCaptureFixture, given: dict[str, Any]
) -> None:
    with caplog.at_level(logging.WARNING, logger=OPTIONS_LOGGER):
        parse(**given)

    assert [r for r in caplog.records if r.name == OPTIONS_LOGGER] == []
