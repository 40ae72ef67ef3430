"""Find anything (issue 23 item 2): filtered, keyset-paged lists and an id search.

Every list is ordered by its rows' ULID (newest or oldest first); a page is the rows
past the last id shown and a time filter is a range of that id (``daemon.core.find_query``),
so a page is one index range read that stops at the page size: never OFFSET, never a
sort of the matches (migration 0040 gives each filter column an index ending with the id).
Filters are equality on one column each; the statements are plain SQL every backend
runs (design.md section 5). Reads only: nothing here writes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import attrs

from daemon.core.find_query import id_floor
from daemon.core.ids import is_ulid
from storage.commands import COMMAND_COLUMNS, command_from_row
from storage.effect_values import Command, EffectAttempt, ResultReceipt
from storage.effects import _ATTEMPT_COLUMNS, _RECEIPT_COLUMNS, attempt_from_row, receipt_from_row
from storage.ingress.receipts import _COLUMNS as INGRESS_COLUMNS
from storage.ingress.receipts import IngressReceipt
from storage.ingress.receipts import receipt_from_row as ingress_from_row
from storage.port import AuditEntry, Row, SqlTx
from storage.work_admin import AUDIT_COLUMNS, audit_from_row
from storage.work_store import WorkStore

MAX_LIMIT = 200
RECEIPT_STATUSES = ("pending", "refused", "confirmed")


@attrs.frozen(kw_only=True)
class Page:
    """Which slice of a list: ``after`` is the last id of the previous page."""

    after: str | None = None
    oldest_first: bool = False
    since_us: int | None = None
    until_us: int | None = None  # exclusive
    limit: int = 50


@attrs.frozen(kw_only=True)
class AttemptFilter:
    outcome: str | None = None  # an outcome class; "none": no outcome recorded yet
    operation: str | None = None
    status: int | None = None
    binding_id: str | None = None
    page: Page = Page()


@attrs.frozen(kw_only=True)
class CommandFilter:
    settlement: str | None = None
    local_object: str | None = None
    local_id: str | None = None
    binding_id: str | None = None
    binding_generation: int | None = None
    catalog_revision: int | None = None
    operation: str | None = None
    page: Page = Page()


@attrs.frozen(kw_only=True)
class ReceiptFilter:
    status: str | None = None  # pending (not refused), refused (pending with an error), confirmed
    page: Page = Page()


@attrs.frozen(kw_only=True)
class AuditFilter:
    actor: str | None = None
    action: str | None = None
    target: str | None = None
    page: Page = Page()


@attrs.frozen(kw_only=True)
class FoundAttempt:
    """An attempt with the command facts its list filters on."""

    attempt: EffectAttempt
    operation: str
    binding_id: str


@attrs.frozen(kw_only=True)
class Found:
    """One search hit: what it is, its id, a short description and its console page."""

    kind: str
    id: str
    summary: str
    href: str


def _keyset(column: str, page: Page) -> tuple[list[str], list[Any], str]:
    clauses: list[str] = []
    params: list[Any] = []
    if page.since_us is not None:
        clauses.append(f"{column} >= ?")
        params.append(id_floor(page.since_us))
    if page.until_us is not None:
        clauses.append(f"{column} < ?")
        params.append(id_floor(page.until_us))
    if page.after is not None:
        clauses.append(f"{column} {'>' if page.oldest_first else '<'} ?")
        params.append(page.after)
    return clauses, params, f" ORDER BY {column} {'ASC' if page.oldest_first else 'DESC'}"


def _where(clauses: Sequence[str]) -> str:
    return " WHERE " + " AND ".join(clauses) if clauses else ""


def _equal(clauses: list[str], params: list[Any], filters: Sequence[tuple[str, Any]]) -> None:
    """``column = ?`` for each filter that was given (None: not filtered)."""
    for column, value in filters:
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)


def _limit(page: Page) -> int:
    return max(1, min(page.limit, MAX_LIMIT))


def _qualified(alias: str, columns: str) -> str:
    return ", ".join(f"{alias}.{c.strip()}" for c in columns.split(","))


def next_after(ids: Sequence[str], page: Page) -> str | None:
    """The next page's token: the last id shown, when the page was full."""
    return ids[-1] if ids and len(ids) >= _limit(page) else None


