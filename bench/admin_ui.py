"""Admin console benchmark: server time of every console page over 1,000,000 work items.

    python -m bench.admin_ui [--items 1000000] [--effects N] [--requests 20]
    python -m bench.admin_ui --database NAME [--requests 20] [--only REGEX]

With ``--database`` it measures every console page (the Find lists with each filter and
the search box, every History range, the quota, ingress, binding, sync and cutover
pages) on a database ``bench.seqload`` filled and kept (1M open and 20M terminal rows),
and prints one JSON line: median and p95 server time per page, the load average.
Otherwise:

What it does:

1. creates a fresh MariaDB database ``bench_ui_<random>`` on
   ``$INTEGRATIOND_BENCH_MYSQL_URL`` (default ``mysql://root@127.0.0.1:3306/test``)
   and migrates it (``storage.migrate.migrate``);
2. seeds it with multi-row INSERTs (:data:`ROWS_PER_INSERT` rows a statement, two
   connections at once), each row already in its final state: across 4 families,
   50 orgs and some lanes, 30 % dead (three failure classes), 40 % succeeded, 5 %
   retry, the rest pending, with one journaled execution per finished item over the
   last hour; plus ``effects`` Runtime commands (default: one per 20 items) with
   their effect attempt and confirmed receipt spread over the last hour, so the
   flow sample has something to read;
3. times the depth sampler's reads directly (``work_depths``, the outcome count and
   the flow sample over one 5 s interval): they run once per sample interval in
   every replica, whether or not anyone looks, and feed the overview;
4. starts a real replica (hypercorn on loopback, depth sampler every second, no
   work families so nothing is claimed), fills its history to a full hour (copies of
   its latest real sample: the overview charts what the history holds, so this is the
   worst case for rendering) and signs in as an admin;
5. times ``requests`` sequential GETs (after 3 warm-ups) per page: the overview,
   its charts fragment and JSON, the DLQ (with filters), work lists (each filter),
   an item's page, the audit log, ``/metrics``. Server time is the app's own
   ``Server-Timing`` header (request in -> response out, inside the process); wall
   time is the client's, over loopback;
6. prints one JSON line (median and p95 per target, the targets, pass/fail) and
   drops the database.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import statistics
import time
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import trio
import trio_mysql
from argon2 import PasswordHasher

from admin_ui.app import console_factory
from admin_ui.effects import effect_extensions
from admin_ui.extensions import combine
from admin_ui.history import history_extensions
from admin_ui.ingress import ingress_extensions
from admin_ui.subscriptions import subscriptions_extensions
from admin_ui.sync import sync_extensions
from config.catalog import load_catalog
from config.settings import (
    AdminSettings,
    Operator,
    ReplicaSettings,
    RetentionSettings,
    Settings,
    WorkSettings,
)
from daemon.services.clock import WallClock
from daemon.services.families import build_registry
from daemon.services.replica import HISTORY_POINTS, Replica
from storage.idgen import new_ulid
from storage.migrate import migrate
from storage.mysql.adapter import MysqlTarget
from storage.open import open_store
from storage.port import SqlTx
from storage.work_store import WorkStore

MYSQL_URL = os.environ.get("INTEGRATIOND_BENCH_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
FAMILIES = ("noop", "hubspot.push", "outreach.sync", "subscription.reconcile")
ORGS = 50
# Fate of item i by i % 20: 0-5 dead (3 classes), 6-13 succeeded, 14 retry, else pending.
DEAD_CLASSES = ("provider_rejected", "bad_payload", "auth_revoked")
TARGETS_MS = {"overview": 300.0, "overview_live": 300.0, "api_overview": 300.0,
              "dlq": 300.0, "metrics": 100.0}
ROWS_PER_INSERT = 1000
LOADERS = 2
HOUR_US = 3600 * 1_000_000
PASSWORD = secrets.token_urlsafe(12)


def _now_us() -> int:
    return time.time_ns() // 1000


async def _admin(sql: str) -> None:
    target = MysqlTarget.from_url(MYSQL_URL)
    conn = trio_mysql.connect(host=target.host, port=target.port, user=target.user,
                              password=target.password, database=target.database,
                              charset="utf8mb4", use_unicode=True, autocommit=True)
    await conn.connect()
    try:
        cur = conn.cursor()
        await cur.execute(sql)
    finally:
        await conn.aclose()


@asynccontextmanager
async def fresh_database() -> AsyncIterator[str]:
    name = f"bench_ui_{secrets.token_hex(4)}"
    await _admin(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    base = MysqlTarget.from_url(MYSQL_URL)
    try:
        yield f"mysql://{base.user}@{base.host}:{base.port}/{name}"
    finally:
        await _admin(f"DROP DATABASE IF EXISTS {name}")


def _fate(i: int) -> str:
    slot = i % 20
    if slot < 6:
        return f"dead-{DEAD_CLASSES[slot % 3]}"
    if slot < 14:
        return "succeeded"
    return "retry" if slot == 14 else "pending"


_WORK_COLUMNS = (
    "work_id, family, org_id, app_installation_id, subject_kind, subject_id, definition_ref,"
    " catalog_revision, catalog_digest, payload, payload_schema_version,"
    " engine_capability_version, queue_class, source_lane, source_seq, target_lane,"
    " target_lane_hold, state, run_after_us, attempt, max_attempts, lease_owner, lease_token,"
    " lease_until_us, ownership_epoch, cancel_requested, rollback_execution_fence_id,"
    " legacy_outcome_receipt_version, legacy_outcome_receipt_digest, terminal_outcome,"
    " failure_class, operator_summary, dedupe_key, replay_of, row_version, created_at_us,"
    " updated_at_us")
_EXEC_COLUMNS = "work_id, ownership_epoch, family, attempt, replica, outcome, finished_at_us"


def _work_row(i: int, work_id: str, created_us: int) -> tuple[Any, ...]:
    fate = _fate(i)
    state, outcome, failure, summary, attempt = "pending", None, None, None, 0
    if fate.startswith("dead-"):
        failure = fate.removeprefix("dead-")
        state, outcome, summary, attempt = "dead", "dead", f"{failure}: refused (bench)", 5
    elif fate == "succeeded":
        state, outcome, attempt = "succeeded", "succeeded", 1
    elif fate == "retry":
        state, failure, attempt = "retry", "timeout", 1
    lane = f"lane-{i % 997}" if i % 10 == 0 else None
    return (work_id, FAMILIES[i % len(FAMILIES)], f"org-{i % ORGS}", "", "lead",
            f"lead-{i}", "", 0, "", '{"bench": true}', 1, 1, "default", lane,
            i if lane else None, None, None, state, created_us, attempt, 5, None, None, None,
            1 if attempt else 0, 0, None, None, None, outcome, failure, summary, None, None,
            1, created_us, created_us)


_SAFE_TEXT = re.compile(r"[A-Za-z0-9 ()_.:/{}\"=,-]*")


def _literal(value: Any) -> str:
    """One SQL literal for the bench's own generated values (the driver's per-value
    escaping costs more than the server's insert at this volume)."""
    if value is None:
        return "NULL"
    if isinstance(value, int):
        return str(value)
    assert isinstance(value, str) and _SAFE_TEXT.fullmatch(value), value
    return f"'{value}'"


