"""The webhooks process's pacing rules on their own: backoff, Retry-After, the circuit."""

from __future__ import annotations

from pipeline.webhooks.sender import CIRCUIT_FAILURES, CIRCUIT_SECONDS, Circuit, backoff, retry_after


def test_backoff_doubles_within_its_bounds_with_equal_jitter_and_never_overflows() -> None:
    assert [backoff(n, 5, 3600, rand=lambda: 0.0) for n in (1, 2, 3)] == [2.5, 5.0, 10.0]
    assert [backoff(n, 5, 3600, rand=lambda: 1.0) for n in (1, 2, 3)] == [5.0, 10.0, 20.0]
    assert backoff(5000, 5, 60, rand=lambda: 1.0) == 60.0  # try 5,000 of a day at 60 s at most


def test_retry_after_reads_seconds_and_dates_and_ignores_the_rest() -> None:
    assert retry_after("7", now=0, most=3600) == 7.0
    assert retry_after("Thu, 01 Jan 1970 00:01:40 GMT", now=40, most=3600) == 60.0
    assert retry_after("\u00b2", 0, 9) is None and retry_after("soon", 0, 9) is None and retry_after(None, 0, 9) is None


def test_retry_after_asks_for_at_most_the_given_most_however_large() -> None:
    assert retry_after("9" * 400, now=0, most=86400) == 86400.0  # float("9" * 400) is inf
    assert retry_after("Fri, 31 Dec 9999 23:59:59 GMT", now=0, most=60) == 60.0


def test_a_circuit_opens_once_for_the_tries_that_were_in_flight_and_doubles_only_on_a_failed_trial() -> None:
    circuit = Circuit(longest=600)
    for _ in range(CIRCUIT_FAILURES - 1):
        assert circuit.record(False, now=0) is False
    assert circuit.record(False, now=0) is True and circuit.open_until == CIRCUIT_SECONDS
    for _ in range(3):  # tries in flight when it opened fail too: it stays open as it was
        assert circuit.record(False, now=1) is False
    assert circuit.open_until == CIRCUIT_SECONDS and circuit.places(1, 4) == 0
    assert circuit.places(CIRCUIT_SECONDS, 4) == 1  # then one trial at a time
    assert circuit.record(False, now=CIRCUIT_SECONDS) is True  # the trial failed: twice as long
    assert circuit.open_until == CIRCUIT_SECONDS + 2 * CIRCUIT_SECONDS
    assert circuit.record(True, now=200) is False and circuit.places(200, 4) == 4
