"""``integrationd subscriptions reconcile|status``: the console's Subscriptions actions.

* ``reconcile --binding B --actor NAME --reason TEXT``: queue one subscription
  reconciliation run now (as the console's "reconcile now"; it queues no next run, the
  chain goes on). Audited as ``subscriptions.reconcile``.
* ``status [--json]``: every observed subscription: provider id, generation, health,
  secret generation, retiring ones, last reconciliation and outcome (never a token).

A binding no route wants subscriptions for is one line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from config.catalog import load_catalog
from config.settings import Settings
from daemon.services.clock import WallClock
from daemon.services.operator_api import authorize
from daemon.services.subscription_operator import NoSuchBinding, reconcile_now, row_json
from storage.port import SqlTx
from storage.subscriptions import SubscriptionRow, read_subscriptions
from storage.work_store import WorkStore


class SubscriptionsUsage(Exception):
    """Input the operator can fix: one line, exit 2."""


def add_subscriptions_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]
                              ) -> None:
    cmd = sub.add_parser("subscriptions", help="reconcile and inspect webhook subscriptions")
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
        async def body(tx: SqlTx) -> list[SubscriptionRow]:
            return await read_subscriptions(tx)

        rows = [row_json(r, now_us) for r in
                await store.db.transact(body, name="subscriptions.status", write=False)]
        if args.json:
            sys.stdout.write(json.dumps({"subscriptions": rows}, indent=2, sort_keys=True)
                             + "\n")
            return
        for r in rows:
            age = ("never" if r["last_reconciled_age_s"] is None
                   else f"{r['last_reconciled_age_s']:.0f} s ago")
            sys.stdout.write(f"{r['name']}  id {r['provider_id']}  generation"
                             f" {r['generation']}  {r['health']}  secret generation"
                             f" {r['secret_generation']}  retiring {len(r['retiring'])}"
                             f"  reconciled {age}  {r['last_outcome'] or '-'}\n")
        return
    operator = authorize(settings, args.actor, "subscriptions.reconcile")
    if not args.reason.strip():
        raise SubscriptionsUsage("--reason must not be empty")
    try:
        work_id = await reconcile_now(store, load_catalog(settings), settings.webhook_routes,
                                      args.binding, actor=operator.name, role=operator.role,
                                      reason=args.reason, now_us=now_us)
    except NoSuchBinding as exc:
        raise SubscriptionsUsage(f"--binding: {exc}") from None
    sys.stdout.write(f"binding {args.binding}: queued a subscription reconciliation run as"
                     f" work item {work_id}\n")
