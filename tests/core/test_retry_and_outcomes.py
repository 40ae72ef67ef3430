"""Backoff and outcome decisions, table-driven."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from daemon.core.outcomes import (
    CancelAcknowledged,
    DeadLetter,
    Deferred,
    Outcome,
    Released,
    RetryLater,
    Skipped,
    Succeeded,
    decide,
)
from daemon.core.retry import BackoffPolicy
from daemon.core.states import WorkEvent, WorkState
from daemon.core.work import MAX_SUMMARY_CHARS, Fence, sanitize_summary

FENCE = Fence("01ABC", "tok", 3)
POLICY = BackoffPolicy(base_s=1.0, cap_s=60.0, floor_s=0.05)
NOW = 1_000_000_000


@pytest.mark.parametrize(
    ("attempt", "sample", "expected"),
    [
        (1, 0.5, 0.5),
        (2, 0.5, 1.0),
        (3, 0.5, 2.0),
        (7, 0.5, 30.0),
        (8, 0.999, 59.94),
        (50, 0.5, 30.0),  # capped
        (1, 0.0, 0.05),  # floor
    ],
)
def test_full_jitter_backoff(attempt: int, sample: float, expected: float) -> None:
    assert POLICY.delay_s(attempt, sample) == pytest.approx(expected)


@given(st.integers(1, 10_000), st.floats(0, 1, exclude_max=True))
def test_backoff_is_bounded(attempt: int, sample: float) -> None:
    delay = POLICY.delay_s(attempt, sample)
    assert POLICY.floor_s <= delay <= POLICY.cap_s


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"base_s": 0}, "floor"), ({"base_s": 10, "cap_s": 5}, "floor"), ({"floor_s": 2}, "floor")],
)
def test_bad_policies_are_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BackoffPolicy(**kwargs)


@pytest.mark.parametrize(
    ("outcome", "attempt", "event", "state", "run_after"),
    [
        (Succeeded(), 1, WorkEvent.COMPLETE, WorkState.SUCCEEDED, None),
        (Skipped("nothing to do"), 1, WorkEvent.SKIP, WorkState.SKIPPED, None),
        (RetryLater("net"), 1, WorkEvent.RETRY, WorkState.RETRY, NOW + 500_000),
        (RetryLater("net"), 2, WorkEvent.RETRY, WorkState.RETRY, NOW + 1_000_000),
        (RetryLater("429", delay_s=7.0), 1, WorkEvent.RETRY, WorkState.RETRY, NOW + 7_000_000),
        (RetryLater("net"), 5, WorkEvent.DEAD_LETTER, WorkState.DEAD, None),
        (DeadLetter("bad"), 1, WorkEvent.DEAD_LETTER, WorkState.DEAD, None),
        (CancelAcknowledged(), 1, WorkEvent.CANCEL_ACK, WorkState.CANCELLED, None),
        (Released(), 1, WorkEvent.RELEASE, WorkState.RETRY, NOW),
        # A deferral runs at the exact time it names, never later by backoff ...
        (Deferred("quota_wait", NOW + 1_234_567), 1, WorkEvent.DEFER, WorkState.PENDING,
         NOW + 1_234_567),
        # ... nor dies of attempts it never consumed (the last attempt is refunded) ...
        (Deferred("quota_wait", NOW + 5), 5, WorkEvent.DEFER, WorkState.PENDING, NOW + 5),
        # ... and a time already past means now, not the past.
        (Deferred("quota_wait", NOW - 9), 1, WorkEvent.DEFER, WorkState.PENDING, NOW),
    ],
)
def test_decide(outcome: Outcome, attempt: int, event: WorkEvent, state: WorkState,
                run_after: int | None) -> None:
    fin = decide(outcome, fence=FENCE, attempt=attempt, max_attempts=5, policy=POLICY,
                 jitter_sample=0.5, now_us=NOW)
    assert fin.event is event
    assert fin.new_state is state
    assert fin.run_after_us == run_after
    assert fin.fence == FENCE
    assert fin.attempt == attempt
    assert fin.refund_attempt is isinstance(outcome, Released | Deferred)


def test_a_deferral_keeps_its_reason_and_summary() -> None:
    fin = decide(Deferred("quota_wait", NOW + 1, "key k has no\nslot"), fence=FENCE,
                 attempt=2, max_attempts=2, policy=POLICY, jitter_sample=0.5, now_us=NOW)
    assert (fin.failure_class, fin.summary, fin.terminal_outcome) == (
        "quota_wait", "key k has no slot", None)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"reason": "", "run_after_us": NOW}, "reason"),
    ({"reason": "quota_wait", "run_after_us": -1}, "run_after_us"),
])
def test_a_deferral_without_reason_or_time_is_refused(kwargs: dict[str, object],
                                                      message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Deferred(**kwargs)  # type: ignore[arg-type]


def test_exhausted_retry_says_so() -> None:
    fin = decide(RetryLater("net", "timeout"), fence=FENCE, attempt=5, max_attempts=5,
                 policy=POLICY, jitter_sample=0.5, now_us=NOW)
    assert fin.summary == "attempts exhausted (5): timeout"
    assert fin.failure_class == "net"


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("plain", "plain"),
        ("two\nlines\tand\x00nul", "two lines and nul"),
        ("  spaced   out  ", "spaced out"),
        ("x" * 1000, "x" * (MAX_SUMMARY_CHARS - 1) + "\u2026"),
    ],
)
def test_sanitize_summary(raw: str, clean: str) -> None:
    assert sanitize_summary(raw) == clean


@given(st.text())
def test_sanitized_summaries_are_one_bounded_printable_line(raw: str) -> None:
    out = sanitize_summary(raw)
    assert len(out) <= MAX_SUMMARY_CHARS
    assert out.isprintable()
