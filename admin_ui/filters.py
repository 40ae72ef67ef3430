"""Parse operator input (query strings, forms, JSON bodies) into storage queries.

Every parser is strict: an unknown parameter, a repeated one, a malformed
value or an out-of-range limit is a :class:`~admin_ui.errors.BadFilter` (400)
naming the parameter. Empty values (what an HTML form sends for a blank
field) mean "no filter".
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping

import attrs

from admin_ui.errors import BadFilter, BadInput
from daemon.core.find_query import BadMoment, id_floor, parse_moment
from daemon.core.ids import is_ulid, ulid_millis
from daemon.core.states import WorkState
from storage.port import DeadQuery, WorkQuery

# DLQ class counts are taken among this many newest dead items (a bounded read).
DLQ_CLASS_SAMPLE = 5000

MAX_PAGE = 200
DEFAULT_PAGE = 50
MAX_BULK = 200
MAX_REASON = 500

# Column widths of work_items (storage/migrations/0001_kernel.sql).
_TEXT_LIMITS = {
    "family": 64,
    "org": 128,
    "subject": 255,
    "lane": 255,
    "failure_class": 64,
    "target": 255,
}


class Args:
    """Single-valued access to a query string or form, refusing repeats and unknown keys."""

    def __init__(self, pairs: Iterable[tuple[str, str]], known: Iterable[str]) -> None:
        self._values: dict[str, str] = {}
        known_set = frozenset(known)
        for key, value in pairs:
            if key not in known_set:
                names = ", ".join(sorted(known_set)) or "none"
                raise BadFilter(f"unknown parameter {key!r} (known: {names})")
            if key in self._values:
                raise BadFilter(f"parameter {key!r} is given more than once")
            self._values[key] = value

    def text(self, key: str) -> str | None:
        value = self._values.get(key, "").strip()
        if not value:
            return None
        limit = _TEXT_LIMITS.get(key, 255)
        if len(value) > limit:
            raise BadFilter(f"{key} is longer than {limit} characters")
        if not value.isprintable():
            raise BadFilter(f"{key} contains control characters")
        return value

    def flag(self, key: str) -> bool:
        value = self._values.get(key, "").strip().lower()
        if value in ("", "0", "false", "no", "off"):
            return False
        if value in ("1", "true", "yes", "on"):
            return True
        raise BadFilter(f"{key} must be true or false, not {value!r}")

    def integer(self, key: str, default: int, low: int, high: int) -> int:
        raw = self._values.get(key, "").strip()
        if not raw:
            return default
        if not raw.isdigit() or len(raw) > 9:
            raise BadFilter(f"{key} must be a whole number from {low} to {high}")
        value = int(raw)
        if not low <= value <= high:
            raise BadFilter(f"{key} must be a whole number from {low} to {high}")
        return value

    def state(self, key: str = "state") -> WorkState | None:
        raw = self.text(key)
        if raw is None:
            return None
        try:
            return WorkState(raw)
        except ValueError:
            known = ", ".join(s.value for s in WorkState)
            raise BadFilter(f"unknown state {raw!r} (known: {known})") from None

    def work_id(self, key: str) -> str | None:
        raw = self.text(key)
        if raw is not None and not is_ulid(raw):
            raise BadFilter(f"{key} must be a work id (26 characters, Crockford base32)")
        return raw


WORK_FILTER_KEYS = ("state", "family", "org", "subject", "lane", "since", "until", "after",
                    "limit")
DLQ_FILTER_KEYS = ("family", "failure_class", "unreplayed", "after", "limit")
AUDIT_FILTER_KEYS = ("target", "limit")


def _created_bound(args: Args, key: str, now_us: int) -> str | None:
    """A creation-time filter as a work id bound (work ids are ULIDs of their creation)."""
    raw = args.text(key)
    if raw is None:
        return None
    try:
        return id_floor(parse_moment(raw, now_us))
    except BadMoment as exc:
        raise BadFilter(f"{key}: {exc}") from None


def parse_work_query(pairs: Iterable[tuple[str, str]], now_us: int) -> WorkQuery:
    args = Args(pairs, WORK_FILTER_KEYS)
    since, until = _created_bound(args, "since", now_us), _created_bound(args, "until", now_us)
    if since is not None and until is not None and since >= until:
        raise BadFilter("since must be earlier than until")
    return WorkQuery(
        since_id=since, until_id=until,
        state=args.state(),
        family=args.text("family"),
        org_id=args.text("org"),
        subject_id=args.text("subject"),
        lane=args.text("lane"),
        after_id=args.work_id("after"),
        limit=args.integer("limit", DEFAULT_PAGE, 1, MAX_PAGE),
    )


def work_query_args(query: WorkQuery) -> dict[str, str]:
    """The query string that reproduces ``query`` (for links and the next page)."""
    pairs = {
        "state": query.state.value if query.state else None,
        "family": query.family,
        "org": query.org_id,
        "subject": query.subject_id,
        "lane": query.lane,
        "since": _iso(query.since_id),
        "until": _iso(query.until_id),
    }
    return {k: v for k, v in pairs.items() if v}


def _iso(bound: str | None) -> str | None:
    if bound is None:
        return None
    moment = dt.datetime.fromtimestamp(ulid_millis(bound) / 1000, tz=dt.UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_dead_query(pairs: Iterable[tuple[str, str]]) -> DeadQuery:
    args = Args(pairs, DLQ_FILTER_KEYS)
    return DeadQuery(
        family=args.text("family"),
        failure_class=args.text("failure_class"),
        unreplayed_only=args.flag("unreplayed"),
        after_id=args.work_id("after"),
        limit=args.integer("limit", DEFAULT_PAGE, 1, MAX_PAGE),
    )


def parse_audit_query(pairs: Iterable[tuple[str, str]]) -> tuple[str | None, int]:
    args = Args(pairs, AUDIT_FILTER_KEYS)
    return args.text("target"), args.integer("limit", 100, 1, 1000)


def reason_from(value: object) -> str:
    """An operator's reason: required, one line, bounded."""
    if not isinstance(value, str) or not value.strip():
        raise BadInput("a reason is required (it is kept in the audit log)")
    text = " ".join(value.split())
    if len(text) > MAX_REASON:
        raise BadInput(f"the reason is longer than {MAX_REASON} characters")
    if not text.isprintable():
        raise BadInput("the reason contains control characters")
    return text


@attrs.frozen(kw_only=True)
class BulkReplayRequest:
    """Replay up to ``limit`` not-yet-replayed dead items of one family (and class)."""

    family: str
    failure_class: str | None
    limit: int
    reason: str


BULK_KEYS = ("family", "failure_class", "limit", "reason", "csrf_token")


def parse_bulk_replay(doc: Mapping[str, object]) -> BulkReplayRequest:
    """From a JSON body or a form (``csrf_token`` is checked elsewhere and ignored here)."""
    pairs = []
    for key, value in doc.items():
        if key == "reason":
            continue
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise BadInput(f"{key} must be a string or a number")
        pairs.append((key, str(value)))
    args = Args(pairs, BULK_KEYS)
    family = args.text("family")
    if family is None:
        raise BadInput("family is required: a bulk replay covers one work family")
    return BulkReplayRequest(
        family=family,
        failure_class=args.text("failure_class"),
        limit=args.integer("limit", 50, 1, MAX_BULK),
        reason=reason_from(doc.get("reason")),
    )
