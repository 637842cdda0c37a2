"""The one backoff rule shared by the tool, sandbox and SGLang clients (agentrl.retry)."""

from __future__ import annotations

import random

import pytest

from agentrl.retry import backoff_delay, parse_retry_after


def test_backoff_doubles_with_equal_jitter_and_is_capped():
    rng = random.Random(0)
    for attempt, (low, high) in enumerate([(0.05, 0.1), (0.1, 0.2), (0.2, 0.4)]):
        delays = [backoff_delay(attempt, 0.1, 10.0, rng=rng) for _ in range(200)]
        assert low <= min(delays) and max(delays) <= high  # never below half the nominal wait
        assert len(set(delays)) > 100  # jittered: clients that failed together spread out
    assert all(1.0 <= backoff_delay(20, 0.1, 2.0, rng=rng) <= 2.0 for _ in range(50))
    assert backoff_delay(10_000, 0.1, 3.0, rng=rng) <= 3.0  # huge attempts do not overflow
    assert backoff_delay(3, 0.0, 5.0, rng=rng) == 0.0  # base 0: retry at once (tests, tight loops)


def test_retry_after_is_a_floor_with_jitter_above_it_and_capped():
    rng = random.Random(1)
    waits = [backoff_delay(0, 0.1, 5.0, retry_after_s=1.0, rng=rng) for _ in range(200)]
    assert 1.0 <= min(waits) and max(waits) <= 1.5 and len(set(waits)) > 100
    assert backoff_delay(0, 0.1, 5.0, retry_after_s=60.0, rng=rng) == 5.0  # never longer than the cap
    assert backoff_delay(4, 10.0, 5.0, retry_after_s=0.0, rng=rng) == 0.0  # "retry now" means now


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="attempt"):
        backoff_delay(-1, 0.1, 1.0)
    with pytest.raises(ValueError, match="base"):
        backoff_delay(0, -0.1, 1.0)


def test_retry_after_parsing():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("0.5") == 0.5
    assert parse_retry_after("-2") == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("") is None
    assert parse_retry_after("nan") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None  # HTTP-date form: the caller's own backoff
