"""Every console page and ``/admin/api/`` listing reads by index, in bounded pages (MariaDB).

Not a timing test: a modest database (loaded by ``bench.bigtables``' own loader: mostly
terminal history, some ready work, commands with attempts and receipts) is analysed, the
console is driven through every page and listing (filters and a second keyset page
included) plus the depth sampler's reads, every statement is recorded, and MariaDB's
``EXPLAIN`` of each is checked:

* no full scan (``type = ALL``) of a table that grows with production, nor a walk of a
  whole index (``type = index``) hoping to meet the page's rows early;
* a row listing has a LIMIT, pages by key (never OFFSET), and needs no sort of a large
  range (``Using filesort`` only over a range estimated small);
* an aggregate (``COUNT``, ``MIN``, ...) without a LIMIT reads a range estimated at most
  a fifth of the table: never a count of the whole history;
* a ``DISTINCT`` without a LIMIT is a loose index scan (one index entry per group).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from admin_ui.app import create_app
from admin_ui.effects import effect_extensions
from bench import bigtables
from config.catalog import load_catalog
from storage.port import (
    PIN_COUNT_LIMIT,
    Database,
    DbStats,
    PublishParams,
    RevisionConflict,
    Row,
    SqlTx,
)
from storage.work_store import WorkStore
from tests.admin.support import PASSWORDS, console_harness, csrf_from
from tests.support.backends import FreshDatabase, fresh_database

T = TypeVar("T")
READY, TERMINAL = 2000, 60000
# Tables that grow with production; small ones (replicas, leases) may be scanned.
GROWING = {"work_items", "work_executions", "effect_attempts", "external_commands",
           "result_receipts", "handoff_admissions", "audit_log", "handoff_quarantine"}


class _Tx:
    def __init__(self, inner: SqlTx, seen: list[tuple[str, tuple[Any, ...]]]) -> None:
        self._inner, self._seen = inner, seen

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> int:
        return await self._inner.execute(sql, params)

    async def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> int:
        return await self._inner.executemany(sql, rows)

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        self._seen.append((sql, tuple(params)))
        return await self._inner.fetchall(sql, params)


class _Recording:
    def __init__(self, inner: Database) -> None:
        self.inner = inner
        self.backend = inner.backend
        self.stats: DbStats = inner.stats
        self.max_statement_bytes = inner.max_statement_bytes
        self.seen: list[tuple[str, tuple[Any, ...]]] = []

    async def transact(self, body: Callable[[SqlTx], Awaitable[T]], *, name: str,
                       write: bool = True) -> T:
        return await self.inner.transact(lambda tx: body(_Tx(tx, self.seen)), name=name,
                                         write=write)

    async def ping(self) -> None:
        await self.inner.ping()

    async def aclose(self) -> None:
        await self.inner.aclose()


def _load(database: FreshDatabase, tmp_path: Path) -> None:
    name = database.url.rsplit("/", 1)[1]
    now = bigtables.now_us()
    paths = {t: tmp_path / f"{t}.tsv" for t in bigtables.TABLES}
    files = {t: paths[t].open("w") for t in bigtables.TABLES}
    for j in range(READY):
        files["work_items"].write(bigtables._tsv(bigtables._ready_row(j, now)))
    for i in range(TERMINAL):
        bigtables._terminal(i, TERMINAL, now, files)
    for f in files.values():
        f.close()
    for table, path in paths.items():
        assert bigtables._load_file(name, table, path).wait() == 0
        bigtables.mariadb_client(name, f"ANALYZE TABLE {table}", capture=True)


def _explain_rows(rows: list[Row]) -> list[dict[str, Any]]:
    keys = ("id", "select_type", "table", "type", "possible_keys", "key", "key_len", "ref",
            "rows", "Extra")
    return [dict(zip(keys, r, strict=False)) for r in rows]


def _limit(text: str, params: tuple[Any, ...]) -> int:
    found = re.search(r"\bLIMIT\s+(\?|\d+)", text, re.IGNORECASE)
    if found is None:
        return 0
    if found.group(1) != "?":
        return int(found.group(1))
    return int(params[text[:found.end()].count("?") - 1])


@pytest.fixture
async def mysql_db(tmp_path: Path) -> Any:
    async with fresh_database("mysql", tmp_path) as tdb:
        yield tdb


async def test_console_reads_are_indexed_and_bounded(mysql_db: FreshDatabase,
                                                     tmp_path: Path) -> None:
    _load(mysql_db, tmp_path)
    plain = await mysql_db.open_store()
    recording = _Recording(plain.db)
    store = WorkStore(recording, plain.dialect)
    async with console_harness(mysql_db, store=store) as console:
        app = create_app(console.replica,
                         effect_extensions(load_catalog(console.replica.settings)))
        client = app.test_client()
        form = await client.get("/admin/sign-in")
        signed = await client.post("/admin/sign-in", form={
            "name": "ada", "password": PASSWORDS["ada"],
            "csrf_token": csrf_from(await form.get_data(as_text=True)), "next": "/admin/"})
        assert signed.status_code == 302
        dead = (await (await client.get("/admin/api/work?state=dead&limit=2")).get_json())
        effect = (await (await client.get(
            "/admin/api/work?family=external_effect&limit=1")).get_json())["items"][0]
        command = effect["subject_id"]
        attempt = (await (await client.get(f"/admin/api/effects/commands/{command}")
                          ).get_json())["attempts"][0]["attempt_id"]
        after = dead["next_after"]
        paths = [
            "/admin/", "/admin/overview/live", "/admin/api/overview", "/admin/api/replicas",
            "/admin/work", "/admin/work?state=succeeded", f"/admin/work?state=dead&after={after}",
            "/admin/work?family=noop", "/admin/work?family=crm.push&state=dead",
            "/admin/work?org=org-7", "/admin/work?org=org-7&state=pending",
            "/admin/work?subject=lead-42", "/admin/work?lane=lane-10",
            "/admin/api/work", f"/admin/api/work?after={after}",
            "/admin/api/work?state=cancelled&family=noop",
            f"/admin/work/{dead['items'][0]['work_id']}",
            f"/admin/api/work/{effect['work_id']}",
            "/admin/dlq", "/admin/dlq?family=noop", "/admin/dlq?failure_class=bad_payload",
            "/admin/dlq?family=noop&failure_class=auth_revoked&unreplayed=1",
            f"/admin/dlq?after={after}", "/admin/api/dlq", "/admin/api/dlq?failure_class=x",
            "/admin/audit", "/admin/api/audit", "/admin/operators", "/admin/api/operators",
            "/admin/effects", "/admin/api/effects/unknown",
            f"/admin/effects/commands/{command}", f"/admin/api/effects/commands/{command}",
            f"/admin/effects/attempts/{attempt}",
        ]
        for path in paths:
            response = await client.get(path)
            assert response.status_code == 200, (path, await response.get_data(as_text=True))
        # The depth sampler's reads (every replica, every interval).
        now = bigtables.now_us()
        await store.work_depths()
        await store.work_outcome_counts(now - 5_000_000, now)
        await store.flow_sample(now - 5_000_000, now)
        await store.effect_unknown_backlog()

    async def table_rows(tx: SqlTx) -> dict[str, int]:
        rows = await tx.fetchall(
            "SELECT table_name, table_rows FROM information_schema.tables"
            " WHERE table_schema = DATABASE()")
        return {str(t): int(n or 0) for t, n in rows}

    sizes = await plain.db.transact(table_rows, name="t", write=False)
    assert sizes["work_items"] > (READY + TERMINAL) // 2  # analysed

    problems: list[str] = []
    seen = list(dict.fromkeys(recording.seen))
    assert len(seen) > 30, "the pages reached the store"
    for sql, params in seen:
        text = " ".join(sql.split())
        if not text.upper().startswith("SELECT"):
            continue
        where = text[text.find(" FROM "):][:220]  # the statement without its column list
        if " OFFSET " in text.upper():
            problems.append(f"OFFSET paging: {where}")
        plan = _explain_rows(await plain.db.transact(
            lambda tx, s=sql, p=params: tx.fetchall("EXPLAIN " + s, p),  # type: ignore[misc]
            name="t", write=False))
        limited = re.search(r"\bLIMIT\b", text, re.IGNORECASE) is not None
        aggregate = re.search(r"\b(COUNT|MIN|MAX|SUM)\s*\(", text, re.IGNORECASE)
        for step in plan:
            table = str(step["table"] or "")
            if table not in GROWING:
                continue
            # MariaDB writes "N (P%)" when a rowid filter narrows the rows read.
            estimate = int(str(step["rows"] or 0).split()[0])
            share = estimate / max(1, sizes.get(table, 1))
            if step["type"] == "ALL":
                problems.append(f"full scan of {table}: {where}")
            if step["type"] == "index" and share > 0.05 and " WHERE " in text:
                # A filtered page walking a whole index (the primary key, newest first)
                # hoping to meet its rows early: at scale it meets every newer row first.
                problems.append(f"walks a whole index of {table} ({step['key']}): {where}")
            # (A sort of fewer rows than the LIMIT asks for is the cheapest plan.)
            if (limited and "filesort" in str(step["Extra"] or "").lower()
                    and share > 0.05 and estimate > _limit(text, params)):
                problems.append(f"sorts {estimate} rows of {table}: {where}")
            if aggregate and not limited and step["select_type"] in ("SIMPLE", "PRIMARY") \
                    and share > 0.2:
                problems.append(f"counts {estimate} rows of {table} ({share:.0%}):"
                                f" {where}")
        point = re.search(r"WHERE\s+\(?\w*\.?(work_id|replay_of|dedupe_key|command_id"
                          r"|attempt_id|handoff_key)"
                          r"\s*(=|IN)", text, re.IGNORECASE)
        # DISTINCT over an index prefix is one entry per group (a loose index scan).
        loose = text.upper().startswith("SELECT DISTINCT") and all(
            "for group-by" in str(step["Extra"] or "") for step in plan)
        if ("FROM work_items" in text and not limited and not aggregate and not point
                and not loose):
            problems.append(f"unbounded listing: {where} {plan}")
    assert problems == [], "\n".join(problems)


async def test_catalog_pin_reads_are_bounded_index_ranges(mysql_db: FreshDatabase,
                                                          tmp_path: Path) -> None:
    """``catalog list`` and ``catalog delete`` ask about a revision's unsettled work on
    (catalog_revision, settlement) and (catalog_revision, state) (migration 0031): a
    range over the open commands and the live items only, bounded by a LIMIT, never the
    revision's history. Every loaded row is pinned to revision 7 (62,000 items, 60,000 of
    them terminal); before 0031 the count was ``ref`` on the single-column revision index,
    over every one of them."""
    _load(mysql_db, tmp_path)
    plain = await mysql_db.open_store()
    recording = _Recording(plain.db)
    store = WorkStore(recording, plain.dialect)
    await store.catalog_publish(PublishParams(revision=7, digest="sha256:catalog",
                                              content="{}", actor="t", role="admin",
                                              reason="plans"), bigtables.now_us())
    pins = await store.catalog_pins(7)
    assert (pins.open_commands, pins.live_work) == (0, PIN_COUNT_LIMIT)
    assert (pins.open_commands_more, pins.live_work_more) == (False, True)
    with pytest.raises(RevisionConflict, match=r"0 open commands, 1000\+ live work items"):
        await store.catalog_delete(7, actor="t", role="admin", reason="plans",
                                   now_us=bigtables.now_us())
    await store.catalog_list()

    async def table_rows(tx: SqlTx) -> dict[str, int]:
        rows = await tx.fetchall(
            "SELECT table_name, table_rows FROM information_schema.tables"
            " WHERE table_schema = DATABASE()")
        return {str(t): int(n or 0) for t, n in rows}

    sizes = await plain.db.transact(table_rows, name="t", write=False)
    pinned = {"external_commands": "external_commands_revision_settlement",
              "work_items": "work_items_revision_state"}
    problems: list[str] = []
    read: set[str] = set()
    for sql, params in dict.fromkeys(recording.seen):
        if "catalog_revision = ?" not in sql:
            continue
        if re.search(r"\bLIMIT\b", sql) is None:
            problems.append(f"unbounded: {sql}")
        plan = _explain_rows(await plain.db.transact(
            lambda tx, s=sql, p=params: tx.fetchall("EXPLAIN " + s, p),  # type: ignore[misc]
            name="t", write=False))
        for step in plan:
            table = str(step["table"] or "")
            if table not in pinned:
                continue
            read.add(table)
            share = int(step["rows"] or 0) / max(1, sizes.get(table, 1))
            if (step["key"], step["type"]) not in ((pinned[table], "range"),
                                                   (pinned[table], "ref")) or share > 0.2:
                problems.append(f"{sql} -> {step}")
    assert read == set(pinned), recording.seen
    assert problems == [], "\n".join(problems)
