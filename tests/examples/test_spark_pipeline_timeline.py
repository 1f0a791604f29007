"""How the timeline turns SQS events into lease spans and exposure."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from examples.spark_pipeline.report import Message
from examples.spark_pipeline.timeline import exposed_intervals, lease_intervals


def test_renewals_extend_one_continuous_lease_up_to_the_delete() -> None:
    message = Message("m", "t", "generate", receives=[0.0], renewals=[(5.0, 10), (10.0, 10)])
    message.deleted = 12.0
    assert lease_intervals(message, lease=10, end=100.0) == [(0.0, 12.0)]


def test_an_expired_lease_leaves_a_gap_until_the_next_receive() -> None:
    message = Message("m", "t", "generate", receives=[0.0, 14.0])
    assert lease_intervals(message, lease=10, end=30.0) == [(0.0, 10.0), (14.0, 24.0)]


def test_a_renewal_with_its_own_visibility_is_respected() -> None:
    message = Message("m", "t", "generate", receives=[0.0], renewals=[(8.0, 30)])
    assert lease_intervals(message, lease=10, end=100.0) == [(0.0, 38.0)]


def test_exposure_is_running_time_outside_the_lease() -> None:
    hidden = [(0.0, 10.0), (14.0, 24.0)]
    assert exposed_intervals((1.0, 30.0), hidden, deleted=None) == [(10.0, 14.0), (24.0, 30.0)]
    assert exposed_intervals((1.0, 9.0), hidden, deleted=None) == []


def test_exposure_ends_when_the_message_is_deleted() -> None:
    assert exposed_intervals((1.0, 30.0), [(0.0, 10.0)], deleted=20.0) == [(10.0, 20.0)]
