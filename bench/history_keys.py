"""The executions' history per org, binding and provider operation (issue 23 item 1,
migration 0048): its reads on MariaDB at the density 20M terminal rows over the
retention window imply, and the statements an effect finalization costs.

Density: 20M terminal executions over ``work_days`` (30, docs/retention.md) is
666,667 a day, 463 a minute. The rollup is filled as if half were effect items spread
over 4 orgs x 2 bindings x 3 operations, every (key, outcome) of them finishing every
minute on all 4 shards (384 rows a minute: close to one row per execution, the most a
minute can hold), and the other half 3 families x 4 outcomes x 4 shards (48 rows): minute
and 5-minute rows (migration 0049) for the last ``--minute-days`` days (the finest levels
a preset reads: a 6 h range reads 5-minute rows, minutes before 0049; 24 h and longer
read hours), hour, six-hour (0049) and day rows for ``--days`` days (the retention
window; a build before 0049 never reads the new levels, so the same fill measures it
too), each level written by ``INSERT ... SELECT`` from MariaDB's ``seq_0_to_N`` engine.
``work_executions`` holds the last ``--journal-hours`` hours at 463 a minute, the effect
half with its terminal work items and commands (the rows the items
behind a narrowed point are joined to).

Reads: ``admin_ui.history.history_for`` (the whole read model the page, API and CLI
serve: executions, effect path, quota, queue) per target, ``--requests`` each, and
``history_executions`` for the items behind a point; p50/p95 in ms, and the load.

``--statements`` instead counts (SQLite, ``DbStats.statements``) the statements of one
effect finalization: the first of a minute, the steady state (its key's rows exist), and a
batch of 8 effect items over 2 bindings in one call. It uses only APIs ``main`` has too,
so the same file run against ``main`` gives the "before".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from bench.admin_ui import fresh_database
from storage.migrate import migrate
from storage.open import open_store
from storage.port import SqlTx
from storage.work_store import WorkStore

MINUTE_US, HOUR_US, DAY_US = 60_000_000, 3_600_000_000, 86_400_000_000
FIVE_MIN_US, SIX_HOURS_US = 300_000_000, 21_600_000_000
PER_DAY = 20_000_000 // 30
ORGS = ("org-1", "org-2", "org-3", "org-4")
BINDINGS = ("hubspot-main", "hubspot-eu")
OPERATIONS = ("hubspot.contact.update_jobtitle", "hubspot.deal.create",
              "hubspot.note.create")
OUTCOMES = ("succeeded", "dead", "retry", "cancelled")
OTHER_FAMILIES = ("noop", "outreach.sync", "subscription.reconcile")
EFFECT = "external_effect"
SHARDS = 4


def _now_us() -> int:
    return time.time_ns() // 1000


def _union(rows: list[tuple[Any, ...]], names: tuple[str, ...]) -> str:
    def lit(v: Any) -> str:
        return str(v) if isinstance(v, int) else f"'{v}'"

    return " UNION ALL ".join(
        "SELECT " + ", ".join(f"{lit(v)} AS {n}" for v, n in zip(row, names, strict=True))
        for row in rows)


def rollup_keys(shards: int = SHARDS, outcomes: int = len(OUTCOMES)) -> list[tuple[Any, ...]]:
    """The keys every minute holds: ``shards`` of the 4 and the first ``outcomes``
    outcomes (4 and 4: the worst case, 432 rows a minute)."""
    keys: list[tuple[Any, ...]] = [(EFFECT, o, org, b, p, s) for org in ORGS for b in BINDINGS
                                   for p in OPERATIONS for o in OUTCOMES[:outcomes]
                                   for s in range(shards)]
    keys += [(f, o, "", "", "", s) for f in OTHER_FAMILIES for o in OUTCOMES[:outcomes]
             for s in range(shards)]
    return keys


async def fill_rollup(store: WorkStore, now: int, days: int, minute_days: int,
                      shards: int = SHARDS, outcomes: int = len(OUTCOMES),
                      unkeyed: bool = False) -> int:
    """``unkeyed``: the rollup as ``main`` (before migration 0048) holds the same
    executions: one effect key, no org, binding or operation columns (the baseline)."""
    keys = rollup_keys(shards, outcomes)
    per_minute = max(1, PER_DAY // 1440 // len(keys))
    key_columns = "org_id, binding_id, operation, "
    if unkeyed:
        keys = sorted({(k[0], k[1], k[5]) for k in keys})
        per_minute = max(1, PER_DAY // 1440 // len(keys))
        union = _union(keys, ("family", "outcome", "shard"))
        key_columns = ""
    else:
        union = _union(keys, ("family", "outcome", "org_id", "binding_id", "operation",
                              "shard"))
    picked = "".join(f"k.{c.strip()}, " for c in key_columns.split(",") if c.strip())

    async def wipe(tx: SqlTx) -> None:
        await tx.execute("DELETE FROM history_rollup")

    await store.db.transact(wipe, name="bench.rollup_wipe", write=True)
    # One statement per 60 buckets (~26,000 rows): each answers within the adapter's
    # statement deadline on a loaded machine.
    for level, span in ((MINUTE_US, minute_days * DAY_US), (FIVE_MIN_US, minute_days * DAY_US),
                        (HOUR_US, days * DAY_US), (SIX_HOURS_US, days * DAY_US),
                        (DAY_US, days * DAY_US)):
        count = span // level
        first = now - now % level - (count - 1) * level
        for low in range(0, count, 60):
            high = min(count, low + 60) - 1

            async def body(tx: SqlTx, level: int = level, first: int = first,
                           low: int = low, high: int = high) -> None:
                await tx.execute(
                    "INSERT INTO history_rollup (level_us, bucket_us, family, outcome,"
                    f" {key_columns}shard, executions)"
                    f" SELECT {level}, {first} + s.seq * {level}, k.family, k.outcome,"
                    f" {picked}k.shard,"
                    f" {per_minute * (level // MINUTE_US)}"
                    f" FROM seq_{low}_to_{high} s CROSS JOIN ({union}) k")

            await store.db.transact(body, name="bench.rollup", write=True)

    async def count_rows(tx: SqlTx) -> int:
        ((n,),) = await tx.fetchall("SELECT COUNT(*) FROM history_rollup")
        return int(n)

    return await store.db.transact(count_rows, name="bench.rollup_count", write=False)


async def _defaults(tx: SqlTx, table: str) -> dict[str, str]:
    """A value for every NOT NULL column without a default: 0 or ''."""
    rows = await tx.fetchall(
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = DATABASE() AND table_name = ? AND is_nullable = 'NO'"
        " AND column_default IS NULL", (table,))
    return {str(c): ("0" if str(t) in ("bigint", "int") else "''") for c, t in rows}


async def fill_journal(store: WorkStore, now: int, hours: int) -> int:
    """``hours`` of executions at 463 a minute (even ones effect items, with their terminal
    work item and command, keyed round-robin over orgs x bindings x operations)."""
    n = hours * 60 * (PER_DAY // 1440)
    gap = (hours * HOUR_US) // n
    start = now - hours * HOUR_US
    combos = [(o, b, p) for o in ORGS for b in BINDINGS for p in OPERATIONS]

    def case(values: list[str]) -> str:
        whens = " ".join(f"WHEN {i} THEN '{v}'" for i, v in enumerate(values))
        return f"CASE (s.seq DIV 2) % {len(values)} {whens} END"

    org, binding, operation = (case([c[i] for c in combos]) for i in range(3))
    outcome = " ".join(f"WHEN {i} THEN '{o}'" for i, o in enumerate(OUTCOMES))

    async def columns(tx: SqlTx) -> tuple[dict[str, str], dict[str, str]]:
        return await _defaults(tx, "work_items"), await _defaults(tx, "external_commands")

    work, command = await store.db.transact(columns, name="bench.columns", write=False)
    work.update({
        "work_id": "LPAD(s.seq, 26, '0')", "family": f"'{EFFECT}'", "org_id": org,
        "subject_kind": "'command'", "subject_id": "CONCAT('c', LPAD(s.seq, 25, '0'))",
        "definition_ref": operation, "state": "'succeeded'",
        "created_at_us": f"{start} + s.seq * {gap}",
        "updated_at_us": f"{start} + s.seq * {gap}"})
    command.update({
        "command_id": "CONCAT('c', LPAD(s.seq, 25, '0'))", "org_id": org,
        "binding_id": binding, "operation": operation, "settlement": "'succeeded'",
        "created_at_us": f"{start} + s.seq * {gap}"})
    per = 10_000
    for low in range(0, n, per):
        seq = f"seq_{low}_to_{min(n, low + per) - 1}"

        async def body(tx: SqlTx, seq: str = seq) -> None:
            await tx.execute(
                f"INSERT INTO work_items ({', '.join(work)}) SELECT {', '.join(work.values())}"
                f" FROM {seq} s WHERE s.seq % 2 = 0")
            await tx.execute(
                f"INSERT INTO external_commands ({', '.join(command)})"
                f" SELECT {', '.join(command.values())} FROM {seq} s WHERE s.seq % 2 = 0")
            await tx.execute(
                "INSERT INTO work_executions (work_id, ownership_epoch, family, attempt,"
                " replica, outcome, finished_at_us) SELECT LPAD(s.seq, 26, '0'), 1,"
                f" CASE WHEN s.seq % 2 = 0 THEN '{EFFECT}' ELSE 'noop' END, 1, 'bench',"
                f" CASE (s.seq DIV 7) % {len(OUTCOMES)} {outcome} END,"
                f" {start} + s.seq * {gap} FROM {seq} s")

        await store.db.transact(body, name="bench.journal", write=True)
    return n


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {"p50_ms": round(statistics.median(ordered), 1), "p95_ms": round(p95, 1)}


TARGETS = {
    "15m binding": "range=15m&binding=hubspot-eu",
    "1h binding": "range=1h&binding=hubspot-eu",
    "6h binding": "range=6h&binding=hubspot-eu",
    "24h binding": "range=24h&binding=hubspot-eu",
    "7d binding": "range=7d&binding=hubspot-eu",
    "6h org": "range=6h&org=org-2",
    "7d operation": "range=7d&operation=hubspot.deal.create",
    "24h org+binding+operation": "range=24h&org=org-3&binding=hubspot-main"
                                 "&operation=hubspot.note.create",
    "custom 30d binding": "custom30&binding=hubspot-main",
    "6h family effect + org": f"range=6h&family={EFFECT}&org=org-1",
    "6h all (unfiltered)": "range=6h",
    "7d all (unfiltered)": "range=7d",
}


def _pairs(query: str, now: int) -> list[tuple[str, str]]:
    pairs = [tuple(p.split("=", 1)) for p in query.split("&")]
    out: list[tuple[str, str]] = []
    for p in pairs:
        if p == ("custom30",):
            out += [("from", str(now // 1_000_000 - 30 * 86_400)), ("to", str(now // 1_000_000))]
        else:
            out.append((p[0], p[1]))
    return out


async def reads(store: WorkStore, now: int, requests: int) -> dict[str, dict[str, float]]:
    from admin_ui.history import history_for

    try:
        from storage.history import ExecutionFilter
    except ImportError:  # main, before migration 0048: a stand-in never used
        ExecutionFilter = None  # type: ignore[assignment,misc]

    out: dict[str, dict[str, float]] = {}
    for name, query in TARGETS.items():
        times = []
        for _ in range(requests):
            t0 = time.perf_counter()
            doc = await history_for(store, _pairs(query, now), now)
            times.append((time.perf_counter() - t0) * 1000)
        assert doc["throughput"], name
        out[name] = _ms(times)
    # The items behind a point: a minute, a 5-minute (6 h) and a 2-hour (7 d) bucket, a
    # binding with items and one with none (every row of the bucket examined).
    for label, span, binding in (("1 min", MINUTE_US, "hubspot-eu"),
                                 ("5 min", 5 * MINUTE_US, "hubspot-eu"),
                                 ("2 h", 2 * HOUR_US, "hubspot-eu"),
                                 ("2 h, binding with none", 2 * HOUR_US, "nobody")):
        times = []
        since = now - span - 10 * MINUTE_US
        for _ in range(requests):
            t0 = time.perf_counter()
            try:
                await store.history_executions(since, since + span, family=None,
                                               outcome="dead", limit=100,
                                               where=ExecutionFilter(binding=binding))
            except TypeError:  # main: no narrowed items (the baseline has no such target)
                break
            times.append((time.perf_counter() - t0) * 1000)
        if times:
            out[f"items behind {label}, {binding}"] = _ms(times)
    return out


async def run(days: int, minute_days: int, hours: int, requests: int, shards: int,
              outcomes: int, unkeyed: bool) -> dict[str, Any]:
    async with fresh_database() as url:
        store = await open_store(url, pool_size=4)
        try:
            now = _now_us()
            await migrate(store.db, store.dialect, now)
            t0 = time.perf_counter()
            rollup = await fill_rollup(store, now, days, minute_days, shards, outcomes,
                                       unkeyed)
            journal = await fill_journal(store, now, hours)
            fill_s = time.perf_counter() - t0
            load = os.getloadavg()[0]
            figures = await reads(store, now, requests)
        finally:
            await store.db.aclose()
    return {"bench": "history_keys", "unkeyed": unkeyed, "per_day": PER_DAY, "days": days,
            "minute_days": minute_days, "shards": shards, "outcomes": outcomes,
            "rollup_rows_per_minute": len({(k[0], k[1], k[5]) if unkeyed else k
                                           for k in rollup_keys(shards, outcomes)}),
            "rollup_rows": rollup, "journal_rows": journal,
            "fill_s": round(fill_s, 1), "reads": figures,
            "load_1m_before_after": [round(load, 1), round(os.getloadavg()[0], 1)]}


async def statements() -> dict[str, Any]:
    """Statements of effect finalizations on SQLite (DbStats), this checkout's code."""
    import attrs

    from daemon.core.outcomes import Succeeded
    from tests.support.backends import fresh_database as fresh
    from tests.support.commands import accept_pinned, draft
    from tests.support.work import SEC, T0, claim, finalization

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        async with fresh("sqlite", Path(tmp)) as database:
            store = await database.open_store()
            t = T0 - T0 % MINUTE_US + SEC

            async def finish(leads: list[tuple[str, str]], now: int) -> int:
                for lead, binding in leads:
                    d = attrs.evolve(draft(f"int-{lead}", lead=lead, outbox=f"o-{lead}"),
                                     binding_id=binding)
                    assert (await accept_pinned(store, d, now)).command_id is not None
                items = (await claim(store, family=EFFECT, now=now, limit=len(leads))).claimed
                before = store.db.stats.statements
                results = await store.work_finalize_if_owner(
                    [finalization(i, Succeeded(), now) for i in items], "A", lambda: now)
                assert all(r.applied for r in results)
                return store.db.stats.statements - before

            # Singles in one minute: the first of a (key, shard) inserts its three
            # levels' rows, later ones find them (the steady state): the counts in order.
            singles = [await finish([(f"l-{i}", "hubspot-main")], t + i * SEC)
                       for i in range(12)]
            out["single effect finalizations, in order"] = singles
            out["single, steady state (min)"] = min(singles)
            batches = [await finish([(f"l-b{j}-{i}", ("hubspot-main", "hubspot-eu")[i % 2])
                                     for i in range(8)], t + (20 + j) * SEC)
                       for j in range(6)]
            out["batches of 8 over 2 bindings, in order"] = batches
            out["batch of 8 over 2 bindings, steady state (min)"] = min(batches)
            await store.db.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--days", type=int, default=30, help="days of hour and day rows")
    parser.add_argument("--minute-days", type=int, default=1, help="days of minute rows")
    parser.add_argument("--journal-hours", type=int, default=3,
                        help="hours of work_executions (items behind a point)")
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--shards", type=int, default=SHARDS,
                        help="shard rows per key and minute (1-4; 4: the worst case)")
    parser.add_argument("--outcomes", type=int, default=len(OUTCOMES),
                        help="outcomes per key and minute (1-4; 4: the worst case)")
    parser.add_argument("--unkeyed", action="store_true",
                        help="fill the rollup as main holds it (the baseline; runs on main)")
    parser.add_argument("--statements", action="store_true",
                        help="count the statements of effect finalizations instead")
    args = parser.parse_args()
    if args.statements:
        print(json.dumps(trio.run(statements)))
        return
    print(json.dumps(trio.run(run, args.days, args.minute_days, args.journal_hours,
                              args.requests, args.shards, args.outcomes, args.unkeyed)))


if __name__ == "__main__":
    main()
