"""The subscription family's operator surface: "reconcile now" (console and CLI, audited),
the chains every replica queues at start, the replay guard, and what the console and the
CLI show of an observed row (never a token)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from config.catalog import Catalog
from config.settings import BindingSettings, WebhookRoute
from config.subscription_defs import desired_subscriptions
from daemon.core.work import WorkItem
from daemon.services.subscription_items import SUBSCRIPTION_FAMILY, run_spec
from storage.idgen import new_ulid
from storage.port import AuditEntry, SqlTx
from storage.subscriptions import LastItem, SubscriptionRow, last_items, read_subscriptions
from storage.work_admin import append_audit, insert_work
from storage.work_store import WorkStore


async def replay_refusal(store: WorkStore, item: WorkItem) -> str | None:
    """Seed 10: a step whose attempt's outcome is unknown is not replayed (a replay is a
    new WorkItem, a new command id in the effect journal: it would send the call again)
    until its read-back or an operator's disposition settled the attempt."""
    if any(a.unresolved for a in await store.effect_attempts(item.work_id)):
        return ("an attempt of this subscription step is unresolved (its outcome is"
                " unknown): let the step read it back, or record an operator disposition"
                " first")
    return None


def bindings_with_subscriptions(catalog: Catalog, routes: Sequence[WebhookRoute]
                                ) -> list[BindingSettings]:
    """The bindings some route wants subscriptions for (by id)."""
    names = sorted({d.binding_id for d in desired_subscriptions(catalog.webhooks, routes)})
    return [b for b in (catalog.binding(n) for n in names) if b is not None]


async def start_chains(store: Any, catalog: Catalog, routes: Sequence[WebhookRoute],
                       now_us: int, interval_s: float = 300.0, *, max_attempts: int) -> int:
    """At replica start: each binding's run chain (keyed by time slot, so replicas
    starting together, or a chain already queued for this slot, make one)."""
    specs = [run_spec(b, catalog, now_us=now_us, interval_s=interval_s,
                      max_attempts=max_attempts)
             for b in bindings_with_subscriptions(catalog, routes)]
    if specs:
        await store.work_enqueue(specs, now_us)
    return len(specs)


class NoSuchBinding(LookupError):
    pass


async def reconcile_now(store: Any, catalog: Catalog, routes: Sequence[WebhookRoute],
                        binding_id: str, *, actor: str, role: str, reason: str,
                        now_us: int, max_attempts: int) -> str:
    """An operator's "reconcile now": one run queued at once (it queues no next run; the
    chain goes on), audited in the same transaction. Returns the run's WorkItem id."""
    binding = next((b for b in bindings_with_subscriptions(catalog, routes)
                    if b.binding_id == binding_id), None)
    if binding is None:
        raise NoSuchBinding(f"binding {binding_id!r} has no route with subscriptions")
    spec = run_spec(binding, catalog, now_us=now_us, interval_s=300.0, chain=False,
                    max_attempts=max_attempts)

    async def body(tx: SqlTx) -> str:
        (result,) = await insert_work(tx, [spec], now_us)
        await append_audit(tx, AuditEntry(
            audit_id=new_ulid(now_us), at_us=now_us, actor=actor, role=role,
            action="subscriptions.reconcile", target_kind="binding", target_id=binding_id,
            reason=reason, before="{}", after=json.dumps({"work_id": result.work_id})))
        return str(result.work_id)

    work_id: str = await store.db.transact(body, name="subscriptions.reconcile_now")
    return work_id


def row_json(row: SubscriptionRow, now_us: int) -> dict[str, Any]:
    """What the console and the API show of one observed row (never a token)."""
    return {
        "name": row.name, "binding_id": row.binding_id, "route": row.route,
        "resource": row.resource, "action": row.action, "url": row.url,
        "payload_version": row.payload_version, "provider_id": row.provider_id,
        "generation": row.generation, "secret_generation": row.secret_generation,
        "health": row.health, "cleanup_token": "sealed:" + row.cleanup.key_id
        if row.cleanup else None,
        "retiring": [{"provider_id": x.provider_id, "generation": x.generation}
                     for x in row.retiring],
        "rotating": row.rotating,
        "last_reconciled_age_s": None if row.last_reconciled_at_us is None
        else round((now_us - row.last_reconciled_at_us) / 1e6, 1),
        "last_outcome": row.last_outcome, "last_reason": row.last_reason,
    }


async def read_status(tx: SqlTx, catalog: Catalog, routes: Sequence[WebhookRoute]
                      ) -> tuple[list[SubscriptionRow], dict[str, LastItem]]:
    """The observed rows, and the last run of each binding and the last step of each
    subscription from the durable WorkItems (a run's subject is its binding, a step's
    its row's name)."""
    desired = desired_subscriptions(catalog.webhooks, routes)
    rows = await read_subscriptions(tx)
    subjects = [*sorted({d.binding_id for d in desired}),
                *sorted({d.name for d in desired} | {r.name for r in rows})]
    return rows, await last_items(tx, SUBSCRIPTION_FAMILY, subjects)


def status_json(catalog: Catalog, routes: Sequence[WebhookRoute], rows: list[SubscriptionRow],
                last: dict[str, LastItem], now_us: int) -> dict[str, Any]:
    """Desired against observed, each binding's last run, the health counts (the console's
    Subscriptions page and ``integrationd subscriptions status``)."""
    desired = desired_subscriptions(catalog.webhooks, routes)
    bindings = sorted({d.binding_id for d in desired})
    observed = {r.name: r for r in rows}

    def item(x: LastItem | None) -> dict[str, Any] | None:
        return None if x is None else {
            "work_id": x.work_id, "state": x.state, "attempt": x.attempt,
            "failure_class": x.failure_class, "summary": x.summary,
            "age_s": round((now_us - x.updated_at_us) / 1e6, 1)}

    # Each name desired or observed: the provider's state as the last run saw it (a
    # desired one with no row is missing: nothing of it exists at the provider).
    health = {**{d.name: "missing" for d in desired},
              **{r.name: r.health for r in rows}}
    return {
        "desired": [{"name": d.name, "binding_id": d.binding_id, "route": d.route,
                     "resource": d.resource, "action": d.action, "url": d.url,
                     "payload_version": d.payload_version,
                     "secret_generation": d.secret_generation,
                     "state": health[d.name],
                     "observed": None if d.name not in observed else {
                         "provider_id": observed[d.name].provider_id,
                         "generation": observed[d.name].generation,
                         "secret_generation": observed[d.name].secret_generation,
                         "url": observed[d.name].url},
                     "last_step": item(last.get(d.name))} for d in desired],
        "observed": [{**row_json(r, now_us), "last_step": item(last.get(r.name))}
                     for r in rows],
        "runs": [{"binding_id": b, **(item(last.get(b)) or {})} for b in bindings
                 if b in last],
        "bindings": bindings,
        "health": {h: sum(1 for v in health.values() if v == h)
                   for h in ("active", "disabled", "missing")},
        "counts": {"desired": len(desired), "observed": len(rows)},
        # Each desired subscription the provider does not have, and why we think so.
        "missing": [{"name": d.name, "binding_id": d.binding_id, "route": d.route,
                     "resource": d.resource, "action": d.action,
                     "why": "never created" if d.name not in observed else
                     f"the provider no longer lists id {observed[d.name].provider_id}"}
                    for d in desired if health[d.name] == "missing"],
    }