# A list filtered by its command's operation or binding cannot be led by an index of
# effect_attempts (those columns are the command's): each request examines at most this
# many attempts, newest first (or oldest), joined to their commands, and keeps the
# matches. A page the window ends before it fills carries a token to the window's last
# attempt, so paging on continues further back; a rare operation costs pages, never a
# scan of every attempt (a join led by the command's index sorted all of a binding's
# attempts instead: 11 s at 1M attempts). 2,000: the window's attempts are read by
# primary key, so it must stay small next to a 128 MB buffer pool (10,000 took 0.9 s
# for a REJECTED window at issue 23's size, under load).
SCAN_WINDOW = 2_000


@attrs.frozen(kw_only=True)
class AttemptPage:
    """A page of attempts and where the next one starts (None: there is no more)."""

    items: list[FoundAttempt]
    next_after: str | None
    window_ended: bool  # the page stopped at SCAN_WINDOW attempts examined, not full


async def attempts_find(store: WorkStore, f: AttemptFilter) -> list[FoundAttempt]:
    return (await attempts_page(store, f)).items


async def attempts_page(store: WorkStore, f: AttemptFilter) -> AttemptPage:
    clauses, params, order = _keyset("attempt_id", f.page)
    if f.outcome == "none":
        clauses.append("outcome IS NULL")
    elif f.outcome is not None:
        clauses.append("outcome = ?")
        params.append(f.outcome)
    if f.status is not None:
        clauses.append("response_status = ?")
        params.append(f.status)
    command_side: list[str] = []
    command_params: list[Any] = []
    _equal(command_side, command_params, (("c.operation", f.operation),
                                          ("c.binding_id", f.binding_id)))
    limit = _limit(f.page)
    order_a = order.replace("attempt_id", "a.attempt_id")
    join = "JOIN external_commands c ON c.command_id = a.command_id"
    where_a = _where([f"a.{c}" for c in clauses])
    # The window (with its join inside, under its own LIMIT) is a derived table the
    # optimizer cannot merge or lead from the command's side.
    window = (f"SELECT a.attempt_id, c.operation, c.binding_id FROM effect_attempts a {join}"
              f"{where_a}{order_a} LIMIT {SCAN_WINDOW}")
    if command_side:
        outer = [c.replace("c.", "x.") for c in command_side]
        sql = (f"SELECT {_qualified('a', _ATTEMPT_COLUMNS)}, x.operation, x.binding_id"
               f" FROM ({window}) x JOIN effect_attempts a ON a.attempt_id = x.attempt_id"
               f"{_where(outer)}{order.replace('attempt_id', 'x.attempt_id')} LIMIT ?")
        args: tuple[Any, ...] = (*params, *command_params, limit)
    else:
        sql = (f"SELECT {_qualified('a', _ATTEMPT_COLUMNS)}, c.operation, c.binding_id"
               f" FROM effect_attempts a {join}{where_a}{order_a} LIMIT ?")
        args = (*params, limit)

    async def body(tx: SqlTx) -> AttemptPage:
        rows = await tx.fetchall(sql, args)
        items = [FoundAttempt(attempt=attempt_from_row(r[:-2]), operation=str(r[-2]),
                              binding_id=str(r[-1])) for r in rows]
        token = next_after([i.attempt.attempt_id for i in items], f.page)
        if token is not None or not command_side:
            return AttemptPage(items=items, next_after=token, window_ended=False)
        edge = "MAX" if f.page.oldest_first else "MIN"
        ((examined, last),) = await tx.fetchall(
            f"SELECT COUNT(*), {edge}(attempt_id) FROM ({window}) w", tuple(params))
        if int(examined) < SCAN_WINDOW:
            return AttemptPage(items=items, next_after=None, window_ended=False)
        return AttemptPage(items=items, next_after=str(last), window_ended=True)

    return await store.db.transact(body, name="find.attempts", write=False)


async def commands_find(store: WorkStore, f: CommandFilter) -> list[Command]:
    clauses, params, order = _keyset("command_id", f.page)
    _equal(clauses, params, (("settlement", f.settlement), ("local_object", f.local_object),
                             ("local_id", f.local_id), ("binding_id", f.binding_id),
                             ("principal_generation", f.binding_generation),
                             ("catalog_revision", f.catalog_revision),
                             ("operation", f.operation)))
    sql = f"SELECT {COMMAND_COLUMNS} FROM external_commands{_where(clauses)}{order} LIMIT ?"

    async def body(tx: SqlTx) -> list[Command]:
        return [command_from_row(r) for r in await tx.fetchall(sql, (*params, _limit(f.page)))]

    return await store.db.transact(body, name="find.commands", write=False)