async def _insert(store: WorkStore, table: str, columns: str, rows: list[tuple[Any, ...]],
                  name: str) -> None:
    """One multi-row INSERT (in its own transaction)."""
    if not rows:
        return
    values = ", ".join("(" + ", ".join(map(_literal, row)) + ")" for row in rows)
    sql = f"INSERT INTO {table} ({columns}) VALUES {values}"

    async def body(tx: SqlTx) -> None:
        await tx.execute(sql)

    await store.db.transact(body, name=name)


async def _load_items(store: WorkStore, start: int, stop: int, now: int) -> None:
    """Items ``start..stop-1`` (created over the last hour, in id order) and their
    executions, :data:`ROWS_PER_INSERT` rows a statement."""
    for first in range(start, stop, ROWS_PER_INSERT):
        work, executions = [], []
        for i in range(first, min(stop, first + ROWS_PER_INSERT)):
            created = now - HOUR_US + i * HOUR_US // max(1, _TOTAL[0])
            row = _work_row(i, new_ulid(created), created)
            work.append(row)
            if row[29] is not None:  # terminal_outcome: one journaled execution
                executions.append((row[0], 1, row[1], 1, "bench", row[29],
                                   min(now - 1, created + 2_000_000)))
        await _insert(store, "work_items", _WORK_COLUMNS, work, "bench.items")
        await _insert(store, "work_executions", _EXEC_COLUMNS, executions,
                      "bench.executions")


_TOTAL = [1]


