"""The ``subscription_reconcile`` work family: bring a provider's webhook subscriptions to
what the Catalog and the L2 routes want (seed 9; read daemon/core/subscriptions.py first).

Theory of operation
-------------------
Two kinds of WorkItem, one lane per binding (``subscriptions:<binding>``), so one
binding's reconciliation runs one item at a time:

* a **run** lists the provider's subscriptions (the L1 ``subscription.list`` request),
  reads the observed rows (``remote_subscriptions``) and the desired ones
  (:func:`config.subscription_defs.desired_subscriptions`), asks the pure ``decide`` for the
  steps, and, with its finalization, queues one **step** item per create or delete (dedupe
  keys carry the generation, so a decision repeated by the next run is not doubled),
  records every row's health and reconciliation time, and queues the next run
  ``interval`` seconds later (keyed by time slot: two chains merge into one);
* a **step** is one provider call through DoOnce: a fenced dispatch-start checkpoint in
  ``effect_attempts`` (command id = the step's WorkItem id) commits before the request
  leaves; the one classified outcome and the row it moves commit with the finalization,
  only if the fence holds. A create whose outcome is unknown (a timeout) is reconciled by
  read-back on the next claim: the provider's list is searched for a subscription of the
  desired shape no row names, which is adopted (its cleanup token is lost: the provider
  hands it out only in the create answer); none found, it is created again. A delete is
  refused (dead, ``stale_generation``) unless the row it was decided for is still at the
  generation it was decided under (an orphan's: no row names it), checked in the
  checkpoint's own transaction.

Cleanup tokens are sealed with the token key (``daemon/core/token_bundle.py``) before they
are stored; secrets and tokens are never logged. No provider name appears here: every
request is an L1 template.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import attrs

from config.catalog import Catalog
from config.settings import BindingSettings, WebhookRoute
from config.subscription_defs import (
    DesiredSubscription,
    SubscriptionDefinition,
    desired_subscriptions,
)
from daemon.core.canonical import canonical_bytes
from daemon.core.effects import OperationContract, OutcomeClass, classify
from daemon.core.outcomes import DeadLetter, Outcome, RetryLater, Succeeded
from daemon.core.secret_retirement import Retire, RetirementView, Unwatch, Wait, Watch
from daemon.core.secret_retirement import decide as decide_retirement
from daemon.core.subscriptions import Create, Delete, Desired, Health, Observed, Remote, decide
from daemon.core.token_bundle import (
    BundleContext,
    BundleRefused,
    SealedBundle,
    SecretText,
    TokenBundle,
    TokenKey,
    open_bundle,
    seal,
)
from daemon.core.work import WorkSpec
from daemon.providers.executor import BoundedHttp, exchange
from daemon.providers.template import identity_text
from daemon.services import logs
from daemon.services.families import WorkContext
from storage.effect_values import AttemptDraft
from storage.effects import _INSERT_ATTEMPT_SQL, _attempt_params, record_outcome
from storage.idgen import new_ulid
from storage.port import AuditEntry, SqlTx
from storage.secret_retirements import (
    RetirementRow,
    delete_retirement,
    last_previous_secret_receipt,
    read_retirement,
    write_retirement,
)
from storage.subscriptions import (
    Retiring,
    Sealed,
    SubscriptionRow,
    delete_subscription,
    newest_secret_seen,
    read_subscription,
    read_subscriptions,
    write_subscription,
)
from storage.work_admin import append_audit, insert_work

SUBSCRIPTION_FAMILY: Final = "subscription_reconcile"
PAYLOAD_VERSION: Final = 1
# The status semantics of a subscription call (create, list, delete), stated here rather
# than assumed by L0: every 2xx applied, 429 not applied, every other 4xx refused; no
# replay proof (an unknown outcome is settled by listing the provider's subscriptions).
_CONTRACT: Final = OperationContract(
    accepted_statuses=frozenset(range(200, 300)), not_applied_statuses=frozenset({429}),
    rejected_statuses=frozenset(range(400, 500)) - {429})


class BadStep(ValueError):
    pass


@attrs.frozen(kw_only=True)
class SubscriptionPayload:
    """A run (``kind`` "run") or one step ("create" / "delete")."""

    kind: str
    binding: str
    chain: bool = True           # a run: queue the next run when done
    name: str | None = None      # a step: the row (None: an orphan's delete)
    generation: int | None = None  # create: the generation to create; delete: the fence
    provider_id: str = ""        # delete: the subscription to delete
    reason: str = ""

    def to_payload(self) -> str:
        return json.dumps({"version": PAYLOAD_VERSION, **attrs.asdict(self)}, sort_keys=True,
                          separators=(",", ":"))

    @classmethod
    def from_payload(cls, text: str) -> SubscriptionPayload:
        try:
            doc = json.loads(text)
        except ValueError:
            raise BadStep("payload: not JSON") from None
        if not isinstance(doc, dict) or doc.pop("version", None) != PAYLOAD_VERSION:
            raise BadStep(f"payload: not a version-{PAYLOAD_VERSION} subscription item")
        if doc.get("kind") not in ("run", "create", "delete"):
            raise BadStep(f"kind: {doc.get('kind')!r} is not run, create or delete")
        try:
            return cls(**doc)
        except TypeError as exc:
            raise BadStep(f"payload: {exc}") from None


def lane(binding_id: str) -> str:
    return f"subscriptions:{binding_id}"


def item_spec(binding: BindingSettings, catalog: Catalog, payload: SubscriptionPayload, *,
              key: str, run_after_us: int | None = None) -> WorkSpec:
    return WorkSpec(
        family=SUBSCRIPTION_FAMILY, org_id=binding.org_id,
        app_installation_id=binding.app_installation_id,
        subject_kind="subscription" if payload.kind != "run" else "binding",
        subject_id=payload.name or payload.provider_id or binding.binding_id,
        definition_ref=f"{binding.provider}/{binding.binding_id}",
        catalog_revision=catalog.revision, catalog_digest=catalog.digest,
        payload=payload.to_payload(),
        # Steps of one binding run one at a time, in order. Runs take no lane: a run only
        # reads and queues (a queued future run must not hold an operator's run, or the
        # steps it queues, behind it); concurrent runs decide the same keys.
        source_lane=lane(binding.binding_id) if payload.kind != "run" else None,
        run_after_us=run_after_us, dedupe_key=key)


def run_spec(binding: BindingSettings, catalog: Catalog, *, now_us: int,
             interval_s: float, chain: bool = True) -> WorkSpec:
    """A run now: a chain link keyed by its time slot (two chains merge), or a one-off
    (an operator's "reconcile now", its own key; it queues no next run)."""
    slot = now_us // max(1, int(interval_s * 1_000_000))
    key = (f"subs:run:{binding.binding_id}:{slot}" if chain
           else f"subs:run:{binding.binding_id}:now:{new_ulid(now_us)}")
    return item_spec(binding, catalog,
                     SubscriptionPayload(kind="run", binding=binding.binding_id, chain=chain),
                     key=key, run_after_us=now_us)


def _step_key(binding: str, step: Create | Delete, run_id: str) -> str:
    """A step's dedupe key: one per run (a run skips the names with a step still pending,
    and a step re-checks the row before it acts, so a repeated decision does nothing)."""
    if isinstance(step, Create):
        return f"subs:create:{binding}:{step.name}:{step.generation}:{run_id}"
    return f"subs:delete:{binding}:{step.provider_id}:{step.expected_generation}:{run_id}"


@attrs.frozen
class _Remote:
    remote: Remote
    raw_id: str


@attrs.define(eq=False)
class SubscriptionReconciler:
    catalog: Catalog
    routes: tuple[WebhookRoute, ...]
    http: BoundedHttp
    keys: Mapping[str, TokenKey] = attrs.field(factory=dict)
    seal_key_id: str | None = None
    interval_s: float = 300.0
    timeout_s: float = 10.0
    # Called after each run with (binding, rows by health, epoch seconds of the run).
    on_run: Callable[[str, dict[str, int], float], None] = lambda b, h, at: None

    # ---- what is wanted, what is there ----

    def desired(self, binding_id: str) -> list[DesiredSubscription]:
        return [d for d in desired_subscriptions(self.catalog.webhooks, self.routes)
                if d.binding_id == binding_id]

    def _definition(self, binding_id: str) -> SubscriptionDefinition | None:
        for route in self.routes:
            hook = self.catalog.webhooks.get(route.webhook)
            if route.binding_id == binding_id and hook is not None and hook.subscription:
                return hook.subscription
        return None

    def _headers(self, d: SubscriptionDefinition, binding: BindingSettings) -> dict[str, str]:
        headers = {"Accept": d.content_type}
        if binding.token is not None:
            headers[d.auth_header] = d.auth_prefix + binding.token.reveal()
        return headers

    async def _list(self, d: SubscriptionDefinition, binding: BindingSettings
                    ) -> list[_Remote] | Outcome:
        seen, doc = await exchange(self.http, d.list.method,
                                   binding.base_url.rstrip("/") + d.list.path.text,
                                   headers=self._headers(d, binding), body=None,
                                   timeout_s=binding.timeout)
        if seen.status != 200:
            return RetryLater("list_unavailable", "the subscription list did not answer 200"
                              f" ({seen.status or seen.detail})")
        items = d.list.items.find(doc)
        if not isinstance(items, list):
            return DeadLetter("bad_list", "the subscription list is not what L1 declares")
        out = []
        for item in items:
            pid = identity_text(d.list.item_id.find(item))
            version = d.list.item_payload_version.find(item)
            if pid is None or not isinstance(version, int):
                return DeadLetter("bad_list", "a listed subscription has no id or version")
            out.append(_Remote(Remote(
                provider_id=pid, resource=str(d.list.item_resource.find(item)),
                action=str(d.list.item_action.find(item)),
                url=str(d.list.item_url.find(item)), payload_version=version,
                active=d.list.item_active.find(item) is not False), pid))
        return out

    def _binding(self, name: str) -> BindingSettings | None:
        return self.catalog.binding(name)

    async def handle(self, ctx: WorkContext) -> Outcome:
        try:
            payload = SubscriptionPayload.from_payload(ctx.item.payload)
        except BadStep as exc:
            return DeadLetter("bad_payload", str(exc))
        binding = self._binding(payload.binding)
        definition = self._definition(payload.binding)
        if binding is None or definition is None:
            return DeadLetter("binding_drift", f"binding {payload.binding} has no route whose"
                              " L1 webhook contract declares a subscription")
        if payload.kind == "run":
            return await self._run(ctx, payload, binding, definition)
        if payload.kind == "create":
            return await self._create(ctx, payload, binding, definition)
        return await self._delete(ctx, payload, binding, definition)

    # ---- a run ----

    async def _run(self, ctx: WorkContext, p: SubscriptionPayload, binding: BindingSettings,
                   d: SubscriptionDefinition) -> Outcome:
        listed = await self._list(d, binding)
        if not isinstance(listed, list):
            return listed
        remote = [r.remote for r in listed]
        desired = self.desired(binding.binding_id)

        async def read(tx: SqlTx) -> tuple[list[SubscriptionRow], set[str], set[str]]:
            rows = await read_subscriptions(tx, binding.binding_id)
            seen = {r.name for r in rows if r.rotating and r.rotated_at_us is not None
                    and await newest_secret_seen(tx, r.route, r.rotated_at_us)}
            pending = await tx.fetchall(
                "SELECT subject_id FROM work_items WHERE family = ? AND subject_kind = ?"
                " AND source_lane = ? AND state IN ('pending', 'processing', 'retry')",
                (SUBSCRIPTION_FAMILY, "subscription", lane(binding.binding_id)))
            return rows, seen, {str(r[0]) for r in pending}

        rows, seen, pending = await ctx.store.db.transact(read, name="subscriptions.read",
                                                          write=False)
        urls = {x.url for x in desired} | {r.url for r in rows} | {
            r.public_url for r in self.routes if r.binding_id == binding.binding_id}
        steps = decide(
            [Desired(name=x.name, resource=x.resource, action=x.action,
                     payload_version=x.payload_version, url=x.url,
                     secret_generation=x.secret_generation) for x in desired],
            [Observed(name=r.name, provider_id=r.provider_id, generation=r.generation,
                      secret_generation=r.secret_generation, resource=r.resource,
                      action=r.action, url=r.url, payload_version=r.payload_version,
                      retiring=tuple(x.provider_id for x in r.retiring), rotating=r.rotating)
             for r in rows],
            remote, our_urls=urls, new_secret_seen=seen)
        shapes = {(x.resource, x.action, x.url, x.payload_version) for x in desired
                  if x.name in pending}
        by_id = {r.provider_id: r for r in remote}
        specs: list[WorkSpec] = []
        for step in steps:
            if isinstance(step, Health):
                continue
            if (step.name or getattr(step, "provider_id", "")) in pending:
                continue  # its earlier step is still pending: decided again after it
            if isinstance(step, Delete) and step.name is None:
                r = by_id[step.provider_id]
                if (r.resource, r.action, r.url, r.payload_version) in shapes:
                    # Maybe the subscription a pending create made (its outcome unknown):
                    # that step's read-back adopts it; never delete it under it.
                    continue
            specs.append(item_spec(binding, self.catalog, SubscriptionPayload(
                kind="create" if isinstance(step, Create) else "delete",
                binding=binding.binding_id, name=step.name,
                generation=step.generation if isinstance(step, Create)
                else step.expected_generation,
                provider_id="" if isinstance(step, Create) else step.provider_id,
                reason=step.reason), key=_step_key(binding.binding_id, step,
                                                   ctx.item.work_id)))
        now = ctx.clock.now_us()
        health = {r.name: ("missing" if r.provider_id not in by_id else
                           "active" if by_id[r.provider_id].active else "disabled")
                  for r in rows}
        nxt = (run_spec(binding, self.catalog, now_us=now + int(self.interval_s * 1e6),
                        interval_s=self.interval_s) if p.chain else None)

        read_versions = {r.name: r.row_version for r in rows}
        wanted = {x.name for x in desired}

        async def write(tx: SqlTx) -> None:
            for before in await read_subscriptions(tx, binding.binding_id):
                if before.name not in wanted and not {
                        before.provider_id, *(x.provider_id for x in before.retiring)
                        } & set(by_id) and read_versions.get(before.name) == before.row_version:
                    # Undesired and nothing of it left at the provider: the row goes.
                    await delete_subscription(tx, before)
                    continue
                # Judged against the row as it is now: a step may have moved it since.
                live = by_id.get(before.provider_id)
                if live is not None:
                    state = "active" if live.active else "disabled"
                elif read_versions.get(before.name) == before.row_version:
                    state = "missing"
                else:
                    state = before.health
                await write_subscription(tx, before, attrs.evolve(
                    before, health=state, last_reconciled_at_us=now), now)
            checks = await self._retire_previous_secrets(tx, ctx, binding, desired, remote,
                                                         now)
            await insert_work(tx, [*specs, *([nxt] if nxt else []), *checks], now)

        ctx.on_finalize(write)
        counts = {h: sum(1 for v in health.values() if v == h)
                  for h in ("active", "disabled", "missing")}
        self.on_run(binding.binding_id, counts, now / 1e6)
        logs.event("subscriptions_reconciled", work_id=ctx.item.work_id,
                   binding=binding.binding_id, steps=len(specs),
                   missing=sum(1 for v in health.values() if v == "missing"),
                   disabled=sum(1 for v in health.values() if v == "disabled"))
        return Succeeded(f"{len(specs)} subscription steps queued")

    # ---- a rotated-out secret retires itself ----

    async def _retire_previous_secrets(
            self, tx: SqlTx, ctx: WorkContext, binding: BindingSettings,
            desired: Sequence[DesiredSubscription], remote: Sequence[Remote], now: int
    ) -> list[WorkSpec]:
        """In the run's finalization: for each route of the binding with a previous
        secret, the pure retirement decision (daemon/core/secret_retirement.py) on the
        rows as they are now and what this run listed; returns the runs to queue at the
        time to look again."""
        by_id = {r.provider_id: r for r in remote}
        rows = await read_subscriptions(tx, binding.binding_id)
        checks: list[WorkSpec] = []
        for route in self.routes:
            hook = self.catalog.webhooks.get(route.webhook)
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
                last = await last_previous_secret_receipt(tx, route.route, now - window,
                                                          window)
            step = decide_retirement(RetirementView(
                has_previous=route.previous_secret is not None,
                subscriptions_current=current, window_us=window,
                state=before.state if before else None,
                watch_since_us=before.watch_since_us if before else None,
                last_previous_receipt_us=last), now)
            evidence: dict[str, object] = {
                "subscriptions": sorted(names), "window_s": window_s,
                "run": ctx.item.work_id}
            if isinstance(step, Unwatch) and before is not None:
                await delete_retirement(tx, before)
                logs.event("webhook_secret_watch_dropped", route=route.route,
                           secret_generation=gen)
            elif isinstance(step, Watch):
                await write_retirement(tx, None, RetirementRow(
                    route=route.route, secret_generation=gen, state="watching",
                    watch_since_us=step.since_us, check_at_us=step.check_at_us,
                    evidence=evidence), now)
                checks.append(self._retire_check(binding, route.route, gen,
                                                 step.check_at_us))
            elif isinstance(step, Wait) and before is not None:
                if step.check_at_us != before.check_at_us:
                    await write_retirement(tx, before, attrs.evolve(
                        before, check_at_us=step.check_at_us,
                        evidence={**evidence, "waiting": step.reason,
                                  "last_previous_secret_receipt_us": last}), now)
                checks.append(self._retire_check(binding, route.route, gen,
                                                 step.check_at_us))
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
                           secret_generation=gen, work_id=ctx.item.work_id)
        return checks

    def _retire_check(self, binding: BindingSettings, route: str, generation: int,
                      at_us: int) -> WorkSpec:
        """A one-off run at the time a watch may retire its secret (one per time)."""
        return item_spec(binding, self.catalog, SubscriptionPayload(
            kind="run", binding=binding.binding_id, chain=False),
            key=f"subs:run:{binding.binding_id}:retire:{route}:{generation}:{at_us}",
            run_after_us=at_us)

    # ---- one step: the DoOnce shape ----

    async def _checkpoint(self, ctx: WorkContext, method: str, path: str, body: bytes,
                          evidence: dict[str, Any],
                          guard: Any = None) -> str | DeadLetter:
        draft = AttemptDraft(
            command_id=ctx.item.work_id, method=method, target_path=path,
            safe_headers="{}", body_sha256="sha256:" + hashlib.sha256(body).hexdigest(),
            idempotency_key=ctx.item.dedupe_key or ctx.item.work_id,
            pre_dispatch_evidence=canonical_bytes(evidence).decode(),
            give_up_after_us=int(self.timeout_s * 1_000_000))
        now = ctx.clock.now_us()

        async def body_(tx: SqlTx) -> str | DeadLetter:
            if guard is not None:
                refusal: DeadLetter | None = await guard(tx)
                if refusal is not None:
                    return refusal
            attempt_id = new_ulid(now)
            await tx.execute(_INSERT_ATTEMPT_SQL, _attempt_params(attempt_id, ctx.fence, draft,
                                                                  now))
            return attempt_id

        result: str | DeadLetter = await ctx.fenced(body_, name="subscriptions.checkpoint")
        return result

    def _record(self, ctx: WorkContext, attempt_id: str, outcome: OutcomeClass,
                evidence: str, status: int | None, failure: str) -> None:
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            await record_outcome(tx, attempt_id, outcome=outcome.value, evidence=evidence,
                                 response_status=status, provider_evidence={},
                                 failure_class=failure, gave_up_at_us=now, now_us=now)

        ctx.on_finalize(write)

    async def _unresolved(self, ctx: WorkContext) -> list[str]:
        """This step's earlier attempts whose outcome is unknown (a timeout, or a claim
        that died mid-dispatch): to be reconciled by read-back before anything is sent."""
        async def read(tx: SqlTx) -> list[str]:
            rows = await tx.fetchall(
                "SELECT attempt_id FROM effect_attempts WHERE command_id = ?"
                " AND disposition IS NULL AND (outcome IS NULL OR outcome = ?)"
                " AND (failure_class IS NULL OR failure_class NOT LIKE ?)",
                (ctx.item.work_id, "OUTCOME_UNKNOWN", "readback_%"))
            return [str(r[0]) for r in rows]

        return await ctx.store.db.transact(read, name="subscriptions.unresolved", write=False)

    def _resolve_unknown(self, ctx: WorkContext, attempts: Sequence[str], applied: bool
                         ) -> None:
        now = ctx.clock.now_us()
        evidence = "proven_applied" if applied else "proven_absent"

        async def write(tx: SqlTx) -> None:
            for attempt_id in attempts:
                await tx.execute(
                    "UPDATE effect_attempts SET outcome = ?, evidence = ?, failure_class = ?,"
                    " finished_at_us = COALESCE(finished_at_us, ?),"
                    " row_version = row_version + 1 WHERE attempt_id = ?",
                    ("OUTCOME_UNKNOWN", evidence, f"readback_{evidence}", now, attempt_id))

        ctx.on_finalize(write)

    def _seal(self, name: str, generation: int, token: str | None) -> Sealed | None:
        key = self.keys.get(self.seal_key_id or "")
        if token is None or key is None:
            return None
        sealed = seal(TokenBundle(access_token=SecretText(token)), key,
                      BundleContext(f"subscription:{name}", generation, 0))
        return Sealed(sealed.key_id, sealed.nonce + sealed.ciphertext)

    def open_cleanup(self, name: str, generation: int, sealed: Sealed) -> str | None:
        """A stored cleanup token in the clear (None when its key is gone or it fails
        authentication: the row or generation it was sealed for is not this one)."""
        try:
            return open_bundle(SealedBundle(sealed.key_id, sealed.blob[:12], sealed.blob[12:]),
                               self.keys, BundleContext(f"subscription:{name}", generation, 0)
                               ).access_token.reveal()
        except BundleRefused:
            return None

    # ---- create ----

    async def _create(self, ctx: WorkContext, p: SubscriptionPayload, binding: BindingSettings,
                      d: SubscriptionDefinition) -> Outcome:
        want = next((x for x in self.desired(binding.binding_id) if x.name == p.name), None)
        route = next((r for r in self.routes if want and r.route == want.route), None)
        if want is None or route is None or p.generation is None:
            return Succeeded(f"{p.name} is no longer desired")
        if route.secret is None or binding.token is None:
            return RetryLater("no_credentials", f"route {route.route} has no secret or"
                              f" binding {binding.binding_id} no token")
        generation = p.generation

        async def read_row(tx: SqlTx) -> SubscriptionRow | None:
            return await read_subscription(tx, want.name)

        row = await ctx.store.db.transact(read_row, name="subscriptions.row", write=False)
        if row is not None and row.generation >= generation:
            return Succeeded(f"{want.name} is already at generation {row.generation}")
        unresolved = await self._unresolved(ctx)
        if unresolved:
            listed = await self._list(d, binding)
            if not isinstance(listed, list):
                return listed

            async def referenced(tx: SqlTx) -> set[str]:
                rows = await read_subscriptions(tx, binding.binding_id)
                return {pid for r in rows for pid in (r.provider_id,
                                                      *(x.provider_id for x in r.retiring))}

            named = await ctx.store.db.transact(referenced, name="subscriptions.refs",
                                                write=False)
            match = next((x for x in listed if x.raw_id not in named and
                          (x.remote.resource, x.remote.action, x.remote.url,
                           x.remote.payload_version) ==
                          (want.resource, want.action, want.url, want.payload_version)), None)
            self._resolve_unknown(ctx, unresolved, applied=match is not None)
            if match is not None:
                self._finish_create(ctx, p, want, row, match.raw_id, None,
                                    "adopted by read-back after an unknown create outcome")
                logs.event("subscription_adopted", work_id=ctx.item.work_id,
                           subscription=want.name,
                           generation=generation)
                return Succeeded(f"{want.name}: the unknown create proven applied by"
                                 " read-back")
        body = canonical_bytes(d.create.body.render_values({
            "$resource": want.resource, "$action": want.action, "$url": want.url,
            "$secret": route.secret.reveal(), "$payload_version": want.payload_version}))
        path = d.create.path.text
        attempt = await self._checkpoint(ctx, d.create.method, path, body, {
            "name": want.name, "generation": generation, "reason": p.reason,
            "secret_generation": want.secret_generation})
        if isinstance(attempt, DeadLetter):
            return attempt
        headers = {**self._headers(d, binding), "Content-Type": d.content_type}
        seen, doc = await exchange(self.http, d.create.method,
                                   binding.base_url.rstrip("/") + path, headers=headers,
                                   body=body, timeout_s=self.timeout_s)
        c = classify(_CONTRACT, seen)
        provider_id = identity_text(d.create.id.find(doc))
        if c.outcome is OutcomeClass.ACCEPTED and provider_id is None:
            c = attrs.evolve(c, outcome=OutcomeClass.OUTCOME_UNKNOWN, failure_class="no_id")
        self._record(ctx, attempt, c.outcome, c.evidence.value, seen.status, c.failure_class)
        if c.outcome is OutcomeClass.ACCEPTED:
            assert provider_id is not None
            token = (d.create.cleanup_token.find(doc) if d.create.cleanup_token else None)
            self._finish_create(ctx, p, want, row, provider_id,
                                token if isinstance(token, str) else None, p.reason)
            logs.event("subscription_created", work_id=ctx.item.work_id, subscription=want.name,
                       generation=generation, reason=p.reason)
            return Succeeded(f"{want.name} created at generation {generation} ({p.reason})")
        self._note(ctx, want.name, "create_" + c.outcome.value.lower(), c.failure_class)
        if c.outcome is OutcomeClass.REJECTED:
            return DeadLetter(f"create_{seen.status}", f"the provider refused to create"
                              f" {want.name} (HTTP {seen.status})")
        if c.outcome is OutcomeClass.OUTCOME_UNKNOWN:
            return RetryLater("outcome_unknown", f"the create of {want.name} may have been"
                              " applied; the next claim reads the list back")
        return RetryLater(c.failure_class or "not_applied",
                          f"the create of {want.name} was not applied", c.retry_after_s)

    def _finish_create(self, ctx: WorkContext, p: SubscriptionPayload,
                       want: DesiredSubscription, before: SubscriptionRow | None,
                       provider_id: str, cleanup: str | None, note: str) -> None:
        assert p.generation is not None
        generation = p.generation
        sealed = self._seal(want.name, generation, cleanup)
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            row = await read_subscription(tx, want.name)
            retiring: tuple[Retiring, ...] = row.retiring if row else ()
            rotating = bool(row and row.rotating)
            if row is not None and p.reason in ("drifted", "secret_rotation"):
                # The one replaced stays until its successor is proven, then is deleted.
                retiring = (*retiring, Retiring(provider_id=row.provider_id,
                                                generation=row.generation,
                                                cleanup=row.cleanup))
                rotating = rotating or p.reason == "secret_rotation"
            after = SubscriptionRow(
                name=want.name, binding_id=want.binding_id, route=want.route,
                resource=want.resource, action=want.action, url=want.url,
                payload_version=want.payload_version, provider_id=provider_id,
                generation=generation, secret_generation=want.secret_generation,
                health="active", cleanup=sealed, retiring=retiring, rotating=rotating,
                rotated_at_us=now if p.reason == "secret_rotation" else (
                    row.rotated_at_us if row else None),
                last_reconciled_at_us=now, last_outcome="created",
                last_reason=note if sealed or cleanup is None else note
                + " (cleanup token not kept: no token key)")
            await write_subscription(tx, row, after, now)

        ctx.on_finalize(write)

    def _note(self, ctx: WorkContext, name: str | None, outcome: str, reason: str) -> None:
        if name is None:
            return
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            row = await read_subscription(tx, name)
            if row is not None:
                await write_subscription(tx, row, attrs.evolve(
                    row, last_outcome=outcome[:32], last_reason=reason[:200]), now)

        ctx.on_finalize(write)

    # ---- delete ----

    async def _delete(self, ctx: WorkContext, p: SubscriptionPayload, binding: BindingSettings,
                      d: SubscriptionDefinition) -> Outcome:
        pid = p.provider_id

        async def fence(tx: SqlTx) -> DeadLetter | None:
            rows = await read_subscriptions(tx, binding.binding_id)
            if p.name is not None:
                row = next((r for r in rows if r.name == p.name), None)
                current = row.generation if row is not None else None
            else:
                current = next((r.generation for r in rows if pid == r.provider_id
                                or pid in {x.provider_id for x in r.retiring}), None)
            if current != p.generation:
                return DeadLetter("stale_generation", f"the delete of subscription {pid} was"
                                  f" decided under generation {p.generation}; the row is at"
                                  f" {current}: refused")
            return None

        unresolved = await self._unresolved(ctx)
        if unresolved:
            listed = await self._list(d, binding)
            if not isinstance(listed, list):
                return listed
            gone = all(x.raw_id != pid for x in listed)
            self._resolve_unknown(ctx, unresolved, applied=gone)
            if gone:
                self._finish_delete(ctx, p)
                return Succeeded(f"subscription {pid} proven deleted by read-back")
        path = d.delete.path.render(remote_id=pid)
        attempt = await self._checkpoint(ctx, d.delete.method, path, b"", {
            "name": p.name, "provider_id": pid, "expected_generation": p.generation,
            "reason": p.reason}, guard=fence)
        if isinstance(attempt, DeadLetter):
            logs.warn("subscription_delete_refused", work_id=ctx.item.work_id,
                      provider_id=pid, expected_generation=p.generation)
            self._note(ctx, p.name, "cleanup_refused", attempt.failure_class)
            return attempt
        headers = self._headers(d, binding)
        if binding.token is None and d.delete.cleanup_header:
            token = await self._cleanup_token(ctx, p)
            if token is not None:
                headers[d.delete.cleanup_header] = token
        seen, _ = await exchange(self.http, d.delete.method,
                                 binding.base_url.rstrip("/") + path, headers=headers,
                                 body=None, timeout_s=self.timeout_s)
        c = classify(_CONTRACT, seen)
        if seen.status in d.delete.absent_statuses:
            c = attrs.evolve(c, outcome=OutcomeClass.ACCEPTED, failure_class="already_absent")
        self._record(ctx, attempt, c.outcome, c.evidence.value, seen.status, c.failure_class)
        if c.outcome is OutcomeClass.ACCEPTED:
            self._finish_delete(ctx, p)
            logs.event("subscription_deleted", work_id=ctx.item.work_id, provider_id=pid,
                       reason=p.reason)
            return Succeeded(f"subscription {pid} deleted ({p.reason})")
        self._note(ctx, p.name, "delete_" + c.outcome.value.lower(), c.failure_class)
        if c.outcome is OutcomeClass.REJECTED:
            return DeadLetter(f"delete_{seen.status}", f"the provider refused to delete"
                              f" subscription {pid} (HTTP {seen.status})")
        return RetryLater(c.failure_class or "not_applied",
                          f"the delete of subscription {pid} did not complete",
                          c.retry_after_s)

    async def _cleanup_token(self, ctx: WorkContext, p: SubscriptionPayload) -> str | None:
        if p.name is None:
            return None

        async def read(tx: SqlTx) -> SubscriptionRow | None:
            return await read_subscription(tx, p.name or "")

        row = await ctx.store.db.transact(read, name="subscriptions.row", write=False)
        if row is None:
            return None
        if row.provider_id == p.provider_id and row.cleanup is not None:
            return self.open_cleanup(row.name, row.generation, row.cleanup)
        old = next((x for x in row.retiring if x.provider_id == p.provider_id), None)
        if old is not None and old.cleanup is not None:
            return self.open_cleanup(row.name, old.generation, old.cleanup)
        return None

    def _finish_delete(self, ctx: WorkContext, p: SubscriptionPayload) -> None:
        if p.name is None:
            return
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            row = await read_subscription(tx, p.name or "")
            if row is None:
                return
            retiring = tuple(x for x in row.retiring if x.provider_id != p.provider_id)
            if row.provider_id == p.provider_id and not retiring:
                await delete_subscription(tx, row)
                return
            await write_subscription(tx, row, attrs.evolve(
                row, retiring=retiring, rotating=row.rotating and bool(retiring),
                last_outcome="retired" if p.reason in ("rotated", "replaced") else "deleted",
                last_reason=f"subscription {p.provider_id} deleted ({p.reason})"), now)

        ctx.on_finalize(write)


