"""The replica-id judge: refuse a live holder, never refuse a restart after a crash."""

from __future__ import annotations

import pytest

from daemon.core.replica_identity import Holder, Verdict, judge, rejudge

NOW = 1_800_000_000_000_000
LAPSE = 3_000_000
HERE, PID = "host-a", 4242


def holder(*, host: str = HERE, pid: int = 1111, state: str = "running",
           beat_ago_us: int = 500_000, started: int = NOW - 60_000_000) -> Holder:
    return Holder(host, pid, state, started, NOW - beat_ago_us)


@pytest.mark.parametrize(
    ("previous", "pid_alive", "verdict", "reason"),
    [
        (None, None, Verdict.TAKE_OVER, "new"),
        (holder(state="stopped"), True, Verdict.TAKE_OVER, "stopped"),
        (holder(beat_ago_us=LAPSE + 1), True, Verdict.TAKE_OVER, "lapsed"),
        (holder(host="host-b", beat_ago_us=LAPSE + 1), None, Verdict.TAKE_OVER, "lapsed"),
        (holder(pid=PID), True, Verdict.TAKE_OVER, "pid is ours"),
        (holder(), False, Verdict.TAKE_OVER, "process is gone"),
        # Negative rows: a fresh heartbeat whose process may be alive is watched.
        (holder(), True, Verdict.WATCH, "may be alive"),
        (holder(), None, Verdict.WATCH, "may be alive"),
        (holder(host="host-b"), None, Verdict.WATCH, "may be alive"),
        (holder(host="host-b", pid=PID), None, Verdict.WATCH, "may be alive"),
        (holder(beat_ago_us=LAPSE), True, Verdict.WATCH, "may be alive"),  # boundary
        (holder(state="draining"), True, Verdict.WATCH, "may be alive"),
    ],
)
def test_first_look(previous: Holder | None, pid_alive: bool | None, verdict: Verdict,
                    reason: str) -> None:
    j = judge(previous, hostname=HERE, pid=PID, now_us=NOW, lapse_us=LAPSE, pid_alive=pid_alive)
    assert j.verdict is verdict and reason in j.reason
    if verdict is Verdict.WATCH:
        assert previous is not None and j.lapse_at_us == previous.heartbeat_at_us + LAPSE


def test_lapse_must_be_positive() -> None:
    with pytest.raises(ValueError, match="lapse_us"):
        judge(None, hostname=HERE, pid=PID, now_us=NOW, lapse_us=0, pid_alive=None)


FIRST = holder(host="host-b")
LAPSE_AT = FIRST.heartbeat_at_us + LAPSE


@pytest.mark.parametrize(
    ("latest", "now_us", "verdict"),
    [
        (FIRST, NOW, Verdict.WATCH),  # still, not yet lapsed
        (FIRST, LAPSE_AT, Verdict.WATCH),  # boundary
        (FIRST, LAPSE_AT + 1, Verdict.TAKE_OVER),  # still and lapsed: gone
        (None, NOW, Verdict.TAKE_OVER),
        (holder(host="host-b", state="stopped"), NOW, Verdict.TAKE_OVER),
        # A live process renews, restarts, or another one took the id: refuse.
        (holder(host="host-b", beat_ago_us=100), NOW, Verdict.REFUSE),
        (holder(host="host-b", beat_ago_us=100), LAPSE_AT + 1, Verdict.REFUSE),
        (holder(host="host-b", pid=2222), NOW, Verdict.REFUSE),
        (holder(host="host-c"), NOW, Verdict.REFUSE),
        (holder(host="host-b", started=NOW), NOW, Verdict.REFUSE),
    ],
)
def test_watching(latest: Holder | None, now_us: int, verdict: Verdict) -> None:
    assert rejudge(FIRST, latest, now_us=now_us, lapse_at_us=LAPSE_AT).verdict is verdict
