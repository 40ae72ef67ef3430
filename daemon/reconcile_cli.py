"""``integrationd reconcile start|repair|status``: cursor reconciliation as operator actions.

* ``start --binding B --resource R``: queue the stream's next incremental run now (its
  dedupe key is the run number, so a stream whose run is already queued is not doubled).
  Audited.
* ``repair --binding B --resource R (--from T [--to T] | --full)``: one bounded or full
  repair run: every record changed in the period is offered to the inbound Flow once more
  (origin ``repair``; the Flow's watermarks keep it from regressing anything). The period
  is the operator's; the run id is in the audit entry. Audited.
* ``status``: every stream's cursor, runs and lag.

The run is pinned to the current Catalog revision (it must be published). A binding or
resource this configuration does not serve, or a bad time, is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from config.catalog import Catalog, load_catalog
from config.settings import Settings
from daemon.cli_commands import HELP
from daemon.core.cursor import lag_seconds, sync_lag_seconds
from daemon.core.inbound_flow import remote_time_ns
from daemon.services.clock import WallClock
from daemon.services.operator_api import authorize
from daemon.services.reconcile import RECONCILE_FAMILY, RunPayload, run_spec, stream_key
from storage.idgen import new_ulid
from storage.port import AuditEntry, SqlTx
from storage.reconcile import StreamState, list_streams, read_stream
from storage.work_admin import append_audit, insert_work
from storage.work_store import WorkStore


class ReconcileUsage(Exception):
    """Input the operator can fix: one line, exit 2."""


def add_reconcile_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rec = sub.add_parser("reconcile", help=HELP["reconcile"])
    verbs = rec.add_subparsers(dest="reconcile_command", required=True, metavar="VERB")
    for name, help_text in (("start", "queue a stream's next incremental run now"),
                            ("repair", "offer every record changed in a period again")):
        verb = verbs.add_parser(name, help=help_text)
        verb.add_argument("--binding", required=True, help="L2 binding id")
        verb.add_argument("--resource", required=True, help="L1 resource name, e.g. prospect")
        verb.add_argument("--actor", required=True, help="operator name (operator/admin)")
        verb.add_argument("--reason", required=True, help="why (kept in the audit log)")
        if name == "repair":
            verb.add_argument("--from", dest="from_time",
                              help="period start, ISO 8601 UTC (e.g. 2026-11-30T00:00:00Z)")
            verb.add_argument("--to", dest="to_time", help="period end (default: now)")
            verb.add_argument("--full", action="store_true", help="from the beginning")
    status = verbs.add_parser("status", help="every stream's cursor, runs and lag")
    status.add_argument("--json", action="store_true", help="print JSON")


def _time(flag: str, text: str) -> int:
    value = remote_time_ns(text)
    if value is None:
        raise ReconcileUsage(f"{flag}: {text!r} is not an ISO 8601 time such as"
                             " 2026-11-30T00:00:00Z")
    return value


def _safety_lag(catalog: Catalog, state: StreamState) -> float | None:
    binding = catalog.binding(state.binding_id)
    return next((o.reconcile.safety_lag_s for o in catalog.object_bindings
                 if binding is not None and o.provider == binding.provider
                 and o.resource == state.resource), None)


def _stream_json(state: StreamState, now_ns: int, safety_lag_s: float | None
                 ) -> dict[str, Any]:
    """``lag_seconds`` is the sync lag, as the console and the gauge give it; the cursor's
    own age (the newest record seen) is ``cursor_age_seconds``."""
    cursor = state.cursor
    return {"stream": state.stream_key, "binding": state.binding_id,
            "resource": state.resource, "runs": state.runs,
            "cursor": None if cursor is None else {"updated_at": cursor.updated_at,
                                                   "id": cursor.record_id},
            "lag_seconds": sync_lag_seconds(state.last_run_at_us, safety_lag_s, now_ns / 1e9),
            "cursor_age_seconds": lag_seconds(cursor, now_ns),
            "last_run_at_us": state.last_run_at_us}


async def run_reconcile_command(store: WorkStore, settings: Settings,
                                args: argparse.Namespace) -> None:
    now_us = WallClock().now_us()
    verb = args.reconcile_command
    if verb == "status":
        streams = await store.db.transact(list_streams, name="reconcile.status", write=False)
        catalog = load_catalog(settings)
        docs = [_stream_json(s, now_us * 1000, _safety_lag(catalog, s)) for s in streams]
        if args.json:
            sys.stdout.write(json.dumps({"streams": docs}, indent=2, sort_keys=True) + "\n")
            return
        if not docs:
            sys.stdout.write("no reconciliation streams yet (integrationd reconcile start)\n")
        for d in docs:
            cursor = d["cursor"] or {"updated_at": "-", "id": "-"}
            lag = "-" if d["lag_seconds"] is None else f"{d['lag_seconds']:.0f} s"
            sys.stdout.write(f"{d['stream']}  runs {d['runs']}  cursor {cursor['updated_at']}"
                             f" / {cursor['id']}  lag {lag}\n")
        return
    operator = authorize(settings, args.actor, f"reconcile.{verb}")
    if not args.reason.strip():
        raise ReconcileUsage("--reason must not be empty")
    catalog = load_catalog(settings)
    binding = catalog.binding(args.binding)
    if binding is None:
        raise ReconcileUsage(f"--binding: no binding {args.binding!r} in this configuration")
    resource = catalog.resource(binding.provider, args.resource)
    if resource is None or resource.list is None:
        raise ReconcileUsage(f"--resource: {binding.provider} has no listable resource"
                             f" {args.resource!r}")
    published = await store.catalog_get(catalog.revision)
    if published is None or published.digest != catalog.digest:
        raise ReconcileUsage(f"catalog revision {catalog.revision} is not published with this"
                             " configuration's content (integrationd catalog publish)")
    key = stream_key(args.binding, args.resource)
    if verb == "start":
        run = RunPayload(binding=args.binding, resource=args.resource)
    else:
        if args.full == (args.from_time is not None):
            raise ReconcileUsage("repair: give --from (a bounded period) or --full, not both")
        run = RunPayload(binding=args.binding, resource=args.resource, mode="repair",
                         run_id=new_ulid(now_us),
                         from_ns=None if args.full else _time("--from", args.from_time),
                         until_ns=None if args.to_time is None else _time("--to",
                                                                         args.to_time))
        if run.from_ns is not None and run.until_ns is not None and run.until_ns < run.from_ns:
            raise ReconcileUsage("--to is before --from")

    async def body(tx: SqlTx) -> tuple[str, bool]:
        state = await read_stream(tx, key, args.binding, args.resource)
        (result,) = await insert_work(tx, [run_spec(
            catalog, binding, run, number=state.runs,
            max_attempts=settings.family(RECONCILE_FAMILY).max_attempts)], now_us)
        await append_audit(tx, AuditEntry(
            audit_id=new_ulid(now_us), at_us=now_us, actor=operator.name, role=operator.role,
            action=f"reconcile.{verb}", target_kind="reconcile_stream", target_id=key,
            reason=args.reason, before="{}",
            after=json.dumps({"work_id": result.work_id, "created": result.created,
                              **{k: v for k, v in json.loads(run.to_payload()).items()
                                 if k != "version"}}, sort_keys=True)))
        return result.work_id, result.created

    work_id, created = await store.db.transact(body, name=f"reconcile.{verb}")
    if verb == "start" and not created:
        sys.stdout.write(f"stream {key}: its next run is already queued ({work_id})\n")
        return
    what = "run" if verb == "start" else f"repair run {run.run_id}"
    sys.stdout.write(f"stream {key}: queued {what} as work item {work_id}\n")
