"""May this process take replica id X? (pure)

Rules, in order, for the row a previous holder of the id left in ``replicas``:

==========================================  ==========  ==============================
previous holder                              verdict     why
==========================================  ==========  ==============================
none                                         take over   the id is new
state ``stopped``                            take over   it stopped cleanly
heartbeat older than the lapse               take over   it is gone (or cut off)
same host, same pid as ours                  take over   that process no longer exists
same host, pid not alive                     take over   provably gone (crashed)
anything else                                watch       alive, or crashed elsewhere
==========================================  ==========  ==============================

*Watching* re-reads the row until the previous heartbeat would have lapsed: if
the heartbeat moves (or the row's holder changes) a live process holds the id
and this one must refuse; if it stays still, the holder is gone and this one
takes over. So a restart after a crash is never refused (at worst it waits
one lapse), while two live processes with one id never run side by side.
"""

from __future__ import annotations

import enum

import attrs


class Verdict(enum.Enum):
    TAKE_OVER = "take_over"
    WATCH = "watch"
    REFUSE = "refuse"


@attrs.frozen
class Holder:
    """What the ``replicas`` row says about whoever last held the id."""

    hostname: str
    pid: int
    state: str
    started_at_us: int
    heartbeat_at_us: int


@attrs.frozen
class Judgement:
    verdict: Verdict
    reason: str
    # For WATCH: when the previous heartbeat lapses (epoch microseconds).
    lapse_at_us: int = 0


def judge(
    holder: Holder | None,
    *,
    hostname: str,
    pid: int,
    now_us: int,
    lapse_us: int,
    pid_alive: bool | None,
) -> Judgement:
    """The first look. ``pid_alive`` is whether ``holder.pid`` runs on this host
    (``None`` when the holder is on another host, or unknown)."""
    if lapse_us <= 0:
        raise ValueError("lapse_us must be positive")
    if holder is None:
        return Judgement(Verdict.TAKE_OVER, "new")
    if holder.state == "stopped":
        return Judgement(Verdict.TAKE_OVER, "previous holder stopped")
    if now_us - holder.heartbeat_at_us > lapse_us:
        return Judgement(Verdict.TAKE_OVER, "previous heartbeat lapsed")
    if holder.hostname == hostname and holder.pid == pid:
        return Judgement(Verdict.TAKE_OVER, "previous holder's pid is ours: it is gone")
    if holder.hostname == hostname and pid_alive is False:
        return Judgement(Verdict.TAKE_OVER, "previous holder's process is gone")
    return Judgement(Verdict.WATCH, "previous holder may be alive",
                     lapse_at_us=holder.heartbeat_at_us + lapse_us)


def rejudge(first: Holder, latest: Holder | None, *, now_us: int, lapse_at_us: int) -> Judgement:
    """While watching: ``first`` is the row as first seen, ``latest`` as read now."""
    if latest is None or latest.state == "stopped":
        return Judgement(Verdict.TAKE_OVER, "previous holder stopped")
    if (latest.heartbeat_at_us, latest.started_at_us, latest.pid, latest.hostname) != (
        first.heartbeat_at_us, first.started_at_us, first.pid, first.hostname
    ):
        return Judgement(Verdict.REFUSE, "a live process renews its heartbeat")
    if now_us > lapse_at_us:
        return Judgement(Verdict.TAKE_OVER, "previous heartbeat lapsed")
    return Judgement(Verdict.WATCH, "previous holder may be alive", lapse_at_us=lapse_at_us)