async def _load_effects(store: WorkStore, count: int, now: int) -> None:
    """``count`` accepted commands, each with one ACCEPTED attempt and a confirmed receipt
    (accepted -> answered after 40-90 ms -> confirmed 60-200 ms later), over the hour."""
    for first in range(0, count, ROWS_PER_INSERT):
        commands, attempts, receipts = [], [], []
        for k in range(first, min(count, first + ROWS_PER_INSERT)):
            accepted = now - HOUR_US + k * HOUR_US // max(1, count)
            answered = accepted + 40_000 + (k * 7919) % 50_000
            confirmed = answered + 60_000 + (k * 104_729) % 140_000
            command_id = new_ulid(accepted)
            commands.append((command_id, f"key-{k}", "org-1", "install-1", "cap", "sha256:b",
                             "crm", f"intent-{k}", "update", "hubspot.contact.update", "lead",
                             f"lead-{k}", "hubspot-main", 1, 1, "{}", "sha256:p",
                             f"outbox-{k}", "succeeded", None, accepted, answered))
            attempts.append((new_ulid(answered), command_id, new_ulid(accepted), 1, "t",
                             "PATCH", "/crm/v3/objects/contacts/1", "{}", "h", f"idem-{k}",
                             "{}", accepted + 1000, 200, "{}", "ACCEPTED", None, answered,
                             None, None, None, None, 1))
            receipts.append((command_id, f"intent-{k}", 1, "1", "{}", "sha256:r", "confirmed",
                             None, answered, confirmed))
        await _insert(store, "external_commands", (
            "command_id, handoff_key, org_id, app_installation_id, runtime_capability_id,"
            " runtime_work_binding_digest, runtime_name, intent_id, intent_kind, operation,"
            " local_object, local_id, binding_id, binding_generation, catalog_revision,"
            " frozen_request, payload_digest, runtime_outbox_id, settlement, repair_of,"
            " created_at_us, updated_at_us"), commands,
            "bench.commands")
        await _insert(store, "effect_attempts", (
            "attempt_id, command_id, work_id, ownership_epoch, lease_token, method,"
            " target_path, safe_headers, body_sha256, idempotency_key, pre_dispatch_evidence,"
            " dispatch_started_at_us, response_status, provider_evidence, outcome,"
            " failure_class, finished_at_us, disposition, disposition_note, disposition_by,"
            " disposition_at_us, row_version"), attempts,
            "bench.attempts")
        await _insert(store, "result_receipts", (
            "command_id, intent_id, result_format_version, remote_id, canonical_result,"
            " result_digest, state, last_error, created_at_us, confirmed_at_us"),
            receipts, "bench.receipts")


