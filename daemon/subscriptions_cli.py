"""``integrationd subscriptions reconcile|status``: the console's Subscriptions actions.

* ``reconcile --binding B --actor NAME --reason TEXT``: queue one subscription
  reconciliation run now (as the console's "reconcile now"; it queues no next run, the
  chain goes on). Audited as ``subscriptions.reconcile``.
* ``status [--json]``: each binding's last run (state, outcome class, summary), every
  desired subscription the provider does not have, every observed subscription:
  provider id, generation, health, secret generation, retiring ones, last
  reconciliation and outcome, and the health counts (never a token).

A binding no route wants subscriptions for is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from config.catalog import load_catalog
from config.settings import Settings
from daemon.cli_commands import HELP
from daemon.services.clock import WallClock
from daemon.services.operator_api import authorize
from daemon.services.subscription_items import SUBSCRIPTION_FAMILY
from daemon.services.subscription_operator import (
    NoSuchBinding,
    read_status,
    reconcile_now,
    status_json,
)
from storage.port import SqlTx
from storage.subscriptions import LastItem, SubscriptionRow
from storage.work_store import WorkStore


class SubscriptionsUsage(Exception):
    """Input the operator can fix: one line, exit 2."""


def add_subscriptions_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]
                              ) -> None:
    cmd = sub.add_parser("subscriptions", help=HELP["subscriptions"])
    verbs = cmd.add_subparsers(dest="subscriptions_command", required=True, metavar="VERB")
    rec = verbs.add_parser("reconcile", help="queue one subscription reconciliation now")
    rec.add_argument("--binding", required=True, help="L2 binding id")
    rec.add_argument("--actor", required=True, help="operator name (operator/admin)")
    rec.add_argument("--reason", required=True, help="why (kept in the audit log)")
    status = verbs.add_parser("status", help="every observed subscription and its health")
    status.add_argument("--json", action="store_true", help="print JSON")


async def run_subscriptions_command(store: WorkStore, settings: Settings,
                                    args: argparse.Namespace) -> None:
    now_us = WallClock().now_us()
    if args.subscriptions_command == "status":
        catalog = load_catalog(settings)

        async def body(tx: SqlTx) -> tuple[list[SubscriptionRow], dict[str, LastItem]]:
            return await read_status(tx, catalog, settings.webhook_routes)

        rows, last = await store.db.transact(body, name="subscriptions.status", write=False)
        doc = status_json(catalog, settings.webhook_routes, rows, last, now_us)
        if args.json:
            sys.stdout.write(json.dumps({"subscriptions": doc["observed"],
                                         "desired": doc["desired"], "runs": doc["runs"],
                                         "health": doc["health"], "counts": doc["counts"],
                                         "missing": doc["missing"]},
                                        indent=2, sort_keys=True) + "\n")
            return
        for run in doc["runs"]:
            what = (f"{run['failure_class']}: " if run["failure_class"] else "") + (
                run["summary"] or "-")
            sys.stdout.write(f"binding {run['binding_id']}  last run {run['work_id']}"
                             f"  {run['state']}  {run['age_s']:.0f} s ago  {what}\n")
        for d in doc["desired"]:
            if d["observed"] is None:
                step = d["last_step"]
                sys.stdout.write(f"{d['name']}  desired, not observed: {d['state']}"
                                 + (f"  last step {step['state']}"
                                    f" {step['failure_class'] or ''}".rstrip()
                                    if step else "") + "\n")
        for r in doc["observed"]:
            age = ("never" if r["last_reconciled_age_s"] is None
                   else f"{r['last_reconciled_age_s']:.0f} s ago")
            sys.stdout.write(f"{r['name']}  id {r['provider_id']}  generation"
                             f" {r['generation']}  {r['health']}  secret generation"
                             f" {r['secret_generation']}  retiring {len(r['retiring'])}"
                             f"  reconciled {age}  {r['last_outcome'] or '-'}\n")
        if not doc["desired"] and not doc["observed"]:
            sys.stdout.write("no subscription is desired (no webhook route with a public_url"
                             " whose contract subscribes) or observed\n")
        health, counts = doc["health"], doc["counts"]
        sys.stdout.write(f"desired {counts['desired']}  observed {counts['observed']}"
                         f"  active {health['active']}  disabled {health['disabled']}"
                         f"  missing {health['missing']}"
                         + (": " + ", ".join(m["name"] for m in doc["missing"])
                            if doc["missing"] else "") + "\n")
        return
    operator = authorize(settings, args.actor, "subscriptions.reconcile")
    if not args.reason.strip():
        raise SubscriptionsUsage("--reason must not be empty")
    try:
        work_id = await reconcile_now(store, load_catalog(settings), settings.webhook_routes,
                                      args.binding, actor=operator.name, role=operator.role,
                                      reason=args.reason, now_us=now_us,
                                      max_attempts=settings.family(
                                          SUBSCRIPTION_FAMILY).max_attempts)
    except NoSuchBinding as exc:
        raise SubscriptionsUsage(f"--binding: {exc}") from None
    sys.stdout.write(f"binding {args.binding}: queued a subscription reconciliation run as"
                     f" work item {work_id}\n")
