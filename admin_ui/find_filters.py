"""Parse the "find" lists' query strings (console, API and CLI) into storage filters.

Strict like :mod:`admin_ui.filters`: an unknown or repeated parameter, a value that is
not what the filter takes, a page token that is not an id of the list, or a time that
cannot be read is a :class:`~admin_ui.errors.BadFilter` (400) naming the parameter.
Empty values mean "no filter" (what a blank form field sends).
"""

from __future__ import annotations

from collections.abc import Iterable

from admin_ui.errors import BadFilter
from admin_ui.filters import DEFAULT_PAGE, MAX_PAGE, Args
from daemon.core.effects import OutcomeClass
from daemon.core.find_query import BadMoment, parse_moment
from daemon.core.ids import is_ulid
from storage.effect_values import Settlement
from storage.find_rows import (
    RECEIPT_STATUSES,
    AttemptFilter,
    AuditFilter,
    CommandFilter,
    IngressFilter,
    Page,
    ReceiptFilter,
)
from storage.ingress.receipts import STATES as INGRESS_STATES

PAGE_KEYS = ("since", "until", "after", "sort", "limit")
SORTS = ("newest", "oldest")
ATTEMPT_KEYS = ("outcome", "operation", "status", "binding", *PAGE_KEYS)
COMMAND_KEYS = ("settlement", "object", "local_id", "binding", "generation", "revision",
                "operation", *PAGE_KEYS)
RECEIPT_KEYS = ("status", *PAGE_KEYS)
AUDIT_KEYS = ("actor", "action", "target", *PAGE_KEYS)
INGRESS_KEYS = ("state", "route", "binding", *PAGE_KEYS)
MAX_SEARCH = 255
# The outcome classes, and "none": dispatched with no outcome recorded (yet).
OUTCOMES = (*(o.value for o in OutcomeClass), "none")


def _moment(args: Args, key: str, now_us: int) -> int | None:
    raw = args.text(key)
    if raw is None:
        return None
    try:
        return parse_moment(raw, now_us)
    except BadMoment as exc:
        raise BadFilter(f"{key}: {exc}") from None


def _page(args: Args, now_us: int) -> Page:
    sort = args.text("sort") or "newest"
    if sort not in SORTS:
        raise BadFilter(f"sort must be one of {', '.join(SORTS)}, not {sort!r}")
    after = args.text("after")
    if after is not None and not is_ulid(after):
        raise BadFilter("after must be the page token of the previous page"
                        " (an id: 26 characters, Crockford base32)")
    since, until = _moment(args, "since", now_us), _moment(args, "until", now_us)
    if since is not None and until is not None and since >= until:
        raise BadFilter("since must be earlier than until")
    return Page(after=after, oldest_first=sort == "oldest", since_us=since, until_us=until,
                limit=args.integer("limit", DEFAULT_PAGE, 1, MAX_PAGE))


def _number(args: Args, key: str, low: int, high: int) -> int | None:
    raw = args.text(key)
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 18 or not low <= int(raw) <= high:
        raise BadFilter(f"{key} must be a whole number from {low} to {high}")
    return int(raw)


def parse_attempt_filter(pairs: Iterable[tuple[str, str]], now_us: int) -> AttemptFilter:
    args = Args(pairs, ATTEMPT_KEYS)
    outcome = args.text("outcome")
    if outcome is not None and outcome not in OUTCOMES:
        raise BadFilter(f"outcome must be one of {', '.join(OUTCOMES)}, not {outcome!r}")
    return AttemptFilter(outcome=outcome, operation=args.text("operation"),
                         status=_number(args, "status", 100, 599),
                         binding_id=args.text("binding"), page=_page(args, now_us))


def parse_command_filter(pairs: Iterable[tuple[str, str]], now_us: int) -> CommandFilter:
    args = Args(pairs, COMMAND_KEYS)
    settlement = args.text("settlement")
    known = [s.value for s in Settlement]
    if settlement is not None and settlement not in known:
        raise BadFilter(f"settlement must be one of {', '.join(known)}, not {settlement!r}")
    return CommandFilter(
        settlement=settlement, local_object=args.text("object"),
        local_id=args.text("local_id"), binding_id=args.text("binding"),
        binding_generation=_number(args, "generation", 0, 2**62),
        catalog_revision=_number(args, "revision", 0, 2**62),
        operation=args.text("operation"), page=_page(args, now_us))


def parse_receipt_filter(pairs: Iterable[tuple[str, str]], now_us: int) -> ReceiptFilter:
    args = Args(pairs, RECEIPT_KEYS)
    status = args.text("status")
    if status is not None and status not in RECEIPT_STATUSES:
        raise BadFilter(f"status must be one of {', '.join(RECEIPT_STATUSES)},"
                        f" not {status!r}")
    return ReceiptFilter(status=status, page=_page(args, now_us))


def parse_audit_filter(pairs: Iterable[tuple[str, str]], now_us: int) -> AuditFilter:
    args = Args(pairs, AUDIT_KEYS)
    return AuditFilter(actor=args.text("actor"), action=args.text("action"),
                       target=args.text("target"), page=_page(args, now_us))


def parse_ingress_filter(pairs: Iterable[tuple[str, str]], now_us: int) -> IngressFilter:
    args = Args(pairs, INGRESS_KEYS)
    state = args.text("state")
    if state is not None and state not in INGRESS_STATES:
        raise BadFilter(f"state must be one of {', '.join(INGRESS_STATES)}, not {state!r}")
    return IngressFilter(state=state, route=args.text("route"),
                         binding_id=args.text("binding"), page=_page(args, now_us))


def parse_search(pairs: Iterable[tuple[str, str]]) -> str:
    args = Args(pairs, ("q",))
    text = args.text("q")
    if text is None:
        raise BadFilter("q is required: an id of a work item, command, attempt, receipt,"
                        " binding or remote record")
    if len(text) > MAX_SEARCH:
        raise BadFilter(f"q is longer than {MAX_SEARCH} characters")
    return text