def subscription_handler(reconciler: SubscriptionReconciler) -> Any:
    async def handle(ctx: WorkContext) -> Outcome:
        return await reconciler.handle(ctx)

    return handle


def bindings_with_subscriptions(catalog: Catalog, routes: Sequence[WebhookRoute]
                                ) -> list[BindingSettings]:
    """The bindings some route wants subscriptions for (by id)."""
    names = sorted({d.binding_id for d in desired_subscriptions(catalog.webhooks, routes)})
    return [b for b in (catalog.binding(n) for n in names) if b is not None]


async def start_chains(store: Any, catalog: Catalog, routes: Sequence[WebhookRoute],
                       now_us: int, interval_s: float = 300.0) -> int:
    """At replica start: each binding's run chain (keyed by time slot, so replicas
    starting together, or a chain already queued for this slot, make one)."""
    specs = [run_spec(b, catalog, now_us=now_us, interval_s=interval_s)
             for b in bindings_with_subscriptions(catalog, routes)]
    if specs:
        await store.work_enqueue(specs, now_us)
    return len(specs)


class NoSuchBinding(LookupError):
    pass


async def reconcile_now(store: Any, catalog: Catalog, routes: Sequence[WebhookRoute],
                        binding_id: str, *, actor: str, role: str, reason: str,
                        now_us: int) -> str:
    """An operator's "reconcile now": one run queued at once (it queues no next run; the
    chain goes on), audited in the same transaction. Returns the run's WorkItem id."""
    binding = next((b for b in bindings_with_subscriptions(catalog, routes)
                    if b.binding_id == binding_id), None)
    if binding is None:
        raise NoSuchBinding(f"binding {binding_id!r} has no route with subscriptions")
    spec = run_spec(binding, catalog, now_us=now_us, interval_s=300.0, chain=False)

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
