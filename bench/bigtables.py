"""Tables as big as a year of production (issue 12): load them fast, then measure.

    python -m bench.bigtables --ready 1000000 --terminal 20000000 [--database NAME]
        [--keep] [--reuse] [--items 20000] [--replicas 4] [--requests 10]
        [--prune-seconds 60 [--prune-facts-days 400]]

What it does (MariaDB at ``$INTEGRATIOND_BENCH_MYSQL_URL``, default
``mysql://root@127.0.0.1:3306/test``):

1. **Load** (skipped with ``--reuse``): a database of its own (``--database``, default
   ``bench_big_<random>``), migrated; the secondary indexes of the loaded tables are
   dropped, every row is written as tab-separated chunk files and bulk-loaded with
   ``LOAD DATA LOCAL INFILE`` (the ``mariadb`` client, ``unique_checks=0``), two chunks
   in flight while the next is generated; then each table's indexes are rebuilt in one
   ``ALTER TABLE`` (a sorted build, far faster than maintaining them row by row) and
   analysed. Rows: ``--ready`` pending items, due now, in three families no replica of
   the kernel run serves (so they stay ready the whole run), and ``--terminal`` items
   over the last 365 days (succeeded 80 %, dead 10 % in three classes, cancelled 5 %,
   skipped 5 %; families noop 40 %, external_effect 10 %, runtime_receipt 10 % with a
   dedupe key, two others), one execution each, and for every external_effect item its
   admission fact, settled command, ACCEPTED effect attempt and confirmed receipt.
2. **Claim throughput**: ``bench.kernel`` (R replica processes draining N noop items) on
   an empty database, then on the big one, in the same run; the ratio (goal >= 0.8).
3. **Idle poll**: ``EXPLAIN`` of the scheduler's two claim reads (expired leases; ready
   items) for a family with nothing to do, and their time.
4. **Console**: server time (``Server-Timing``) of every console page and
   ``/admin/api/`` listing on the big database (``bench.admin_ui.console_figures``),
   against 300 ms.

Prints one JSON line per step and a final summary line. The database is dropped at the
end unless ``--keep`` (reuse it with ``--reuse --database NAME``).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import trio

from bench import kernel
from daemon.core.ids import encode_ulid
from storage.migrate import migrate
from storage.mysql.adapter import MysqlTarget
from storage.open import open_store
from storage.port import SqlTx

MYSQL_URL = os.environ.get("INTEGRATIOND_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
CHUNK = 250_000
YEAR_US = 365 * 86_400 * 1_000_000
READY_FAMILIES = ("crm.push", "crm.sync", "subscription.reconcile")
DEAD_CLASSES = ("provider_rejected", "bad_payload", "auth_revoked")
TABLES = ("work_items", "work_executions", "handoff_admissions", "external_commands",
          "effect_attempts", "result_receipts")

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_T20 = ["".join(_CROCKFORD[(v >> s) & 31] for s in (15, 10, 5, 0)) for v in range(1 << 20)]
_T10 = [_CROCKFORD[v >> 5] + _CROCKFORD[v & 31] for v in range(1 << 10)]


def fast_ulid(millis: int, rnd: int) -> str:
    """:func:`daemon.core.ids.encode_ulid` by table lookups (80 random bits in ``rnd``)."""
    m = millis & ((1 << 50) - 1)
    r = rnd & ((1 << 80) - 1)
    return (_T10[m >> 40] + _T20[(m >> 20) & 0xFFFFF] + _T20[m & 0xFFFFF]
            + _T20[r >> 60] + _T20[(r >> 40) & 0xFFFFF] + _T20[(r >> 20) & 0xFFFFF]
            + _T20[r & 0xFFFFF])


assert fast_ulid(1_800_000_000_123, 0xDEADBEEF12345678ABCD) == encode_ulid(
    1_800_000_000_123, (0xDEADBEEF12345678ABCD).to_bytes(10, "big"))


def now_us() -> int:
    return time.time_ns() // 1000


def _target(database: str) -> MysqlTarget:
    base = MysqlTarget.from_url(MYSQL_URL)
    return MysqlTarget(host=base.host, port=base.port, user=base.user,
                       password=base.password, database=database)


def mariadb_client(database: str | None, sql: str, *, capture: bool = False) -> str:
    base = MysqlTarget.from_url(MYSQL_URL)
    command = ["mariadb", f"--host={base.host}", f"--port={base.port}", f"--user={base.user}",
               "--local-infile=1", "--batch", "--raw"]
    if base.password:
        command.append(f"--password={base.password}")
    if database:
        command.append(database)
    done = subprocess.run([*command, "-e", sql], check=True, text=True,
                          capture_output=capture)
    return done.stdout if capture else ""


# ------------------------------------------------------------------ rows

_WORK_COLUMNS = (
    "work_id, family, org_id, app_installation_id, subject_kind, subject_id, definition_ref,"
    " catalog_revision, catalog_digest, payload, payload_schema_version,"
    " engine_capability_version, queue_class, source_lane, source_seq, target_lane,"
    " target_lane_hold, state, run_after_us, attempt, max_attempts, lease_owner, lease_token,"
    " lease_until_us, ownership_epoch, cancel_requested, rollback_execution_fence_id,"
    " legacy_outcome_receipt_version, legacy_outcome_receipt_digest, terminal_outcome,"
    " failure_class, operator_summary, dedupe_key, replay_of, row_version, created_at_us,"
    " updated_at_us")
_COLUMNS = {
    "work_items": _WORK_COLUMNS,
    "work_executions": ("work_id, ownership_epoch, family, attempt, replica, outcome,"
                        " finished_at_us, reclaimed_by"),
    "handoff_admissions": ("handoff_key, org_id, app_installation_id, runtime_capability_id,"
                           " runtime_work_binding_digest, payload_digest, runtime_outbox_id,"
                           " admission, command_id, receipt_json, created_at_us"),
    "external_commands": (
        "command_id, handoff_key, org_id, app_installation_id, runtime_capability_id,"
        " runtime_work_binding_digest, runtime_name, intent_id, intent_kind, operation,"
        " local_object, local_id, binding_id, binding_generation, catalog_revision,"
        " frozen_request, payload_digest, runtime_outbox_id, settlement, repair_of,"
        " created_at_us, updated_at_us, catalog_digest, link_key, link_generation, remote_id"),
    "effect_attempts": (
        "attempt_id, command_id, work_id, ownership_epoch, lease_token, method, target_path,"
        " safe_headers, body_sha256, idempotency_key, pre_dispatch_evidence,"
        " dispatch_started_at_us, response_status, provider_evidence, outcome, failure_class,"
        " finished_at_us, disposition, disposition_note, disposition_by, disposition_at_us,"
        " row_version, evidence, gave_up_at_us"),
    "result_receipts": ("command_id, intent_id, result_format_version, remote_id,"
                        " canonical_result, result_digest, state, last_error, created_at_us,"
                        " confirmed_at_us"),
}
PAYLOAD = '{"bench": true, "fields": {"jobtitle": "CTO", "company": "Example"}}'


def _tsv(values: tuple[Any, ...]) -> str:
    return "\t".join("\\N" if v is None else str(v) for v in values) + "\n"


def _ready_row(j: int, now: int) -> tuple[Any, ...]:
    created = now - 3_600_000_000 + j
    wid = fast_ulid(created // 1000, j * 0x9E3779B97F4A7C15)
    lane = f"lane-{j % 997}" if j % 10 == 0 else None
    return (wid, READY_FAMILIES[j % 3], f"org-{j % 50}", "install-1", "lead", f"lead-r{j}",
            "", 7, "sha256:catalog", PAYLOAD, 1, 1, "default", lane, j if lane else None,
            None, None, "pending", now - (j % 3600) * 1_000_000, 0, 5, None, None, None, 0, 0,
            None, None, None, None, None, None, None, None, 0, created, created)


def _terminal(i: int, total: int, now: int, files: Mapping[str, TextIO]) -> None:
    created = now - YEAR_US + i * (YEAR_US - 3_600_000_000) // max(1, total)
    finished = created + 2_000_000
    rnd = i * 0x9E3779B97F4A7C15 + 1
    wid = fast_ulid(created // 1000, rnd)
    slot = i % 10
    family = ("noop", "noop", "noop", "noop", "crm.push", "crm.push", "crm.sync",
              "runtime_receipt", "external_effect", "crm.sync")[slot]
    fate = (i // 10) % 20
    failure = summary = None
    if fate < 2:
        state, failure = "dead", DEAD_CLASSES[i % 3]
        summary = f"{failure}: refused (bench)"
    elif fate == 2:
        state = "cancelled"
    elif fate == 3:
        state = "skipped"
    else:
        state = "succeeded"
    subject_kind, subject_id, dedupe = "lead", f"lead-{i % 500_000}", None
    if family == "external_effect":
        command_id = fast_ulid(created // 1000, rnd + 7)
        subject_kind, subject_id = "command", command_id
        key = f"v1:org-{i % 50}:install-1:cap.leads:sha256:binding:intent-{i}"
        files["handoff_admissions"].write(_tsv((
            key, f"org-{i % 50}", "install-1", "cap.leads", "sha256:binding", "sha256:p",
            f"outbox-{i}", "COMMAND_ACCEPTED", command_id, None, created)))
        settlement = "succeeded" if state == "succeeded" else "retired"
        files["external_commands"].write(_tsv((
            command_id, key, f"org-{i % 50}", "install-1", "cap.leads", "sha256:binding", "crm",
            f"intent-{i}", "UPSERT", "crm.contact.update", "lead", f"lead-{i % 500_000}",
            "binding-main", 1, 7, '{"properties": {"jobtitle": "CTO"}}', "sha256:p",
            f"outbox-{i}", settlement, None, created, finished, "sha256:catalog", None, None,
            None)))
        outcome = "ACCEPTED" if state == "succeeded" else "REJECTED"
        files["effect_attempts"].write(_tsv((
            fast_ulid(created // 1000, rnd + 11), command_id, wid, 1, "t", "PATCH",
            "/crm/contacts/1", "{}", "sha256:body", f"idem-{i}", "{}", created + 1000,
            200 if outcome == "ACCEPTED" else 422, "{}", outcome, None, finished - 1_000_000,
            None, None, None, None, 1, "applied", finished - 1_000_000)))
        if state == "succeeded":
            files["result_receipts"].write(_tsv((
                command_id, f"intent-{i}", 1, "1", "{}", "sha256:r", "confirmed", None,
                finished - 900_000, finished)))
    elif family == "runtime_receipt":
        subject_kind, subject_id = "receipt", f"cmd-{i}"
        dedupe = f"receipt:cmd-{i}"
    files["work_items"].write(_tsv((
        wid, family, f"org-{i % 50}", "install-1", subject_kind, subject_id, "", 7,
        "sha256:catalog", PAYLOAD, 1, 1, "default", None, None, None, None, state, created,
        1, 5, None, None, None, 1, 0, None, None, None, state, failure, summary, dedupe, None,
        3, created, finished)))
    files["work_executions"].write(_tsv((wid, 1, family, 1, f"replica-{i % 4}", state,
                                         finished, None)))


def _chunks(ready: int, terminal: int) -> Iterator[tuple[str, int, int]]:
    for start in range(0, ready, CHUNK):
        yield "ready", start, min(ready, start + CHUNK)
    for start in range(0, terminal, CHUNK):
        yield "terminal", start, min(terminal, start + CHUNK)


# ------------------------------------------------------------------ indexes


def secondary_indexes(database: str, table: str) -> list[str]:
    """``ADD [UNIQUE] INDEX name (cols)`` for every secondary index of ``table`` (a column
    indexed by a prefix keeps its length)."""
    out = mariadb_client(database, (
        "SELECT index_name, non_unique, GROUP_CONCAT(CONCAT(column_name,"
        " IF(sub_part IS NULL, '', CONCAT('(', sub_part, ')'))) ORDER BY seq_in_index)"
        " FROM information_schema.statistics WHERE table_schema = DATABASE()"
        f" AND table_name = '{table}' AND index_name <> 'PRIMARY'"
        " GROUP BY index_name, non_unique ORDER BY index_name"), capture=True)
    clauses = []
    for line in out.splitlines()[1:]:
        name, non_unique, cols = line.split("\t")
        unique = "UNIQUE " if non_unique == "0" else ""
        clauses.append(f"ADD {unique}INDEX {name} ({cols})")
    return clauses


def migrated_without_indexes(database: str, tables: Sequence[str]) -> dict[str, list[str]]:
    """Create and migrate ``database``, then drop the secondary indexes of ``tables`` (a
    bulk load into bare tables is several times faster); the clauses that add them back,
    by table."""
    mariadb_client(None, f"CREATE DATABASE {database} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    url = _target(database).describe()

    async def migrated() -> None:
        store = await open_store(url, pool_size=1)
        await migrate(store.db, store.dialect, now_us())
        await store.db.aclose()

    trio.run(migrated)
    indexes = {t: secondary_indexes(database, t) for t in tables}
    for table, clauses in indexes.items():
        if clauses:
            drops = ", ".join("DROP INDEX " + c.split("INDEX ")[1].split(" ")[0]
                              for c in clauses)
            mariadb_client(database, f"ALTER TABLE {table} {drops}")
    return indexes


def load(database: str, ready: int, terminal: int) -> dict[str, Any]:
    started = time.monotonic()
    indexes = migrated_without_indexes(database, TABLES)
    now = now_us()
    rows = dict.fromkeys(TABLES, 0)
    in_flight: list[subprocess.Popen[str]] = []
    with tempfile.TemporaryDirectory(prefix="bigtables-", dir=os.environ.get("TMPDIR")) as tmp:
        for n, (kind, start, stop) in enumerate(_chunks(ready, terminal)):
            paths = {t: Path(tmp) / f"{n}-{t}.tsv" for t in TABLES}
            files = {t: paths[t].open("w") for t in TABLES}
            if kind == "ready":
                for j in range(start, stop):
                    files["work_items"].write(_tsv(_ready_row(j, now)))
            else:
                for i in range(start, stop):
                    _terminal(i, terminal, now, files)
            for f in files.values():
                f.close()
            for proc in in_flight:  # at most one chunk loading while the next is written
                if proc.wait() != 0:
                    raise SystemExit("LOAD DATA failed")
            for path in Path(tmp).glob(f"{n - 1}-*.tsv"):
                path.unlink()
            in_flight = []
            for table, path in paths.items():
                if path.stat().st_size == 0:
                    continue
                rows[table] += sum(1 for _ in path.open())
                in_flight.append(_load_file(database, table, path))
        for proc in in_flight:
            if proc.wait() != 0:
                raise SystemExit("LOAD DATA failed")
    loaded_s = time.monotonic() - started
    for table, clauses in indexes.items():
        if clauses:
            mariadb_client(database, f"ALTER TABLE {table} {', '.join(clauses)}")
        mariadb_client(database, f"ANALYZE TABLE {table}", capture=True)
    sizes = mariadb_client(database, (
        "SELECT table_name, ROUND((data_length + index_length) / 1048576)"
        " FROM information_schema.tables WHERE table_schema = DATABASE()"), capture=True)
    return {"bench": "bigtables.load", "database": database, "ready": ready,
            "terminal": terminal, "rows": rows, "load_s": round(loaded_s, 1),
            "total_s": round(time.monotonic() - started, 1),
            "rows_per_s": round(sum(rows.values()) / max(1e-9, loaded_s)),
            "mb": {line.split("\t")[0]: int(float(line.split("\t")[1] or 0))
                   for line in sizes.splitlines()[1:]}}


def migrate_existing(database: str) -> float:
    """Apply migrations newer than the reused database (seconds taken)."""
    started = time.monotonic()

    async def body() -> None:
        store = await open_store(_target(database).describe(), pool_size=1,
                                 statement_timeout_s=3600)
        await migrate(store.db, store.dialect, now_us())
        await store.db.aclose()

    trio.run(body)
    return round(time.monotonic() - started, 1)


def rebuild_history(database: str) -> dict[str, Any]:
    """The history rollup from the loaded journal rows (LOAD DATA bypasses the journaling
    transaction that maintains it): ``integrationd history rebuild``'s work, timed."""

    async def body() -> dict[str, Any]:
        store = await open_store(_target(database).describe(), pool_size=1,
                                 statement_timeout_s=3600)
        started = time.monotonic()
        # From the first loaded day (the default would skip that partial day).
        rows = await store.history_rebuild(now_us() - YEAR_US - 86_400_000_000)
        elapsed = time.monotonic() - started
        await store.db.aclose()
        return {"bench": "bigtables.history_rebuild", "rollup_rows": rows,
                "seconds": round(elapsed, 1)}

    return trio.run(body)