async def receipts_find(store: WorkStore, f: ReceiptFilter) -> list[ResultReceipt]:
    clauses, params, order = _keyset("command_id", f.page)
    if f.status == "confirmed":
        clauses.append("state = 'confirmed'")
    elif f.status == "pending":
        clauses.append("state = 'pending' AND last_error IS NULL")
    elif f.status == "refused":
        clauses.append("state = 'pending' AND last_error IS NOT NULL")
    sql = f"SELECT {_RECEIPT_COLUMNS} FROM result_receipts{_where(clauses)}{order} LIMIT ?"

    async def body(tx: SqlTx) -> list[ResultReceipt]:
        return [receipt_from_row(r) for r in await tx.fetchall(sql, (*params, _limit(f.page)))]

    return await store.db.transact(body, name="find.receipts", write=False)


async def audit_find(store: WorkStore, f: AuditFilter) -> list[AuditEntry]:
    clauses, params, order = _keyset("audit_id", f.page)
    _equal(clauses, params, (("actor", f.actor), ("action", f.action), ("target_id", f.target)))
    sql = f"SELECT {AUDIT_COLUMNS} FROM audit_log{_where(clauses)}{order} LIMIT ?"

    async def body(tx: SqlTx) -> list[AuditEntry]:
        return [audit_from_row(r) for r in await tx.fetchall(sql, (*params, _limit(f.page)))]

    return await store.db.transact(body, name="find.audit", write=False)


SEARCH_LIMIT = 20

# (kind, statement, page) per id column searched: each an equality on an indexed column.
_BY_ULID: tuple[tuple[str, str, str], ...] = (
    ("work item", "SELECT work_id, family, state FROM work_items WHERE work_id = ?",
     "/admin/work/{}"),
    ("command", "SELECT command_id, operation, settlement FROM external_commands"
     " WHERE command_id = ?", "/admin/effects/commands/{}"),
    ("attempt", "SELECT attempt_id, method, outcome FROM effect_attempts WHERE attempt_id = ?",
     "/admin/effects/attempts/{}"),
    ("Runtime receipt", "SELECT command_id, state, remote_id FROM result_receipts"
     " WHERE command_id = ?", "/admin/effects/commands/{}"),
    ("ingress receipt", "SELECT receipt_id, route, state FROM ingress_receipts"
     " WHERE receipt_id = ?", "/admin/ingress/{}"),
    ("audit entry", "SELECT audit_id, action, target_id FROM audit_log WHERE audit_id = ?",
     "/admin/find/audit?target={2}"),
)
_BY_TEXT: tuple[tuple[str, str, str], ...] = (
    ("binding", "SELECT binding_id, provider, state FROM principal_bindings"
     " WHERE binding_id = ?", "/admin/bindings#{}"),
    ("remote link", "SELECT local_id, remote_object, remote_id FROM remote_links"
     " WHERE remote_id = ?", "/admin/find/commands?local_id={}"),
    ("Runtime receipt", "SELECT command_id, state, remote_id FROM result_receipts"
     " WHERE remote_id = ?", "/admin/effects/commands/{}"),
    ("command", "SELECT command_id, operation, settlement FROM external_commands"
     " WHERE intent_id = ?", "/admin/effects/commands/{}"),
    ("command", "SELECT command_id, operation, settlement FROM external_commands"
     " WHERE handoff_key = ?", "/admin/effects/commands/{}"),
    ("work item", "SELECT work_id, family, state FROM work_items WHERE subject_id = ?",
     "/admin/work/{}"),
)


def _found(kind: str, href: str, row: Row) -> Found:
    values = [str(v) for v in row]
    return Found(kind=kind, id=values[0],
                 summary=", ".join(v for v in values[1:] if v != "None"),
                 href=href.format(*(quote(v, safe="") for v in values)))


