"""A rotated-out webhook secret retires itself, judged in a subscription run's fenced
finalization (docs/subscriptions.md; the pure rules are daemon/core/secret_retirement.py).

For each route of the binding with a previous secret: the pure retirement decision on the
rows as they are now and what this run listed; the runs to queue at the time to look
again are returned.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import attrs

from config.catalog import Catalog
from config.settings import BindingSettings, WebhookRoute
from config.subscription_defs import DesiredSubscription
from daemon.core.secret_retirement import Retire, RetirementView, Unwatch, Wait, Watch
from daemon.core.secret_retirement import decide as decide_retirement
from daemon.core.subscriptions import Remote
from daemon.core.work import WorkSpec
from daemon.services import logs
from daemon.services.subscription_items import retire_check_spec
from storage.idgen import new_ulid
from storage.port import AuditEntry, SqlTx
from storage.secret_retirements import (
    RetirementRow,
    delete_retirement,
    last_previous_secret_receipt,
    read_retirement,
    write_retirement,
)
from storage.subscriptions import read_subscriptions
from storage.work_admin import append_audit


async def retire_previous_secrets(
        tx: SqlTx, *, run_id: str, catalog: Catalog, routes: Sequence[WebhookRoute],
        binding: BindingSettings, desired: Sequence[DesiredSubscription],
        remote: Sequence[Remote], now: int, max_attempts: int) -> list[WorkSpec]:
    by_id = {r.provider_id: r for r in remote}
    rows = await read_subscriptions(tx, binding.binding_id)
    checks: list[WorkSpec] = []
    for route in routes:
        hook = catalog.webhooks.get(route.webhook)
        if route.binding_id != binding.binding_id or hook is None:
            continue
        names = {x.name for x in desired if x.route == route.route}
        mine = [r for r in rows if r.route == route.route]
        named = {pid for r in mine for pid in (r.provider_id,
                                               *(x.provider_id for x in r.retiring))}
        urls = {x.url for x in desired if x.route == route.route} | {
            r.url for r in mine} | ({route.public_url} if route.public_url else set())
        current = bool(names) and {r.name for r in mine} == names and all(
            r.secret_generation == route.secret_generation and not r.rotating
            and not r.retiring and r.provider_id in by_id
            and by_id[r.provider_id].active for r in mine) and not any(
            r.url in urls and r.provider_id not in named for r in remote)
        window_s = hook.redelivery_window_s()
        window = None if window_s is None else int(window_s * 1_000_000)
        gen = route.secret_generation
        before = await read_retirement(tx, route.route, gen)
        last = None
        if window is not None and before is not None and before.state == "watching":
            last = await last_previous_secret_receipt(tx, route.route, now - window, window)
        step = decide_retirement(RetirementView(
            has_previous=route.previous_secret is not None,
            subscriptions_current=current, window_us=window,
            state=before.state if before else None,
            watch_since_us=before.watch_since_us if before else None,
            last_previous_receipt_us=last), now)
        evidence: dict[str, object] = {
            "subscriptions": sorted(names), "window_s": window_s, "run": run_id}
        if isinstance(step, Unwatch) and before is not None:
            await delete_retirement(tx, before)
            logs.event("webhook_secret_watch_dropped", route=route.route,
                       secret_generation=gen)
        elif isinstance(step, Watch):
            await write_retirement(tx, None, RetirementRow(
                route=route.route, secret_generation=gen, state="watching",
                watch_since_us=step.since_us, check_at_us=step.check_at_us,
                evidence=evidence), now)
            checks.append(retire_check_spec(binding, catalog, route.route, gen,
                                            step.check_at_us, max_attempts=max_attempts))
        elif isinstance(step, Wait) and before is not None:
            if step.check_at_us != before.check_at_us:
                await write_retirement(tx, before, attrs.evolve(
                    before, check_at_us=step.check_at_us,
                    evidence={**evidence, "waiting": step.reason,
                              "last_previous_secret_receipt_us": last}), now)
            checks.append(retire_check_spec(binding, catalog, route.route, gen,
                                            step.check_at_us, max_attempts=max_attempts))
        elif isinstance(step, Retire) and before is not None:
            await write_retirement(tx, before, attrs.evolve(
                before, state="retired", retired_at_us=now,
                evidence={**evidence, "watch_since_us": before.watch_since_us}), now)
            await append_audit(tx, AuditEntry(
                audit_id=new_ulid(now), at_us=now, actor="subscription-reconciler",
                role="system", action="webhooks.previous_secret_retired",
                target_kind="webhook_route", target_id=route.route,
                reason=f"every subscription of the route is active under secret"
                f" generation {gen} and no delivery verified with the previous secret"
                f" arrived within the {window_s:g} s redelivery window",
                before=json.dumps({"state": "watching", "secret_generation": gen,
                                   "watch_since_us": before.watch_since_us}),
                after=json.dumps({"state": "retired", "secret_generation": gen,
                                  "retired_at_us": now})))
            logs.event("webhook_secret_retired", route=route.route,
                       secret_generation=gen, work_id=run_id)
    return checks
