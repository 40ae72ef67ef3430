"""Find anything (issue 23 item 2): the console's filtered lists and its search box.

Four lists on the durable rows, cluster-wide (effect attempts, commands, Runtime
receipts, audit entries), each a page at ``/admin/find/<list>`` and JSON at
``/admin/api/find/<list>`` with the same filters (:mod:`admin_ui.find_filters`), newest
or oldest first, paged by the last id shown (``next_after``). The search box in every
page's header asks ``/admin/find?q=``: one hit goes straight to its page, several are
listed (JSON: ``/admin/api/search?q=``). Reads only, so the viewer role sees all of it;
the shapes carry ids, classes, statuses and times, never a request body, a canonical
result or a header value.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import urlencode

import attrs
from quart import Blueprint, redirect, request
from quart.wrappers import Response
from werkzeug.wrappers import Response as WerkzeugResponse

from admin_ui.auth import require
from admin_ui.context import console
from admin_ui.errors import NotFound
from admin_ui.find_filters import (
    OUTCOMES,
    SORTS,
    parse_attempt_filter,
    parse_audit_filter,
    parse_command_filter,
    parse_ingress_filter,
    parse_receipt_filter,
    parse_search,
)
from admin_ui.ingress import receipt_json
from admin_ui.render import page
from admin_ui.serialize import audit_json
from daemon.core.ids import is_ulid
from storage.effect_values import Command, ResultReceipt, Settlement
from storage.find_rows import (
    RECEIPT_STATUSES,
    SCAN_WINDOW,
    FoundAttempt,
    Page,
    attempt_exchange,
    attempts_find,
    attempts_page,
    audit_find,
    commands_find,
    ingress_find,
    next_after,
    receipts_find,
    request_headers,
    search,
)
from storage.ingress.receipts import STATES as INGRESS_STATES
from storage.work_store import WorkStore

bp = Blueprint("find", __name__)

Json = dict[str, Any]


def attempt_row(found: FoundAttempt) -> Json:
    a = found.attempt
    return {"attempt_id": a.attempt_id, "command_id": a.command_id, "work_id": a.work_id,
            "operation": found.operation, "binding_id": found.binding_id,
            "method": a.method, "target_path": a.target_path,
            "response_status": a.response_status, "outcome": a.outcome,
            "failure_class": a.failure_class, "evidence": a.evidence,
            "disposition": a.disposition, "unresolved": a.unresolved,
            "dispatch_started_at_us": a.dispatch_started_at_us,
            "finished_at_us": a.finished_at_us}


def command_row(c: Command) -> Json:
    return {"command_id": c.command_id, "operation": c.operation,
            "settlement": c.settlement.value, "local_object": c.local_object,
            "local_id": c.local_id, "intent_id": c.intent_id, "binding_id": c.binding_id,
            "binding_generation": c.binding_generation,
            "catalog_revision": c.catalog_revision, "remote_id": c.remote_id,
            "repair_of": c.repair_of, "created_at_us": c.created_at_us}


def receipt_status(r: ResultReceipt) -> str:
    """pending, refused (the Runtime refused a delivery: pending with an error), confirmed."""
    if r.state.value == "confirmed":
        return "confirmed"
    return "refused" if r.last_error else "pending"


def receipt_row(r: ResultReceipt) -> Json:
    return {"command_id": r.command_id, "intent_id": r.intent_id, "status": receipt_status(r),
            "result_format_version": r.result_format_version, "remote_id": r.remote_id,
            "last_error": r.last_error, "created_at_us": r.created_at_us,
            "confirmed_at_us": r.confirmed_at_us}


@attrs.frozen
class Listing:
    """One list: its filters' parser, its read, its JSON shape and its rows' id."""

    key: str
    title: str
    action: str
    parse: Callable[[Iterable[tuple[str, str]], int], Any]
    read: Callable[[WorkStore, Any], Awaitable[list[Any]]]
    shape: Callable[[Any], Json]
    id_of: Callable[[Json], str]


LISTINGS = {
    "attempts": Listing("attempts", "Effect attempts", "console.read", parse_attempt_filter,
                        attempts_find, attempt_row, lambda d: str(d["attempt_id"])),
    "commands": Listing("commands", "Commands", "console.read", parse_command_filter,
                        commands_find, command_row, lambda d: str(d["command_id"])),
    "receipts": Listing("receipts", "Runtime receipts", "console.read", parse_receipt_filter,
                        receipts_find, receipt_row, lambda d: str(d["command_id"])),
    "ingress": Listing("ingress", "Ingress receipts", "console.read", parse_ingress_filter,
                       ingress_find, receipt_json, lambda d: str(d["receipt_id"])),
    "audit": Listing("audit", "Audit entries", "audit.read", parse_audit_filter, audit_find,
                     audit_json, lambda d: str(d["audit_id"])),
}


async def read_listing(listing: Listing, store: WorkStore, query: Any) -> Json:
    """One page of ``listing``: its rows, the next page's token, and whether the page
    stopped at the attempts' scan window (a filter on the command's operation or
    binding: :data:`storage.find_rows.SCAN_WINDOW`) before it filled."""
    if listing.key == "attempts":
        found = await attempts_page(store, query)
        return {"items": [listing.shape(r) for r in found.items],
                "next_after": found.next_after, "window_ended": found.window_ended}
    rows = [listing.shape(r) for r in await listing.read(store, query)]
    page_of: Page = query.page
    return {"items": rows, "next_after": next_after([listing.id_of(r) for r in rows], page_of),
            "window_ended": False}


async def listing_json(listing: Listing, pairs: list[tuple[str, str]]) -> Json:
    view = console().view
    return await read_listing(listing, view.store, listing.parse(pairs, view.clock.now_us()))


def _next_args(pairs: list[tuple[str, str]], token: str | None) -> str | None:
    if token is None:
        return None
    kept = [(k, v) for k, v in pairs if k != "after" and v]
    return urlencode([*kept, ("after", token)])


def _register(listing: Listing) -> None:
    async def api_list() -> Json:
        return await listing_json(listing, list(request.args.items(multi=True)))

    async def html_list() -> Response:
        pairs = list(request.args.items(multi=True))
        doc = await listing_json(listing, pairs)
        return await page(f"find_{listing.key}.html", title=listing.title, items=doc["items"],
                          filters=dict(pairs), next_args=_next_args(pairs, doc["next_after"]),
                          window_ended=doc["window_ended"], scan_window=SCAN_WINDOW,
                          sorts=SORTS, outcomes=OUTCOMES, receipt_statuses=RECEIPT_STATUSES,
                          settlements=[s.value for s in Settlement],
                          ingress_states=list(INGRESS_STATES))

    api_list.__name__ = f"api_find_{listing.key}"
    html_list.__name__ = f"find_{listing.key}"
    bp.get(f"/admin/api/find/{listing.key}")(require(listing.action)(api_list))
    bp.get(f"/admin/find/{listing.key}")(require(listing.action)(html_list))


for _listing in LISTINGS.values():
    _register(_listing)


async def attempt_detail(store: WorkStore, attempt_id: str) -> Json:
    """One attempt with its command's operation and binding, the request headers it
    recorded and, for a failed call, its exchange excerpt (already redacted)."""
    attempt = await store.effect_attempt_get(attempt_id) if is_ulid(attempt_id) else None
    if attempt is None:
        raise NotFound(f"no effect attempt {attempt_id[:40]}")
    command = await store.command_get(attempt.command_id)
    row = attempt_row(FoundAttempt(
        attempt=attempt, operation=command.operation if command else "",
        binding_id=command.binding_id if command else ""))
    row["request_headers"] = [list(h) for h in request_headers(attempt.safe_headers)]
    exchange = await attempt_exchange(store, attempt_id)
    return {"attempt": row, "exchange": None if exchange is None else {
        "request_body": exchange.request_body,
        "response_headers": [list(h) for h in exchange.response_headers],
        "response_body": exchange.response_body}}


@bp.get("/admin/api/find/attempts/<attempt_id>")
@require("console.read")
async def api_attempt(attempt_id: str) -> Json:
    return await attempt_detail(console().view.store, attempt_id)


async def search_json(text: str) -> Json:
    hits = await search(console().view.store, text)
    return {"q": text, "matches": [attrs.asdict(h) for h in hits]}


@bp.get("/admin/api/search")
@require("console.read")
async def api_search() -> Json:
    return await search_json(parse_search(request.args.items(multi=True)))


@bp.get("/admin/find")
@require("console.read")
async def find_page() -> Response | WerkzeugResponse:
    if not request.args:  # the Find entry of the navigation: the lists and the search
        return await page("find_search.html", q=None, matches=[])
    text = parse_search(request.args.items(multi=True))
    doc = await search_json(text)
    if len(doc["matches"]) == 1:
        return redirect(doc["matches"][0]["href"])
    return await page("find_search.html", q=text, matches=doc["matches"])