async def search(store: WorkStore, text: str) -> list[Found]:
    """Every row whose id (of any kind) is ``text``: point reads on indexed columns."""
    needle = text.strip()
    statements = (_BY_ULID if is_ulid(needle) else ()) + _BY_TEXT

    async def body(tx: SqlTx) -> list[Found]:
        found: list[Found] = []
        for kind, sql, href in statements:
            rows = await tx.fetchall(sql + " LIMIT ?", (needle, SEARCH_LIMIT))
            found.extend(_found(kind, href, r) for r in rows)
        seen: set[tuple[str, str]] = set()
        unique = []
        for hit in found:
            if (hit.kind, hit.id) not in seen:
                seen.add((hit.kind, hit.id))
                unique.append(hit)
        return unique[:SEARCH_LIMIT]

    return await store.db.transact(body, name="find.search", write=False)


@attrs.frozen(kw_only=True)
class Exchange:
    """A failed call's stored exchange excerpt (already redacted and bounded)."""

    request_body: str
    response_headers: tuple[tuple[str, str], ...]
    response_body: str


def exchange_from_text(text: str | None) -> Exchange | None:
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not isinstance(doc, dict):
        return None
    headers = tuple((str(h[0]), str(h[1])) for h in doc.get("response_headers") or ()
                    if isinstance(h, list) and len(h) == 2)
    return Exchange(request_body=str(doc.get("request_body") or ""),
                    response_headers=headers,
                    response_body=str(doc.get("response_body") or ""))


async def attempt_exchange(store: WorkStore, attempt_id: str) -> Exchange | None:
    """The exchange excerpt recorded with ``attempt_id``'s outcome (None: none kept)."""

    async def body(tx: SqlTx) -> Exchange | None:
        rows = await tx.fetchall(
            "SELECT exchange_excerpt FROM effect_attempts WHERE attempt_id = ?", (attempt_id,))
        return exchange_from_text(rows[0][0]) if rows else None

    return await store.db.transact(body, name="find.attempt_exchange", write=False)


def request_headers(safe_headers: str) -> list[tuple[str, str]]:
    """The request headers an attempt recorded at its checkpoint (already the safe ones:
    never the credential), as (name, value) pairs; [] when unreadable."""
    try:
        doc = json.loads(safe_headers)
    except ValueError:
        return []
    if not isinstance(doc, dict):
        return []
    return sorted((str(k), str(v)[:200]) for k, v in doc.items()
                  if not _SECRET_HEADER.search(str(k)))


# Belt and braces: a header named like a credential is never shown even if recorded.
_SECRET_HEADER = re.compile(r"(?i)authori[sz]ation|cookie|token|secret|api[-_]?key|signature")


async def last_attempts(store: WorkStore, work_ids: Sequence[str]) -> dict[str, int]:
    """When each item's last attempt ended (its newest execution), by work id; one read
    on the executions' primary key (work_id, epoch) for a page of ids."""
    if not work_ids:
        return {}
    marks = ", ".join("?" for _ in work_ids)

    async def body(tx: SqlTx) -> dict[str, int]:
        rows = await tx.fetchall(
            "SELECT work_id, MAX(finished_at_us) FROM work_executions"
            f" WHERE work_id IN ({marks}) GROUP BY work_id", tuple(work_ids))
        return {str(r[0]): int(r[1]) for r in rows if r[1] is not None}

    return await store.db.transact(body, name="find.last_attempts", write=False)


@attrs.frozen(kw_only=True)
class IngressFilter:
    state: str | None = None  # received, materialized, quarantined
    route: str | None = None
    binding_id: str | None = None
    page: Page = Page()


async def ingress_find(store: WorkStore, f: IngressFilter) -> list[IngressReceipt]:
    """Ingress receipts beyond the newest: every one, paged by receipt id."""
    clauses, params, order = _keyset("receipt_id", f.page)
    _equal(clauses, params, (("state", f.state), ("route", f.route),
                             ("binding_id", f.binding_id)))
    sql = f"SELECT {INGRESS_COLUMNS} FROM ingress_receipts{_where(clauses)}{order} LIMIT ?"

    async def body(tx: SqlTx) -> list[IngressReceipt]:
        return [ingress_from_row(r)
                for r in await tx.fetchall(sql, (*params, _limit(f.page)))]

    return await store.db.transact(body, name="find.ingress", write=False)