async def load(store: WorkStore, items: int, effects: int) -> dict[str, int]:
    """Seed ``items`` work items in their final states, and ``effects`` commands."""
    await migrate(store.db, store.dialect, _now_us())
    now = _now_us()
    _TOTAL[0] = items
    share = -(-items // LOADERS)
    async with trio.open_nursery() as nursery:
        for k in range(LOADERS):
            nursery.start_soon(_load_items, store, k * share, min(items, (k + 1) * share), now)
        nursery.start_soon(_load_effects, store, effects, now)
    counts: dict[str, int] = {}
    for i in range(20):  # the fates repeat every 20 items
        n = len(range(i, items, 20))
        counts[_fate(i).replace("dead-", "dead/")] = (
            counts.get(_fate(i).replace("dead-", "dead/"), 0) + n)
    counts["effects"] = effects
    return counts


HISTORY_OUTCOMES = ("succeeded", "dead", "retry", "cancelled")
# The effect path's keys in the dense history: 4 orgs x 2 bindings x 3 operations, each
# minute an accepted row and 3 latency bucket pairs of receipts (history_flow), and 4
# quota keys granted and given back (history_quota).
FLOW_ORGS = ("org-1", "org-2", "org-3", "org-4")
FLOW_BINDINGS = ("hubspot-main", "hubspot-eu")
FLOW_OPERATIONS = ("hubspot.contact.update_jobtitle", "hubspot.deal.create",
                   "hubspot.note.create")
FLOW_LATENCIES = ((80, 90), (84, 92), (88, 100))  # log buckets: ~1 s to ~6 s
QUOTA_KEYS = ("hubspot:portal-1", "hubspot:portal-2", "hubspot:portal-3",
              "hubspot:portal-4")


async def year_dense_history(store: WorkStore, days: int, per_day: int, now: int) -> int:
    """The history rollup of the last ``days`` days as dense as ``per_day`` executions a
    day would make it (20M terminal rows over a year: ~55,000 a day, every minute holding
    every family x outcome), written in bulk on MariaDB (``INSERT ... SELECT`` from the
    ``seq_0_to_N`` sequence engine), minute rows first, then the coarser levels' rows summed
    from them. A range query reads only its own buckets, so the presets (up to 7 days) read
    what they would read at full scale. Returns the rows written."""
    minutes = days * 1440
    per_key = max(1, per_day // (1440 * len(FAMILIES) * len(HISTORY_OUTCOMES)))
    first = now - now % 60_000_000 - (minutes - 1) * 60_000_000
    families = " UNION ALL ".join(f"SELECT '{f}' AS family" for f in FAMILIES)
    outcomes = " UNION ALL ".join(f"SELECT '{o}' AS outcome" for o in HISTORY_OUTCOMES)

    async def body(tx: SqlTx) -> int:
        await tx.execute("DELETE FROM history_rollup")
        await tx.execute(
            "INSERT INTO history_rollup (level_us, bucket_us, family, outcome, shard,"
            f" executions) SELECT 60000000, {first} + m.seq * 60000000, f.family, o.outcome,"
            f" 0, {per_key} FROM seq_0_to_{minutes - 1} m CROSS JOIN ({families}) f"
            f" CROSS JOIN ({outcomes}) o")
        for level in (300_000_000, 3_600_000_000, 21_600_000_000, 86_400_000_000):
            await tx.execute(
                "INSERT INTO history_rollup (level_us, bucket_us, family, outcome, shard,"
                f" executions) SELECT {level}, bucket_us - bucket_us % {level}, family,"
                " outcome, 0, SUM(executions) FROM history_rollup WHERE level_us = 60000000"
                f" GROUP BY bucket_us - bucket_us % {level}, family, outcome")
        ((n,),) = await tx.fetchall("SELECT COUNT(*) FROM history_rollup")
        return int(n) + await _dense_flow(tx, minutes, first, per_day)

    return await store.db.transact(body, name="bench.history", write=True)


def _union(column: str, values: tuple[str, ...]) -> str:
    return " UNION ALL ".join(f"SELECT '{v}' AS {column}" for v in values)


async def _dense_flow(tx: SqlTx, minutes: int, first: int, per_day: int) -> int:
    """``history_flow`` and ``history_quota`` as dense as :func:`year_dense_history`
    makes ``history_rollup``: every key every minute, then the hour and day rows."""
    keys = len(FLOW_ORGS) * len(FLOW_BINDINGS) * len(FLOW_OPERATIONS)
    per_key = max(1, per_day // (1440 * keys))
    latencies = " UNION ALL ".join(f"SELECT {a} AS answer_le, {r} AS receipt_le"
                                   for a, r in FLOW_LATENCIES)
    await tx.execute("DELETE FROM history_flow")
    await tx.execute("DELETE FROM history_quota")
    minute_keys = (f" FROM seq_0_to_1439 m CROSS JOIN ({_union('org_id', FLOW_ORGS)})"
                   f" o CROSS JOIN ({_union('binding_id', FLOW_BINDINGS)}) b"
                   f" CROSS JOIN ({_union('operation', FLOW_OPERATIONS)}) p")
    columns = ("level_us, bucket_us, metric, org_id, binding_id, operation, answer_le,"
               " receipt_le, shard, n")
    # A day per statement: each stays well within the statement timeout.
    for day in range(0, minutes, 1440):
        start = first + day * 60_000_000
        await tx.execute(
            f"INSERT INTO history_flow ({columns}) SELECT 60000000,"
            f" {start} + m.seq * 60000000, 'accepted', o.org_id, b.binding_id, p.operation,"
            f" 0, 0, 0, {per_key}{minute_keys}")
        await tx.execute(
            f"INSERT INTO history_flow ({columns}) SELECT 60000000,"
            f" {start} + m.seq * 60000000, 'receipted', o.org_id, b.binding_id,"
            f" p.operation, l.answer_le, l.receipt_le, 0,"
            f" {max(1, per_key // len(FLOW_LATENCIES))}{minute_keys}"
            f" CROSS JOIN ({latencies}) l")
    await tx.execute(
        "INSERT INTO history_quota (level_us, bucket_us, quota_key, metric, shard, n)"
        f" SELECT 60000000, {first} + m.seq * 60000000, k.quota_key, t.metric, 0,"
        f" {per_key} FROM seq_0_to_{minutes - 1} m"
        f" CROSS JOIN ({_union('quota_key', QUOTA_KEYS)}) k"
        f" CROSS JOIN ({_union('metric', ('granted', 'released'))}) t")
    for level in (3_600_000_000, 86_400_000_000):
        await tx.execute(
            f"INSERT INTO history_flow ({columns}) SELECT {level}, bucket_us - bucket_us"
            f" % {level}, metric, org_id, binding_id, operation, answer_le, receipt_le, 0,"
            " SUM(n) FROM history_flow WHERE level_us = 60000000 GROUP BY bucket_us -"
            f" bucket_us % {level}, metric, org_id, binding_id, operation, answer_le,"
            " receipt_le")
        await tx.execute(
            "INSERT INTO history_quota (level_us, bucket_us, quota_key, metric, shard, n)"
            f" SELECT {level}, bucket_us - bucket_us % {level}, quota_key, metric, 0, SUM(n)"
            " FROM history_quota WHERE level_us = 60000000"
            f" GROUP BY bucket_us - bucket_us % {level}, quota_key, metric")
    ((flow,),) = await tx.fetchall("SELECT COUNT(*) FROM history_flow")
    ((quota,),) = await tx.fetchall("SELECT COUNT(*) FROM history_quota")
    return int(flow) + int(quota)


async def sampler_times(store: WorkStore, requests: int) -> dict[str, Any]:
    """The depth sampler's reads, timed directly (ms): what every replica pays per
    ``work.depth_sample_interval`` to keep the overview current."""
    out: dict[str, list[float]] = {"work_depths": [], "outcome_counts": [], "flow_sample": []}

    async def timed(name: str, call: Awaitable[object], keep: bool) -> None:
        started = time.perf_counter()
        await call
        if keep:
            out[name].append((time.perf_counter() - started) * 1000)

    for i in range(requests + 1):
        now = _now_us() - (i * 7 % 3000) * 1_000_000  # different 5 s windows in the hour
        await timed("work_depths", store.work_depths(), i > 0)
        await timed("outcome_counts", store.work_outcome_counts(now - 5_000_000, now), i > 0)
        await timed("flow_sample", store.flow_sample(now - 5_000_000, now), i > 0)
    return {name: _summary(values) for name, values in out.items()}


def fill_history(replica: Replica) -> None:
    """A full hour of history (every point a copy of the latest real sample, 5 s apart),
    as a replica that has run for an hour holds: the overview's rendering cost grows
    with the points it charts, so the figures are for the worst case."""
    latest = replica.history[-1]
    points = replica.history.maxlen or HISTORY_POINTS
    copies = [attrs.evolve(latest, at_us=latest.at_us - (points - k) * 5_000_000,
                           interval_s=5.0) for k in range(points - 1)]
    replica.history.clear()
    replica.history.extend([*copies, latest])


async def _sign_in(client: httpx.AsyncClient) -> None:
    page = await client.get("/admin/sign-in")
    found = re.search(r'<meta name="csrf-token" content="([^"]*)">', page.text)
    assert found is not None
    response = await client.post("/admin/sign-in", data={
        "name": "bench", "password": PASSWORD, "csrf_token": found.group(1)})
    assert response.status_code == 302, response.text


def _server_ms(response: httpx.Response) -> float:
    found = re.search(r"dur=([0-9.]+)", response.headers.get("server-timing", ""))
    assert found is not None
    return float(found.group(1))


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, max(0, round(0.95 * len(ordered)) - 1))]
    return {"median": round(statistics.median(ordered), 2), "p95": round(p95, 2)}


def answered(response: httpx.Response, *, redirect_ok: bool) -> bool:
    """Whether ``response`` is the page's answer: a 200, or (``redirect_ok``: the search
    box, whose single hit sends the browser straight to that hit's page) a 302/303 to a
    console page other than the sign-in form."""
    if response.status_code == 200:
        return True
    location = response.headers.get("location", "")
    return (redirect_ok and response.status_code in (302, 303)
            and location.startswith("/admin/") and not location.startswith("/admin/sign-in"))


async def measure(client: httpx.AsyncClient, path: str, requests: int, *,
                  redirect_ok: bool = False) -> dict[str, Any]:
    """Server and wall time of ``requests`` GETs after 3 warm-ups; an answer that is not
    the page's (:func:`answered`) is counted in ``errors`` (with its status) instead of
    ending the run. A redirect is timed as it is (the search, not the page it names)."""
    server, wall = [], []
    errors: dict[str, int] = {}
    redirected: set[str] = set()
    for i in range(requests + 3):
        started = time.perf_counter()
        response = await client.get(path)
        elapsed = (time.perf_counter() - started) * 1000
        if not answered(response, redirect_ok=redirect_ok):
            errors[str(response.status_code)] = errors.get(str(response.status_code), 0) + 1
            continue
        if response.status_code != 200:
            redirected.add(response.headers["location"])
        if i >= 3:
            server.append(_server_ms(response))
            wall.append(elapsed)
    doc: dict[str, Any] = {"path": path, "errors": errors}
    if redirected:
        doc["redirects_to"] = sorted(redirected)
    if server:
        doc.update(server_ms=_summary(server), wall_ms=_summary(wall))
    return doc


PATHS: dict[str, str | None] = {
    "overview": "/admin/",
    "overview_live": "/admin/overview/live",
    "dlq": "/admin/dlq",
    "work_filtered": "/admin/work?family=hubspot.push&state=dead",
    "metrics": "/metrics",
    "api_overview": "/admin/api/overview",
    "dlq_by_class": "/admin/dlq?family=noop&failure_class=auth_revoked&unreplayed=1",
    "work_by_org_state": "/admin/api/work?org=org-7&state=pending",
    "work_by_org": "/admin/api/work?org=org-7",
    "work_by_subject": "/admin/api/work?subject=lead-4242",
    "work_by_lane": "/admin/api/work?lane=lane-5",
    "work_list": "/admin/work",
    "audit": "/admin/audit",
    "work_detail": None,
}


def history_paths(now_s: int, keys: tuple[str, str, str] = ("org-2", "hubspot-eu",
                                                              "hubspot.deal.create")
                  ) -> dict[str, str | None]:
    """The History page at every preset, per family, a custom month, and the items behind
    a point (issue 23 item 1): read from the history rollup, whatever the range; and
    narrowed by ``keys`` (an org, a binding and an operation the database holds: the dense
    history's by default, bench.seqload's with ``--database``)."""
    org, binding, operation = keys
    paths: dict[str, str | None] = {f"history_{r}": f"/admin/history?range={r}"
                                    for r in ("15m", "1h", "6h", "24h", "7d")}
    paths.update({
        "history_7d_family": "/admin/history?range=7d&family=noop",
        "api_history_7d": "/admin/api/history?range=7d",
        "history_custom_30d": f"/admin/history?from={now_s - 30 * 86_400}&to={now_s}",
        "history_custom_92d_family":
            f"/admin/history?from={now_s - 92 * 86_400}&to={now_s}&family=crm.push",
        "history_items_dead": (f"/admin/history/items?from={now_s - 7200}&to={now_s - 3600}"
                               "&family=noop&outcome=dead"),
        "api_history_items": f"/admin/api/history/items?from={now_s - 86_400}&to={now_s}",
        # The effect path's and quota's filters (history_flow, history_quota).
        "history_6h_org_binding": "/admin/history?range=6h&org=org-2&binding=hubspot-eu",
        "history_7d_operation": "/admin/history?range=7d&operation=hubspot.deal.create",
        "history_24h_key": "/admin/history?range=24h&key=hubspot:portal-3",
        "history_commands_receipted": (f"/admin/history/commands?metric=receipted"
                                       f"&from={now_s - 3600}&to={now_s - 3540}"),
        "api_history_commands_accepted": (f"/admin/api/history/commands?metric=accepted"
                                          f"&from={now_s - 86_400}&to={now_s}"
                                          "&binding=hubspot-main"),
        "history_slots": (f"/admin/history/slots?key=hubspot:portal-1"
                          f"&from={now_s - 3600}&to={now_s}"),
        # Narrowed by the effect items' org, binding and operation (history_rollup's keys,
        # migrations 0048 and 0049) and the items behind a narrowed 2 h point of a 7 d chart.
        "history_6h_org": f"/admin/history?range=6h&org={org}",
        "history_6h_binding": f"/admin/history?range=6h&binding={binding}",
        "history_custom_30d_binding":
            f"/admin/history?from={now_s - 30 * 86_400}&to={now_s}&binding={binding}",
        "history_7d_operation_only": f"/admin/history?range=7d&operation={operation}",
        "history_24h_org_binding_operation":
            f"/admin/history?range=24h&org={org}&binding={binding}&operation={operation}",
        "history_items_2h_binding": (f"/admin/history/items?from={now_s - 3 * 3600}"
                                     f"&to={now_s - 3600}&outcome=dead&binding={binding}"),
        "api_history_items_2h_binding": (f"/admin/api/history/items?from={now_s - 3 * 3600}"
                                         f"&to={now_s - 3600}&binding={binding}"),
    })
    return paths


# bench.seqload's keys (``--database``): org-2 and binding-3 hold effect items.
SEQLOAD_KEYS = ("org-2", "binding-3", "hubspot.deal.create")


# Every other console page and /admin/api/ listing (bench.bigtables measures them all).
MORE_PATHS: dict[str, str | None] = {
    "api_work": "/admin/api/work",
    "api_work_state": "/admin/api/work?state=succeeded",
    "api_work_family": "/admin/api/work?family=noop",
    "api_work_family_state": "/admin/api/work?family=crm.push&state=dead",
    "api_dlq": "/admin/api/dlq",
    "api_dlq_class": "/admin/api/dlq?failure_class=bad_payload",
    "api_audit": "/admin/api/audit",
    "api_replicas": "/admin/api/replicas",
    "work_state_page": "/admin/work?state=cancelled",
    "effects": "/admin/effects",
    "api_effects_unknown": "/admin/api/effects/unknown",
    "operators": "/admin/operators",
    "api_work_detail": None,
    "effect_command": None,
}

# Every other page (issue 23): Find lists with each filter, the search box, the quota,
# ingress, bindings, subscriptions, sync and cutover pages, an attempt's page. Filter
# values name rows bench.seqload writes ("binding-3", "hubspot.deal.create", ...).
FIND_PATHS: dict[str, str | None] = {
    "find_attempts": "/admin/find/attempts",
    "find_attempts_outcome": "/admin/find/attempts?outcome=REJECTED",
    "find_attempts_none": "/admin/find/attempts?outcome=none",
    "find_attempts_status": "/admin/find/attempts?status=503",
    "find_attempts_operation": "/admin/find/attempts?operation=hubspot.deal.create",
    "find_attempts_binding": "/admin/find/attempts?binding=binding-3",
    "find_attempts_binding_outcome": "/admin/find/attempts?binding=binding-3&outcome=REJECTED",
    "find_attempts_operation_rare": "/admin/find/attempts?operation=no.such.operation",
    "find_attempts_week": "/admin/find/attempts?since=7d&outcome=REJECTED",
    "find_attempts_oldest": "/admin/find/attempts?sort=oldest&status=422",
    "api_find_attempts_binding": "/admin/api/find/attempts?binding=binding-5&limit=200",
    "find_commands": "/admin/find/commands",
    "find_commands_settlement": "/admin/find/commands?settlement=retired",
    "find_commands_open": "/admin/find/commands?settlement=open",
    "find_commands_operation": "/admin/find/commands?operation=outreach.prospect.update",
    "find_commands_binding": "/admin/find/commands?binding=binding-2&generation=1",
    "find_commands_revision": "/admin/find/commands?revision=7&settlement=no_effect",
    "find_commands_local": "/admin/find/commands?object=lead&local_id=lead-000123459",
    "find_receipts": "/admin/find/receipts",
    "find_receipts_pending": "/admin/find/receipts?status=pending",
    "find_receipts_refused": "/admin/find/receipts?status=refused",
    "find_receipts_confirmed": "/admin/find/receipts?status=confirmed&sort=oldest",
    "find_ingress": "/admin/find/ingress",
    "find_ingress_state": "/admin/find/ingress?state=quarantined",
    "find_ingress_route_binding":
        "/admin/find/ingress?route=hubspot.deals&binding=binding-1",
    "find_audit": "/admin/find/audit",
    "find_audit_actor": "/admin/find/audit?actor=operator-3",
    "find_audit_action_time": "/admin/find/audit?action=dlq.replay&since=30d",
    "find_audit_target": "/admin/find/audit?target=lead-000000700",
    "search_text": "/admin/find?q=lead-000012345",
    "search_binding": "/admin/find?q=binding-4",
    "search_remote": "/admin/api/search?q=hs-1000039",
    "search_ulid": None,
    "work_since": "/admin/work?since=1h",
    "work_range": "/admin/work?since=30d&until=29d&state=dead",
    "quota": "/admin/quota",
    "api_quota": "/admin/api/quota",
    "bindings": "/admin/bindings",
    "ingress": "/admin/ingress",
    "subscriptions": "/admin/subscriptions",
    "sync": "/admin/sync",
    "cutover": "/admin/cutover",
    "effect_attempt": None,
}


async def some_item(client: httpx.AsyncClient) -> str | None:
    """An item for the item pages: a dead one (the page with the most on it: failure,
    attempts, replay), else the newest of any state, else none (no item page timed)."""
    for query in ("state=dead&limit=1", "limit=1"):
        items = (await client.get(f"/admin/api/work?{query}")).json()["items"]
        if items:
            return str(items[0]["work_id"])
    return None


async def console_figures(url: str, requests: int, *, extra: bool = True,
                          retention: bool = False, only: str | None = None,
                          keys: tuple[str, str, str] | None = None
                          ) -> dict[str, Any]:
    """Start a console replica on ``url`` (an already loaded database) and time every page
    (server time, p95 against :data:`TARGETS_MS`, 300 ms for the rest)."""
    store = await open_store(url, pool_size=4)
    try:
        sampler = await sampler_times(store, requests)
        hashed = PasswordHasher().hash(PASSWORD)
        settings = Settings(
            replica=ReplicaSettings(heartbeat_interval=1.0),
            admin=AdminSettings(listen="127.0.0.1:0"),
            work=WorkSettings(depth_sample_interval=1.0),
            operators=(Operator(name="bench", role="admin", password_hash=hashed),),
            retention=RetentionSettings(enabled=retention),
        )
        catalog = load_catalog(settings)
        factory = (console_factory(combine(
            effect_extensions(catalog), sync_extensions(catalog), ingress_extensions(),
            subscriptions_extensions(catalog), history_extensions())) if extra
                   else console_factory(history_extensions()))
        replica = Replica(settings, store, build_registry(settings, {}), WallClock(),
                          replica_id="bench-ui", admin_app=factory)
        async with trio.open_nursery() as nursery:
            address = await nursery.start(replica.run)
            base = address if address.startswith("http") else f"http://{address}"
            with trio.fail_after(300):  # two depth samples: the overview has data
                while True:
                    if len(replica.history) >= 2:
                        break
                    await trio.sleep(0.2)
            fill_history(replica)
            async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                await _sign_in(client)
                paths = dict(PATHS, **(MORE_PATHS if extra else {}),
                             **(FIND_PATHS if extra else {}),
                             **(history_paths(_now_us() // 1_000_000) if keys is None
                                else history_paths(_now_us() // 1_000_000, keys)))
                item_id = await some_item(client)
                if item_id is not None:
                    paths["work_detail"] = f"/admin/work/{item_id}"
                    if extra:
                        paths["api_work_detail"] = f"/admin/api/work/{item_id}"
                if extra:
                    command = (await client.get("/admin/api/find/commands?limit=1")).json()
                    if command["items"]:
                        command_id = command["items"][0]["command_id"]
                        paths["effect_command"] = f"/admin/effects/commands/{command_id}"
                    attempt = (await client.get(
                        "/admin/api/find/attempts?outcome=REJECTED&limit=1")).json()
                    if attempt["items"]:
                        attempt_id = attempt["items"][0]["attempt_id"]
                        paths["effect_attempt"] = f"/admin/effects/attempts/{attempt_id}"
                        paths["search_ulid"] = f"/admin/find?q={attempt_id}"
                if only is not None:
                    paths = {n: p for n, p in paths.items() if re.search(only, n)}
                results = {name: await measure(client, path, requests,
                                               redirect_ok=name.startswith("search"))
                           for name, path in paths.items() if path}
            replica.request_drain()
    finally:
        await store.db.aclose()
    limits = {name: TARGETS_MS.get(name, 300.0) for name in results}
    ok = all(not results[n]["errors"] and results[n]["server_ms"]["p95"] < limit
             for n, limit in limits.items())
    slowest = max(((n, r["server_ms"]["p95"]) for n, r in results.items() if "server_ms" in r),
                  key=lambda x: x[1], default=("", 0.0))
    return {"bench": "admin_ui.console", "sampler_ms": sampler, "results": results,
            "requests_per_target": requests, "ok": ok,
            "slowest": {"page": slowest[0], "server_ms_p95": slowest[1]}}


async def run(items: int, effects: int, requests: int, history_days: int = 0,
              history_per_day: int = 55_000) -> dict[str, Any]:
    async with fresh_database() as url:
        store = await open_store(url, pool_size=4)
        try:
            t0 = time.perf_counter()
            fates = await load(store, items, effects)
            load_s = time.perf_counter() - t0
            # The seed writes journal rows directly: the history rollup is rebuilt from them
            # (what `integrationd history rebuild` does).
            t0 = time.perf_counter()
            await store.history_rebuild(_now_us() - 2 * 86_400_000_000)
            await store.history_flow_rebuild(_now_us() - 2 * 86_400_000_000)
            await store.history_quota_rebuild(_now_us() - 2 * 86_400_000_000)
            rebuild_s = time.perf_counter() - t0
            history: dict[str, Any] = {}
            if history_days:
                t0 = time.perf_counter()
                rows = await year_dense_history(store, history_days, history_per_day,
                                                _now_us())
                history = {"days": history_days, "per_day": history_per_day,
                           "rollup_rows": rows, "fill_s": round(time.perf_counter() - t0, 1)}
        finally:
            await store.db.aclose()
        figures = await console_figures(url, requests, extra=False)
    results = figures["results"]
    ok = all(not results[name]["errors"] and results[name]["server_ms"]["p95"] < limit
             for name, limit in TARGETS_MS.items())
    return {
        "bench": "admin_ui",
        "backend": "mysql",
        "items": items,
        "fates": fates,
        "load_s": round(load_s, 1),
        "history_rebuild_s": round(rebuild_s, 1),
        "history_dense": history,
        "requests_per_target": requests,
        "sampler_ms": figures["sampler_ms"],
        "results": results,
        "targets_ms_p95": TARGETS_MS,
        "ok": ok,
        "history_ok": all(not r["errors"] and r["server_ms"]["p95"] < 300.0
                          for name, r in results.items()
                          if "history" in name and "server_ms" in r),
        "history_p95_ms": {name: r["server_ms"]["p95"] for name, r in results.items()
                           if "history" in name and "server_ms" in r},
    }


async def run_existing(database: str, requests: int, only: str | None) -> dict[str, Any]:
    """Every console page on an already loaded database (``bench.seqload``), kept as is:
    server time median and p95 per page, and the machine's load average around the run."""
    base = MysqlTarget.from_url(MYSQL_URL)
    url = f"mysql://{base.user}@{base.host}:{base.port}/{database}"
    load_before = os.getloadavg()
    started = time.perf_counter()
    figures = await console_figures(url, requests, extra=True, only=only, keys=SEQLOAD_KEYS)
    results = figures["results"]
    return {
        "bench": "admin_ui.big", "database": database,
        "requests_per_target": requests, "seconds": round(time.perf_counter() - started),
        "load_1m_before_after": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
        "server_ms": {name: [r["server_ms"]["median"], r["server_ms"]["p95"]]
                      for name, r in results.items() if "server_ms" in r},
        "errors": {name: r["errors"] for name, r in results.items() if r["errors"]},
        "over_300ms_p95": sorted(name for name, r in results.items()
                                 if "server_ms" in r and r["server_ms"]["p95"] >= 300.0),
        "sampler_ms": figures["sampler_ms"], "ok": figures["ok"],
        "slowest": figures["slowest"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--items", type=int, default=1_000_000, help="work items to load")
    parser.add_argument("--effects", type=int, default=None,
                        help="Runtime commands with attempts and receipts (default items/20)")
    parser.add_argument("--requests", type=int, default=20, help="timed requests per target")
    parser.add_argument("--history-days", type=int, default=0,
                        help="replace the history rollup with this many days as dense as"
                             " --history-per-day executions a day make it (bulk, MariaDB)")
    parser.add_argument("--history-per-day", type=int, default=55_000,
                        help="executions a day (20M terminal rows a year: 55,000)")
    parser.add_argument("--database", default=None,
                        help="measure every page on this already loaded database (bench.seqload"
                             " --keep) instead of loading a fresh one; it is kept")
    parser.add_argument("--only", default=None,
                        help="with --database: only the targets whose name matches this regex")
    args = parser.parse_args()
    if args.database:
        print(json.dumps(trio.run(run_existing, args.database, args.requests, args.only)),
              flush=True)
        return
    effects = args.effects if args.effects is not None else args.items // 20
    result = trio.run(run, args.items, effects, args.requests, args.history_days,
                      args.history_per_day)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