def _load_file(database: str, table: str, path: Path) -> subprocess.Popen[str]:
    base = MysqlTarget.from_url(MYSQL_URL)
    sql = (f"SET unique_checks = 0; LOAD DATA LOCAL INFILE '{path}' INTO TABLE {table}"
           f" CHARACTER SET utf8mb4 FIELDS TERMINATED BY '\\t' ({_COLUMNS[table]})")
    command = ["mariadb", f"--host={base.host}", f"--port={base.port}", f"--user={base.user}",
               "--local-infile=1", database, "-e", sql]
    return subprocess.Popen(command, text=True)


# ------------------------------------------------------------------ measurements


def idle_poll(database: str) -> dict[str, Any]:
    """EXPLAIN and time the scheduler's claim reads for a family with nothing to do."""
    from storage import work_claims

    now = now_us()
    queries = {
        "expired": work_claims._EXPIRED_SQL.replace("?", "{}").format(
            now, "'noop'", 1, 1, 8),
        "ready": work_claims._READY_SQL.replace("?", "{}").format(
            "'pending'", "'noop'", now, 1, 1, 64),
    }
    out: dict[str, Any] = {"bench": "bigtables.idle_poll"}
    for name, sql in queries.items():
        plan = mariadb_client(database, f"EXPLAIN {sql}", capture=True).splitlines()
        header = plan[0].split("\t")
        out[f"{name}_plan"] = [dict(zip(header, line.split("\t"), strict=False))
                               for line in plan[1:]]
    url = _target(database).describe()

    async def timed() -> dict[str, float]:
        store = await open_store(url, pool_size=1)
        times: dict[str, list[float]] = {k: [] for k in queries}
        for _ in range(50):
            for name, sql in queries.items():
                async def body(tx: SqlTx, sql: str = sql) -> None:
                    await tx.fetchall(sql)
                t0 = time.perf_counter()
                await store.db.transact(body, name="bench.idle", write=False)
                times[name].append((time.perf_counter() - t0) * 1000)
        await store.db.aclose()
        return {f"{k}_ms_median": round(sorted(v)[len(v) // 2], 3) for k, v in times.items()}

    out.update(trio.run(timed))
    return out


def claim_ratio(database: str, items: int, replicas: int) -> dict[str, Any]:
    empty = kernel.bench_integrationd("mysql", replicas, items, "FULL")
    print(json.dumps({"bench": "bigtables.kernel_empty", **empty}), flush=True)
    big = kernel.bench_integrationd("mysql", replicas, items, "FULL",
                                    url=_target(database).describe())
    print(json.dumps({"bench": "bigtables.kernel_big", **big}), flush=True)
    return {"bench": "bigtables.kernel", "empty_items_per_s": empty["items_per_s"],
            "big_items_per_s": big["items_per_s"],
            "ratio": round(big["items_per_s"] / max(1e-9, empty["items_per_s"]), 3),
            "goal": 0.8, "duplicates": big["duplicates"], "lost": big["lost"]}


def console(database: str, requests: int) -> dict[str, Any]:
    from bench import admin_ui

    return trio.run(admin_ui.console_figures, _target(database).describe(), requests)


def prune_rate(database: str, seconds: float, facts_days: float = 400.0) -> dict[str, Any]:
    """The pruner on the big database for ``seconds`` (defaults: 30-day work horizon,
    500-row batches; ``facts_days``, also the commands horizon, shorter than the loaded
    year to prune admission facts and commands too): rows deleted per table and per
    second. Destructive: run last."""
    from config.settings import RetentionSettings
    from daemon.services.clock import WallClock
    from daemon.services.metrics import Metrics
    from daemon.services.retention import Pruner

    async def body() -> dict[str, Any]:
        store = await open_store(_target(database).describe(), pool_size=1,
                                 statement_timeout_s=600)
        metrics = Metrics()
        settings = RetentionSettings(lease_ttl=600.0, facts_days=facts_days,
                                     commands_days=facts_days)
        pruner = Pruner(store, settings, WallClock(), metrics, "bench-pruner")
        started = time.monotonic()
        with trio.move_on_after(seconds):
            await pruner.pass_once()
        elapsed = time.monotonic() - started
        await store.db.aclose()
        pruned = {s.labels["table"]: int(s.value)
                  for family in metrics.registry.collect() for s in family.samples
                  if s.name == "integrationd_retention_pruned_rows_total" and s.value}
        return {"bench": "bigtables.prune", "seconds": round(elapsed, 1), "pruned": pruned,
                "rows_per_s": round(sum(pruned.values()) / max(1e-9, elapsed))}

    return trio.run(body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ready", type=int, default=1_000_000)
    parser.add_argument("--terminal", type=int, default=20_000_000)
    parser.add_argument("--database", default=None, help="database name (default random)")
    parser.add_argument("--reuse", action="store_true", help="measure an existing --database")
    parser.add_argument("--keep", action="store_true", help="do not drop the database")
    parser.add_argument("--items", type=int, default=20_000, help="noop items for bench.kernel")
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--requests", type=int, default=10, help="timed GETs per console page")
    parser.add_argument("--skip", default="", help="comma-separated: history,kernel,idle,console")
    parser.add_argument("--prune-seconds", type=float, default=0.0,
                        help="then run the pruner this long (destructive; 0: not at all)")
    parser.add_argument("--prune-facts-days", type=float, default=400.0,
                        help="the pruner's facts (and commands) horizon")
    args = parser.parse_args()
    if args.reuse and not args.database:
        parser.error("--reuse needs --database")
    database = args.database or f"bench_big_{secrets.token_hex(4)}"
    skip = set(filter(None, args.skip.split(",")))
    summary: dict[str, Any] = {"bench": "bigtables", "database": database}
    try:
        if not args.reuse:
            loaded = load(database, args.ready, args.terminal)
            print(json.dumps(loaded), flush=True)
            summary["load"] = {k: loaded[k] for k in ("rows", "load_s", "total_s", "mb")}
        else:
            summary["migrate_s"] = migrate_existing(database)
        if "history" not in skip:
            rebuilt = rebuild_history(database)
            print(json.dumps(rebuilt), flush=True)
            summary["history_rebuild"] = rebuilt
        if "idle" not in skip:
            idle = idle_poll(database)
            print(json.dumps(idle), flush=True)
            summary["idle_poll_ms"] = {k: v for k, v in idle.items() if k.endswith("median")}
        if "kernel" not in skip:
            ratio = claim_ratio(database, args.items, args.replicas)
            print(json.dumps(ratio), flush=True)
            summary["kernel"] = ratio
        if "console" not in skip:
            figures = console(database, args.requests)
            print(json.dumps(figures), flush=True)
            summary["console_ok"] = figures["ok"]
            summary["console_slowest"] = figures["slowest"]
        if args.prune_seconds > 0:
            pruned = prune_rate(database, args.prune_seconds, args.prune_facts_days)
            print(json.dumps(pruned), flush=True)
            summary["prune"] = pruned
    finally:
        if not args.keep:
            mariadb_client(None, f"DROP DATABASE IF EXISTS {database}")
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
