"""A year of production rows, generated inside MariaDB (issue 23: the console at size).

    python -m bench.seqload --open 1000000 --terminal 20000000 --database bench_big23 [--keep]

Every row is made by the server itself: ``INSERT ... SELECT`` from MariaDB's sequence
engine (``seq_0_to_N``), :data:`BATCH` rows a statement, each statement its own
transaction, in time order (ids are ULIDs of their row's time, so every index grows at a
few append points and the 128 MB buffer pool is not thrashed). No Python row loop, no
files: ``bench.bigtables`` wrote tab-separated files from Python and spent most of its
time there (15M items in 31 min under load).

Rows, in the shapes production writes (``--terminal T``, ``--open O``):

- ``T`` terminal work items over the last 365 days (noop 40 %, crm.push 20 %, crm.sync
  20 %, runtime_receipt 15 % with a dedupe key, external_effect 5 %; succeeded 80 %,
  dead 10 % in three failure classes, cancelled 5 %, skipped 5 %), one journaled
  execution each;
- for every external_effect item its command (settled), its effect attempt (ACCEPTED
  200, or REJECTED 422 with a redacted exchange excerpt for the dead ones; one in ten
  successes has an earlier REPLAY_SAFE_RETRY 503 attempt), and a Runtime receipt
  (confirmed; 1 % pending, 1 % refused);
- ``O`` open items over the last 6 hours (crm.push, crm.sync, subscription.reconcile,
  external_effect): pending and due, retrying, held on quota (``quota_wait`` naming one
  of 8 quota keys), in source lanes, and a few processing under a lease;
- ingress receipts (``T / 40`` over the last 30 days: materialized, 2 % quarantined,
  1 % received), audit entries (``T / 100`` over the year), 8 bindings and 8 quota keys;
- the history rollup (minute, five-minute, hour, six-hour and day rows, an effect item
  under its command's org, binding and operation) summed from the journal rows, as
  ``integrationd history rebuild`` writes it.

Prints one JSON line: rows per table, seconds per step, megabytes per table. The
database is kept (``--keep``) to be measured again and again (``bench.admin_ui
--database NAME``); drop it with ``--drop``. ``--rollup-only`` rebuilds only the rollup
of a database loaded (and migrated) before, and keeps it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.bigtables import mariadb_client, migrated_without_indexes

BATCH = 500_000
YEAR_US = 365 * 86_400 * 1_000_000
HOUR_US = 3_600_000_000
QUOTA_KEYS = 8
BINDINGS = 8


# ------------------------------------------------------------------ SQL expressions

# CONV(..., 10, 32) spells base 32 with 0-9A-V; Crockford's ULID alphabet skips I, L, O
# and U. Replacing from the top letter down moves each letter to its Crockford place
# without touching a letter already moved.
_TO_CROCKFORD = (("V", "Z"), ("U", "Y"), ("T", "X"), ("S", "W"), ("R", "V"), ("Q", "T"),
                 ("P", "S"), ("O", "R"), ("N", "Q"), ("M", "P"), ("L", "N"), ("K", "M"),
                 ("J", "K"), ("I", "J"))


def ulid(at_us: str, n: str, salt: int) -> str:
    """A ULID of the millisecond of ``at_us`` whose random part is a bijection of ``n``
    (distinct ``n``, distinct ids) and ``salt`` (one per kind of row)."""
    raw = (f"CONCAT(LPAD(CONV(({at_us}) DIV 1000, 10, 32), 10, '0'),"
           f" LPAD(CONV((({n}) * 2654435761 + {salt}) % 1099511627776, 10, 32), 8, '0'),"
           f" LPAD(CONV((({n}) * 40503 + {salt * 7919}) % 1099511627776, 10, 32), 8, '0'))")
    for old, new in _TO_CROCKFORD:
        raw = f"REPLACE({raw}, '{old}', '{new}')"
    return raw


def pick(n: str, *values: str) -> str:
    """``values[n % len(values)]`` as SQL (``values`` are SQL literals)."""
    return f"ELT(1 + ({n}) % {len(values)}, {', '.join(values)})"


# ------------------------------------------------------------------ tables

_CLASSES = ("'provider_rejected'", "'bad_payload'", "'auth_revoked'")
OPERATIONS = ("hubspot.contact.update", "hubspot.deal.create", "outreach.prospect.update")
_OPERATIONS = tuple(f"'{o}'" for o in OPERATIONS)
_OPEN_FAMILIES = ("'crm.push'", "'crm.sync'", "'subscription.reconcile'", "'external_effect'")
ROUTES = ("hubspot.contacts", "hubspot.deals", "outreach.prospects")
_ROUTES = tuple(f"'{r}'" for r in ROUTES)
ACTIONS = ("work.replay", "work.cancel", "dlq.replay", "binding.revoke", "command.retire")
_ACTIONS = tuple(f"'{a}'" for a in ACTIONS)


class Plan:
    """The statements that generate every table for one load (``now`` fixed once)."""

    def __init__(self, open_items: int, terminal: int, now_us: int) -> None:
        self.open, self.terminal, self.now = open_items, terminal, now_us
        self.step = (YEAR_US - 2 * HOUR_US) // max(1, terminal)

    # Terminal item i (0 <= i < terminal) -------------------------------------------
    def created(self, i: str) -> str:
        return f"({self.now - YEAR_US} + ({i}) * {self.step})"

    def finished(self, i: str) -> str:
        return f"({self.created(i)} + 2000000 + (({i}) % 5) * 1000000)"

    def work_id(self, i: str) -> str:
        return ulid(self.created(i), i, 1)

    def command_id(self, i: str) -> str:
        return ulid(self.created(i), i, 2)

    @staticmethod
    def family(i: str) -> str:
        return pick(i, *["'noop'"] * 8, *["'crm.push'"] * 4, *["'crm.sync'"] * 4,
                    *["'runtime_receipt'"] * 3, "'external_effect'")

    @staticmethod
    def state(i: str) -> str:
        fate = f"(({i}) DIV 20) % 20"
        return (f"CASE WHEN {fate} < 2 THEN 'dead' WHEN {fate} = 2 THEN 'cancelled'"
                f" WHEN {fate} = 3 THEN 'skipped' ELSE 'succeeded' END")

    @staticmethod
    def failure(i: str) -> str:
        return (f"IF((({i}) DIV 20) % 20 < 2,"
                f" {pick(i, *_CLASSES)}, NULL)")

    def terminal_items(self, i: str) -> str:
        effect = f"({i}) % 20 = 19"
        receipt = f"({i}) % 20 BETWEEN 16 AND 18"
        failure = self.failure(i)
        return ("INSERT INTO work_items (work_id, family, org_id, app_installation_id,"
                " subject_kind, subject_id, definition_ref, catalog_revision, catalog_digest,"
                " payload, payload_schema_version, engine_capability_version, queue_class,"
                " state, run_after_us, attempt, max_attempts, ownership_epoch,"
                " cancel_requested, terminal_outcome, failure_class, operator_summary,"
                " dedupe_key, row_version, created_at_us, updated_at_us) SELECT "
                f"{self.work_id(i)}, {self.family(i)}, CONCAT('org-', ({i}) % 50), 'install-1',"
                f" IF({effect}, 'command', IF({receipt}, 'receipt', 'lead')),"
                f" IF({effect}, {self.command_id(i)}, IF({receipt},"
                f" CONCAT('cmd-', LPAD({i}, 9, '0')),"
                f" CONCAT('lead-', LPAD(({i}) DIV 40, 9, '0')))),"
                f" '', 7, 'sha256:catalog', '{{\"bench\": true}}', 1, 1, 'default',"
                f" {self.state(i)}, {self.created(i)}, IF({failure} IS NULL, 1, 5), 5, 1, 0,"
                f" {self.state(i)}, {failure},"
                f" IF({failure} IS NULL, NULL, CONCAT({failure}, ': refused (bench)')),"
                f" IF({receipt}, CONCAT('receipt:cmd-', LPAD({i}, 9, '0')), NULL), 3,"
                f" {self.created(i)}, {self.finished(i)}")

    def executions(self, i: str) -> str:
        return ("INSERT INTO work_executions (work_id, ownership_epoch, family, attempt,"
                " replica, outcome, finished_at_us) SELECT "
                f"{self.work_id(i)}, 1, {self.family(i)}, IF({self.failure(i)} IS NULL, 1, 5),"
                f" CONCAT('replica-', ({i}) % 4), {self.state(i)}, {self.finished(i)}")

    # Effects: command k is terminal item i = 20k + 19 ---------------------------------
    def commands(self, k: str) -> str:
        i = f"(20 * ({k}) + 19)"
        return ("INSERT INTO external_commands (command_id, handoff_key, org_id,"
                " app_installation_id, runtime_capability_id, runtime_work_binding_digest,"
                " runtime_name, intent_id, intent_kind, operation, local_object, local_id,"
                " binding_id, binding_generation, catalog_revision, frozen_request,"
                " payload_digest, runtime_outbox_id, settlement, created_at_us, updated_at_us,"
                " catalog_digest, principal_generation) SELECT "
                f"{self.command_id(i)},"
                f" CONCAT('v1:org-', {i} % 50, ':install-1:cap.leads:sha256:b:intent-', {i}),"
                f" CONCAT('org-', {i} % 50), 'install-1', 'cap.leads', 'sha256:binding', 'crm',"
                f" CONCAT('intent-', {i}), 'UPSERT',"
                f" {pick(k, *_OPERATIONS)},"
                f" 'lead', CONCAT('lead-', LPAD({i} DIV 40, 9, '0')),"
                f" CONCAT('binding-', ({k}) % {BINDINGS}), 1, 7,"
                " '{\"properties\": {\"jobtitle\": \"CTO\"}}', 'sha256:p',"
                f" CONCAT('outbox-', {i}),"
                f" CASE {self.state(i)} WHEN 'succeeded' THEN 'succeeded'"
                " WHEN 'skipped' THEN 'no_effect' ELSE 'retired' END,"
                f" {self.created(i)}, {self.finished(i)}, 'sha256:catalog', 1")

    def attempts(self, k: str, retry: bool) -> str:
        """The deciding attempt of command k (epoch 1), or (``retry``) the earlier 503 of
        every tenth success (epoch 0, dispatched a second before)."""
        i = f"(20 * ({k}) + 19)"
        state = self.state(i)
        ok = f"{state} = 'succeeded'"
        at = f"({self.finished(i)} - {2_000_000 if retry else 1_000_000})"
        excerpt = ("'{\"request_body\": \"{\\\\\"properties\\\\\": {\\\\\"jobtitle\\\\\": \\\\\""
                   "[redacted]\\\\\"}}\", \"response_headers\": [[\"content-type\","
                   " \"application/json\"]], \"response_body\": \"{\\\\\"status\\\\\":"
                   " \\\\\"error\\\\\", \\\\\"category\\\\\": \\\\\"VALIDATION_ERROR\\\\\"}\"}'")
        if retry:
            outcome, status, failure, evidence, exchange = (
                "'REPLAY_SAFE_RETRY'", "503", "'provider_unavailable'", "'not_applied'",
                excerpt.replace("VALIDATION_ERROR", "UNAVAILABLE"))
        else:
            outcome = f"IF({ok}, 'ACCEPTED', IF({state} = 'dead', 'REJECTED', NULL))"
            status = f"IF({ok}, 200, IF({state} = 'dead', 422, NULL))"
            failure = f"IF({state} = 'dead', 'provider_rejected', NULL)"
            evidence = f"IF({ok}, 'applied', IF({state} = 'dead', 'not_applied', NULL))"
            exchange = f"IF({state} = 'dead', {excerpt}, NULL)"
        where = f" WHERE ({k}) % 10 = 0 AND {ok}" if retry else ""
        return ("INSERT INTO effect_attempts (attempt_id, command_id, work_id, ownership_epoch,"
                " lease_token, method, target_path, safe_headers, body_sha256,"
                " idempotency_key, pre_dispatch_evidence, dispatch_started_at_us,"
                " response_status, provider_evidence, outcome, failure_class, finished_at_us,"
                " row_version, evidence, gave_up_at_us, exchange_excerpt) SELECT "
                f"{ulid(at, i, 3 if retry else 4)}, {self.command_id(i)}, {self.work_id(i)},"
                f" {0 if retry else 1}, 'token', 'PATCH',"
                f" CONCAT('/crm/v3/objects/contacts/', {i}),"
                " '{\"content-type\": \"application/json\"}', 'sha256:body',"
                f" CONCAT('idem-', {i}), '{{}}', {at} - 300000, {status}, '{{}}', {outcome},"
                f" {failure}, {at}, 1, {evidence}, IF({outcome} IS NULL, NULL, {at}),"
                f" {exchange}{{from}}{where}")

    def receipts(self, k: str) -> str:
        i = f"(20 * ({k}) + 19)"
        kind = f"({k}) % 100"
        return ("INSERT INTO result_receipts (command_id, intent_id, result_format_version,"
                " remote_id, canonical_result, result_digest, state, last_error,"
                " created_at_us, confirmed_at_us) SELECT "
                f"{self.command_id(i)}, CONCAT('intent-', {i}), 1, CONCAT('hs-', {i}),"
                f" '{{\"id\": \"1\"}}', 'sha256:r', IF({kind} < 2, 'pending', 'confirmed'),"
                f" IF({kind} = 0, 'runtime_refused', NULL), {self.finished(i)} - 900000,"
                f" IF({kind} < 2, NULL, {self.finished(i)}){{from}}"
                f" WHERE {self.state(i)} = 'succeeded'")

    # Open item j (0 <= j < open): created over the last 6 hours ---------------------
    def open_items(self, j: str) -> str:
        created = f"({self.now - 6 * HOUR_US} + ({j}) * {6 * HOUR_US // max(1, self.open)})"
        slot = f"({j}) % 20"
        state = (f"CASE WHEN {slot} IN (14, 15) THEN 'retry' WHEN {slot} = 17"
                 " THEN 'processing' ELSE 'pending' END")
        failure = (f"CASE WHEN {slot} IN (14, 15) THEN 'timeout' WHEN {slot} = 16"
                   " THEN 'quota_wait' ELSE NULL END")
        summary = (f"CASE WHEN {slot} IN (14, 15) THEN 'timeout: no answer in 30 s'"
                   f" WHEN {slot} = 16 THEN CONCAT('quota key hubspot:binding-', ({j}) % "
                   f"{QUOTA_KEYS}, ':burst has no send slot for 1.000 s; scheduled for then')"
                   " ELSE NULL END")
        lane = f"IF({slot} >= 18, CONCAT('lane-', ({j}) % 997), NULL)"
        return ("INSERT INTO work_items (work_id, family, org_id, app_installation_id,"
                " subject_kind, subject_id, definition_ref, catalog_revision, catalog_digest,"
                " payload, payload_schema_version, engine_capability_version, queue_class,"
                " source_lane, source_seq, state, run_after_us, attempt, max_attempts,"
                " lease_owner, lease_token, lease_until_us, ownership_epoch,"
                " cancel_requested, failure_class, operator_summary, row_version,"
                " created_at_us, updated_at_us) SELECT "
                f"{ulid(created, j, 5)},"
                f" {pick(j, *_OPEN_FAMILIES)},"
                f" CONCAT('org-', ({j}) % 50), 'install-1', 'lead',"
                f" CONCAT('lead-o', LPAD({j}, 9, '0')), '', 7, 'sha256:catalog',"
                f" '{{\"bench\": true}}', 1, 1, 'default', {lane}, IF({lane} IS NULL, NULL, {j}),"
                f" {state}, IF({slot} IN (14, 15, 16), {self.now} + 60000000 + ({j}) % 600000000,"
                f" {created}), IF({slot} IN (14, 15, 17), 1, 0), 5,"
                f" IF({slot} = 17, 'replica-1', NULL), IF({slot} = 17, 'token', NULL),"
                f" IF({slot} = 17, {self.now} + 600000000, NULL), IF({slot} = 17, 1, 0), 0,"
                f" {failure}, {summary}, 1, {created}, {created}")

    # Ingress receipt r over the last 30 days ----------------------------------------
    def ingress(self, r: str, count: int) -> str:
        at = f"({self.now - 30 * 86_400_000_000} + ({r}) * {30 * 86_400_000_000 // max(1, count)})"
        state = (f"CASE WHEN ({r}) % 100 < 2 THEN 'quarantined' WHEN ({r}) % 100 = 2"
                 " THEN 'received' ELSE 'materialized' END")
        return ("INSERT INTO ingress_receipts (receipt_id, dedup_key, route, binding_id, webhook,"
                " subscription_generation, received_at_us, body_b64, body_sha256, body_bytes,"
                " headers_json, verification, via, replica_id, duplicates, state,"
                " quarantine_reason, settled_at_us, row_version) SELECT "
                f"{ulid(at, r, 6)}, CONCAT('d-', LPAD({r}, 10, '0')),"
                f" {pick(r, *_ROUTES)},"
                f" CONCAT('binding-', ({r}) % {BINDINGS}), 'main', 1, {at}, 'e30=',"
                f" 'sha256hex', 2, '{{}}', 'verified', 'http', 'replica-1', 0, {state},"
                f" IF({state} = 'quarantined', 'unknown_event', NULL),"
                f" IF({state} = 'received', NULL, {at} + 50000), 1")

    def audit(self, a: str, count: int) -> str:
        at = f"({self.now - YEAR_US} + ({a}) * {YEAR_US // max(1, count)})"
        return ("INSERT INTO audit_log (audit_id, at_us, actor, role, action, target_kind,"
                " target_id, reason, before_json, after_json) SELECT "
                f"{ulid(at, a, 7)}, {at}, CONCAT('operator-', ({a}) % 5), 'admin',"
                f" {pick(a, *_ACTIONS)},"
                f" 'work_item', CONCAT('lead-', LPAD(({a}) * 7, 9, '0')), 'bench', '{{}}',"
                " '{}'")

    def singles(self) -> list[str]:
        now = self.now
        bindings = ", ".join(
            f"('binding-{b}', 'shared', 'org-{b}', 'install-1', 'hubspot', 'user-{b}',"
            f" 'https://issuer', 'acct-{b}', 'subj-{b}', 'inst-{b}', '[]', 1, 'connected',"
            f" {now - YEAR_US}, {now})" for b in range(BINDINGS))
        keys = ", ".join(
            f"('hubspot:binding-{q}:burst', {now}, 0, {now - 60_000_000}, {q * 10},"
            f" {1000 * (q + 1)}, {q}, 100, 10000000, 100000, {now}, NULL)"
            for q in range(QUOTA_KEYS))
        return [
            "INSERT INTO principal_bindings (binding_id, kind, org_id, app_installation_id,"
            " provider, user_id, issuer, remote_account_id, remote_subject, installation_id,"
            f" scopes_json, generation, state, created_at_us, updated_at_us) VALUES {bindings}",
            "INSERT INTO quota_keys (quota_key, tat_us, blocked_until_us, last_throttled_at_us,"
            " throttles_total, granted_total, returned_total, limit_count, window_us,"
            f" interval_us, updated_at_us, slot_log) VALUES {keys}",
        ]


def _batches(total: int) -> list[tuple[int, int]]:
    return [(start, min(total, start + BATCH)) for start in range(0, total, BATCH)]


def statements(template: str, var: str, total: int) -> list[str]:
    """``template`` (its row variable ``var``) over 0..total-1, :data:`BATCH` rows a
    statement; ``{from}`` in the template marks where the row source goes (else the end)."""
    out = []
    for start, stop in _batches(total):
        source = f" FROM seq_0_to_{stop - start - 1} s"
        sql = template.replace(var, f"(s.seq + {start})")
        out.append(sql.replace("{from}", source) if "{from}" in sql else sql + source)
    return out


LOADED = ("work_items", "work_executions", "external_commands", "effect_attempts",
          "result_receipts", "ingress_receipts", "audit_log")


def _parallel(database: str, sqls: list[str], workers: int) -> None:
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for done in [pool.submit(mariadb_client, database, sql) for sql in sqls]:
            done.result()


def load(database: str, open_items: int, terminal: int, workers: int = 3) -> dict[str, Any]:
    """Create, migrate and fill ``database``: secondary indexes dropped, every table's
    rows generated (``workers`` statements at once), then the indexes built again, one
    ``ALTER TABLE`` a table (a sorted build: far cheaper than row-by-row maintenance of
    17 indexes on a 128 MB buffer pool); per-step seconds, rows and megabytes."""
    started = time.monotonic()
    indexes = migrated_without_indexes(database, LOADED)
    plan = Plan(open_items, terminal, time.time_ns() // 1000)
    effects = terminal // 20
    steps: dict[str, float] = {}
    for sql in plan.singles():
        mariadb_client(database, sql)
    t0 = time.monotonic()
    jobs = [
        *statements(plan.terminal_items("@I"), "@I", terminal),
        *statements(plan.open_items("@J"), "@J", open_items),
        *statements(plan.executions("@I"), "@I", terminal),
        *statements(plan.commands("@K"), "@K", effects),
        *statements(plan.attempts("@K", retry=False), "@K", effects),
        *statements(plan.attempts("@K", retry=True), "@K", effects),
        *statements(plan.receipts("@K"), "@K", effects),
        *statements(plan.ingress("@R", terminal // 40), "@R", terminal // 40),
        *statements(plan.audit("@A", terminal // 100), "@A", terminal // 100),
    ]
    _parallel(database, jobs, workers)
    steps["rows"] = round(time.monotonic() - t0, 1)
    print(json.dumps({"bench": "seqload.step", "step": "rows", "statements": len(jobs),
                      "seconds": steps["rows"]}), flush=True)
    t0 = time.monotonic()
    _parallel(database, [f"ALTER TABLE {t} {', '.join(c)}" for t, c in indexes.items() if c]
              + ["SELECT 1"], workers)
    steps["indexes"] = round(time.monotonic() - t0, 1)
    print(json.dumps({"bench": "seqload.step", "step": "indexes",
                      "seconds": steps["indexes"]}), flush=True)
    t0 = time.monotonic()
    rollup(database)
    steps["history_rollup"] = round(time.monotonic() - t0, 1)
    for table in (*LOADED, "history_rollup"):
        mariadb_client(database, f"ANALYZE TABLE {table}", capture=True)
    return {"bench": "seqload", "database": database, "open": open_items,
            "terminal": terminal, "steps_s": steps,
            "total_s": round(time.monotonic() - started, 1), "rows": counts(database),
            "mb": sizes(database), "load_1m_after": round(os.getloadavg()[0], 1)}


DAY_US = 86_400_000_000


_LEVELS = (300_000_000, 3_600_000_000, 21_600_000_000, DAY_US)  # summed from the minutes
_KEYS = "family, outcome, org_id, binding_id, operation"
STATEMENTS_A_DAY = 2 + len(_LEVELS)


def rollup_statements(first_us: int, last_us: int) -> list[str]:
    """The statements that build the history rollup of executions finished in
    ``[first_us, last_us]``, one UTC day at a time (minute rows counted from the
    executions, then that day's five-minute, hour, six-hour and day rows summed from its
    minute rows), keyed as ``integrationd history rebuild`` keys them (storage/history.py): an
    effect item under its command's org, binding and operation (the item by primary key,
    its command by primary key), every other family's under ``''``.

    One ``GROUP BY`` over the whole journal (20M rows) needs an on-disk temporary table
    of millions of groups under MariaDB's ``tmpdir``, runs for many minutes and is lost
    whole when that file goes; a day is ~55k executions and ~30k groups (an in-memory
    temporary table), read through ``work_executions_finished``, and a failed day is
    its statements to run again. :data:`STATEMENTS_A_DAY` statements a day: the day's
    old rows deleted, then its minute, five-minute, hour, six-hour and day rows."""
    out = []
    for day in range(first_us - first_us % DAY_US, last_us + 1, DAY_US):
        out.append(  # the day's rows of an earlier, interrupted run: a day is redone whole
            f"DELETE FROM history_rollup WHERE bucket_us >= {day} AND bucket_us < {day + DAY_US}")
        out.append(
            f"INSERT INTO history_rollup (level_us, bucket_us, {_KEYS}, shard, executions)"
            " SELECT 60000000, e.finished_at_us - e.finished_at_us % 60000000 AS b,"
            " e.family, e.outcome, COALESCE(c.org_id, ''), COALESCE(c.binding_id, ''),"
            " COALESCE(c.operation, ''), 0, COUNT(*) FROM work_executions e"
            " LEFT JOIN work_items w ON w.work_id = e.work_id AND w.subject_kind = 'command'"
            " AND e.family = 'external_effect'"
            " LEFT JOIN external_commands c ON c.command_id = w.subject_id"
            f" WHERE e.finished_at_us >= {day} AND e.finished_at_us < {day + DAY_US}"
            " GROUP BY b, e.family, e.outcome, c.org_id, c.binding_id, c.operation")
        for level in _LEVELS:
            out.append(
                f"INSERT INTO history_rollup (level_us, bucket_us, {_KEYS}, shard, executions)"
                f" SELECT {level}, bucket_us - bucket_us % {level} AS b, {_KEYS}, 0,"
                " SUM(executions) FROM history_rollup WHERE level_us = 60000000"
                f" AND bucket_us >= {day} AND bucket_us < {day + DAY_US}"
                f" GROUP BY b, {_KEYS}")
    return out


def rollup(database: str, *, resume: bool = False) -> None:
    """The history rollup from the journal, as ``integrationd history rebuild`` writes it,
    a UTC day per client call (:func:`rollup_statements`), each tried up to 5 times (a
    shared server can refuse a connection: error 1040, too many).
    ``resume``: keep the days an interrupted run finished, redo from its last one."""
    span = mariadb_client(database, (
        "SELECT MIN(finished_at_us), MAX(finished_at_us) FROM work_executions"), capture=True)
    first, last = span.splitlines()[1].split("\t")
    if not resume:
        mariadb_client(database, "DELETE FROM history_rollup")
    elif first != "NULL":
        done = mariadb_client(database, (
            f"SELECT MAX(bucket_us) FROM history_rollup WHERE level_us = {DAY_US}"),
            capture=True).splitlines()[1]
        first = first if done == "NULL" else str(max(int(first), int(done)))
    if first == "NULL":
        return
    sqls = rollup_statements(int(first), int(last))
    for day in range(0, len(sqls), STATEMENTS_A_DAY):
        for attempt in range(5):
            try:
                mariadb_client(database, "; ".join(sqls[day:day + STATEMENTS_A_DAY]))
                break
            except subprocess.CalledProcessError:
                if attempt == 4:
                    raise
                time.sleep(2 + 5 * attempt)


def rollup_only(database: str, *, resume: bool = False) -> dict[str, Any]:
    """Rebuild only the history rollup of an already loaded ``database`` (migrated to
    this checkout's schema first: ``integrationd migrate`` or storage.migrate), and
    analyze it; the database is kept whatever happens."""
    t0 = time.monotonic()
    rollup(database, resume=resume)
    seconds = round(time.monotonic() - t0, 1)
    mariadb_client(database, "ANALYZE TABLE history_rollup", capture=True)
    rows = mariadb_client(database, (
        "SELECT level_us, COUNT(*) FROM history_rollup GROUP BY level_us"), capture=True)
    return {"bench": "seqload.rollup_only", "database": database, "seconds": seconds,
            "rows_per_level": {line.split("\t")[0]: int(line.split("\t")[1])
                               for line in rows.splitlines()[1:]},
            "load_1m_after": round(os.getloadavg()[0], 1)}


def counts(database: str) -> dict[str, int]:
    out = mariadb_client(database, (
        "SELECT table_name, table_rows FROM information_schema.tables"
        " WHERE table_schema = DATABASE() AND table_rows > 0"), capture=True)
    return {line.split("\t")[0]: int(line.split("\t")[1]) for line in out.splitlines()[1:]}


def sizes(database: str) -> dict[str, int]:
    out = mariadb_client(database, (
        "SELECT table_name, ROUND((data_length + index_length) / 1048576)"
        " FROM information_schema.tables WHERE table_schema = DATABASE()"
        " AND data_length + index_length > 1048576"), capture=True)
    return {line.split("\t")[0]: int(float(line.split("\t")[1] or 0))
            for line in out.splitlines()[1:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--open", type=int, default=1_000_000, help="open work items")
    parser.add_argument("--terminal", type=int, default=20_000_000,
                        help="terminal work items (one execution each)")
    parser.add_argument("--database", required=True)
    parser.add_argument("--keep", action="store_true", help="keep the database")
    parser.add_argument("--drop", action="store_true", help="only drop --database")
    parser.add_argument("--rollup-only", action="store_true",
                        help="only rebuild the history rollup of an already loaded (and"
                             " migrated) --database; never drops it")
    parser.add_argument("--resume", action="store_true",
                        help="with --rollup-only: keep the days an interrupted run finished")
    args = parser.parse_args()
    if args.drop:
        mariadb_client(None, f"DROP DATABASE IF EXISTS {args.database}")
        return
    if args.rollup_only:
        print(json.dumps(rollup_only(args.database, resume=args.resume)), flush=True)
        return
    try:
        print(json.dumps(load(args.database, args.open, args.terminal)), flush=True)
    finally:
        if not args.keep:
            mariadb_client(None, f"DROP DATABASE IF EXISTS {args.database}")


if __name__ == "__main__":
    main()
