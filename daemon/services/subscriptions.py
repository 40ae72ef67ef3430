"""The ``subscription_reconcile`` work family: bring a provider's webhook subscriptions to
what the Catalog and the L2 routes want (seed 9; read daemon/core/subscriptions.py first).

Theory of operation
-------------------
Two kinds of WorkItem (``daemon/services/subscription_items.py``), one lane per binding
(``subscriptions:<binding>``), so one binding's steps run one at a time:

* a **run** takes the current durable binding generation's token, lists the provider's
  subscriptions (the L1 ``subscription.list`` request, on the binding's quota), reads the
  observed rows (``remote_subscriptions``) and the desired ones
  (:func:`config.subscription_defs.desired_subscriptions`), asks the pure ``decide`` for
  the steps, and, with its finalization, queues one **step** item per create or delete,
  each pinned to that binding generation (dedupe keys carry the row generation, so a
  decision repeated by the next run is not doubled), records every row's health and
  reconciliation time, and queues the next run ``interval`` seconds later (keyed by time
  slot: two chains merge into one);
* a **step** is one provider call under the effect contract
  (``daemon/services/subscription_calls.py``: the credential service with the pinned
  generation, the quota, a DoOnce checkpoint whose statement re-checks the pins). The one
  classified outcome and the row it moves commit with the finalization, only if the
  fence holds. A step whose earlier attempt's outcome is unknown sends nothing, nor
  lists, until the declared in-flight window has passed (``decide_step``); then it lists:
  a subscription of the desired shape no row names is our create, adopted (disposition
  ``proven_applied``; its cleanup token is lost: the provider hands it out only in the
  create answer); none, the attempt is disposed ``proven_absent`` and the create is sent
  again. A delete is refused (dead, ``stale_generation``) unless the row it was decided
  for is still at the generation it was decided under (an orphan's: no row names it),
  checked in the checkpoint's own transaction.
* one subscription's creates are **one effect**, whichever step made each attempt
  (``create_kin``, issue 22): a create that ended (dead, cancelled) with an attempt
  unresolved still counts as in flight (``in_flight``). A run protects the subscription
  it may have made from the orphan delete and queues the create again; that step claims
  with the earlier unresolved attempts (waits out their window, reads back, adopts or
  disposes) and its checkpoint's statement refuses while any of them is unresolved. One
  sent under another binding generation is held for an operator: the run decides
  nothing for that subscription.

Cleanup tokens are sealed with the token key (``daemon/core/token_bundle.py``) before they
are stored; secrets and tokens are never logged. No provider name appears here: every
request is an L1 template.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
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
from daemon.core.outcomes import DeadLetter, Deferred, Outcome, RetryLater, Succeeded
from daemon.core.principals import BindingState
from daemon.core.subscriptions import (
    Create,
    Delete,
    Desired,
    Health,
    InFlight,
    LaneStep,
    Observed,
    ReadBack,
    Send,
    StepAttempt,
    StepClaim,
    WaitWindow,
    decide,
    decide_step,
    in_flight,
)
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
from daemon.providers.template import identity_text
from daemon.services import logs
from daemon.services.credentials import definitive
from daemon.services.families import WorkContext
from daemon.services.subscription_calls import Sent, SubscriptionCalls, client_deadline_s
from daemon.services.subscription_items import (
    SUBSCRIPTION_FAMILY,
    BadStep,
    SubscriptionPayload,
    create_kin,
    item_spec,
    lane,
    run_spec,
    step_key,
)
from daemon.services.subscription_retirement import retire_previous_secrets
from daemon.services.token_refresh import AccessToken, TokenUnavailable
from storage.effects import subjects_in_doubt
from storage.port import SqlTx
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
from storage.work_admin import insert_work

__all__ = ["SUBSCRIPTION_FAMILY", "SubscriptionPayload", "SubscriptionReconciler",
           "item_spec", "run_spec", "subscription_handler"]

# The status semantics of a subscription call (create, list, delete), stated here rather
# than assumed by L0: every 2xx applied, 429 not applied, every other 4xx refused; no
# replay proof (an unknown outcome is settled by listing the provider's subscriptions).
_CONTRACT: Final = OperationContract(
    accepted_statuses=frozenset(range(200, 300)), not_applied_statuses=frozenset({429}),
    rejected_statuses=frozenset(range(400, 500)) - {429})


def pinned_generation(evidence: str) -> int | None:
    """The binding generation an attempt's checkpoint pinned (its pre-dispatch evidence;
    None when it carried none, or the evidence cannot be read)."""
    try:
        doc = json.loads(evidence)
    except ValueError:
        return None
    value = doc.get("binding_generation") if isinstance(doc, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@attrs.frozen
class _Pin:
    """A step's pinned binding generation against the durable binding now."""

    generation: int | None
    current: int | None
    connected: bool

    @property
    def holds(self) -> bool:
        return self.generation is not None and self.generation == self.current \
            and self.connected


@attrs.define(eq=False)
class SubscriptionReconciler:
    catalog: Catalog
    routes: tuple[WebhookRoute, ...]
    # The one way out: credentials, quota, the effect journal (subscription_calls.py).
    calls: SubscriptionCalls
    # The family's configured max_attempts (``[families.subscription_reconcile]``): every
    # run, step and retirement check this reconciler queues carries it.
    max_attempts: int = attrs.field(kw_only=True)
    keys: Mapping[str, TokenKey] = attrs.field(factory=dict)
    seal_key_id: str | None = None
    interval_s: float = 300.0
    # Called after each run with (binding, desired subscriptions by health, epoch seconds
    # of the run).
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
        facts = await ctx.store.binding_get(binding.binding_id)
        if facts is None:
            return RetryLater("no_binding_row", f"binding {binding.binding_id} has no durable"
                              " row yet (made when a replica starts)")
        if facts.state is not BindingState.CONNECTED:
            self._chain_only(ctx, p, binding)
            return Succeeded(f"binding {binding.binding_id} is {facts.state.value}: nothing"
                             " listed; the next run looks again")
        generation = facts.generation
        access = await self.calls.token(ctx, binding, generation)
        if isinstance(access, TokenUnavailable):
            return self.calls.no_token(ctx, access)
        listed = await self.calls.list_subscriptions(ctx, d, binding, generation, access)
        if not isinstance(listed, list):
            return listed
        remote = [r.remote for r in listed]
        desired = self.desired(binding.binding_id)

        async def read(tx: SqlTx) -> tuple[list[SubscriptionRow], set[str], InFlight]:
            rows = await read_subscriptions(tx, binding.binding_id)
            seen = {r.name for r in rows if r.rotating and r.rotated_at_us is not None
                    and await newest_secret_seen(tx, r.route, r.rotated_at_us)}
            live = await tx.fetchall(
                "SELECT subject_id, state FROM work_items WHERE family = ? AND subject_kind = ?"
                " AND source_lane = ? AND state IN ('pending', 'processing', 'retry')",
                (SUBSCRIPTION_FAMILY, "subscription", lane(binding.binding_id)))
            doubt = await subjects_in_doubt(tx, create_kin(binding.binding_id, ""))
            return rows, seen, in_flight(
                [LaneStep(subject=str(r[0]), create=False, state=str(r[1]),
                          unresolved=False) for r in live]
                + [LaneStep(subject=name, create=True, state=state, unresolved=True,
                            foreign=pinned_generation(evidence) != generation)
                   for name, state, evidence in doubt])

        rows, seen, flight = await ctx.store.db.transact(read, name="subscriptions.read",
                                                         write=False)
        # Held: an earlier create's unknown attempt under another binding identity waits
        # for an operator's disposition; nothing is decided for it meanwhile.
        pending = flight.busy | flight.held
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
        # A create queued, running, or ended with its outcome unknown (issue 22) may have
        # made a subscription no row names yet: never deleted as an orphan under it.
        shapes = {(x.resource, x.action, x.url, x.payload_version) for x in desired
                  if x.name in pending | flight.in_doubt}
        if flight.held:
            logs.warn("subscription_create_held", work_id=ctx.item.work_id,
                      binding=binding.binding_id, subscriptions=",".join(sorted(flight.held)))
        by_id = {r.provider_id: r for r in remote}
        specs: list[WorkSpec] = []
        for step in steps:
            if isinstance(step, Health):
                continue
            if (step.name or getattr(step, "provider_id", "")) in pending:
                continue  # its earlier step is still pending: decided again after it
            # A create in doubt is queued again: its step claims with the earlier unresolved
            # attempts (create_kin), so it waits out their window and reads them back
            # before anything is sent (its checkpoint's statement refuses it otherwise).
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
                reason=step.reason, binding_generation=generation),
                key=step_key(binding.binding_id, step, ctx.item.work_id),
                max_attempts=self.max_attempts))
        now = ctx.clock.now_us()
        # Every desired subscription, and every row: one with no row, or whose id the
        # provider no longer lists, is missing.
        named = {r.name: r for r in rows}
        health = {**{x.name: "missing" for x in desired if x.name not in named},
                  **{r.name: ("missing" if r.provider_id not in by_id else
                              "active" if by_id[r.provider_id].active else "disabled")
                     for r in rows}}
        nxt = (run_spec(binding, self.catalog, now_us=now + int(self.interval_s * 1e6),
                        interval_s=self.interval_s, max_attempts=self.max_attempts)
               if p.chain else None)

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
            checks = await retire_previous_secrets(
                tx, run_id=ctx.item.work_id, catalog=self.catalog, routes=self.routes,
                binding=binding, desired=desired, remote=remote, now=now,
                max_attempts=self.max_attempts)
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


    def _chain_only(self, ctx: WorkContext, p: SubscriptionPayload,
                    binding: BindingSettings) -> None:
        """A run that lists nothing still queues the next one (with its finalization)."""
        if not p.chain:
            return
        now = ctx.clock.now_us()
        nxt = run_spec(binding, self.catalog, now_us=now + int(self.interval_s * 1e6),
                       interval_s=self.interval_s, max_attempts=self.max_attempts)

        async def write(tx: SqlTx) -> None:
            await insert_work(tx, [nxt], now)

        ctx.on_finalize(write)

    # ---- one step: its pins and its in-flight window ----

    async def _pin(self, ctx: WorkContext, binding: BindingSettings,
                   p: SubscriptionPayload) -> _Pin:
        facts = await ctx.store.binding_get(binding.binding_id)
        return _Pin(p.binding_generation, None if facts is None else facts.generation,
                    facts is not None and facts.state is BindingState.CONNECTED)

    async def _claim(self, ctx: WorkContext, binding: BindingSettings,
                     d: SubscriptionDefinition) -> StepClaim:
        """Send, wait out the in-flight window, or read back, judged by this step's own
        attempts."""
        own, _ = await self.calls.attempts(ctx)
        return self._decide(ctx, binding, d, own)

    @staticmethod
    def _decide(ctx: WorkContext, binding: BindingSettings, d: SubscriptionDefinition,
                attempts: list[StepAttempt]) -> StepClaim:
        """Send, wait out the in-flight window, or read back (daemon/core/subscriptions.py).
        L2's binding may lengthen L1's window and skew, never shorten them."""
        return decide_step(
            attempts,
            max_in_flight_us=int(max(d.max_in_flight_s, binding.max_in_flight) * 1e6),
            clock_skew_us=int(max(d.max_clock_skew_s, binding.max_clock_skew) * 1e6),
            client_deadline_us=int(client_deadline_s(binding) * 1e6),
            now_us=ctx.clock.now_us())

    @staticmethod
    def _stale(p: SubscriptionPayload, pin: _Pin, claim: StepClaim, what: str) -> Outcome:
        """A step whose pinned binding generation no longer holds sends nothing."""
        now = (f"at generation {pin.current}" if pin.connected
               else "disconnected" if pin.current is not None else "gone")
        if isinstance(claim, WaitWindow | ReadBack):
            return DeadLetter("binding_generation", f"the {what} was decided under binding"
                              f" generation {p.binding_generation}; the binding is {now},"
                              " and an attempt of it is unresolved: it cannot be read back"
                              " with another identity; operator disposition needed")
        return Succeeded(f"{what}: not sent; decided under binding generation"
                         f" {p.binding_generation}, the binding is {now}; the next run"
                         " decides again")

    @staticmethod
    def _waiting(claim: WaitWindow, what: str) -> Deferred:
        return Deferred("outcome_unknown", claim.until_us, f"the earlier {what} may still"
                        " be applied: nothing is sent, nor listed, before its in-flight"
                        " window has passed")

    # ---- create ----

    async def _create(self, ctx: WorkContext, p: SubscriptionPayload, binding: BindingSettings,
                      d: SubscriptionDefinition) -> Outcome:
        want = next((x for x in self.desired(binding.binding_id) if x.name == p.name), None)
        route = next((r for r in self.routes if want and r.route == want.route), None)
        if want is None or route is None or p.generation is None:
            return Succeeded(f"{p.name} is no longer desired")
        if route.secret is None:
            return RetryLater("no_credentials", f"route {route.route} has no secret")
        generation = p.generation

        async def read_row(tx: SqlTx) -> SubscriptionRow | None:
            return await read_subscription(tx, want.name)

        row = await ctx.store.db.transact(read_row, name="subscriptions.row", write=False)
        if row is not None and row.generation >= generation:
            return Succeeded(f"{want.name} is already at generation {row.generation}")
        what = f"create of {want.name}"
        pin = await self._pin(ctx, binding, p)
        if not pin.holds:  # judged by its own attempts: an earlier step's are not its own
            return self._stale(p, pin, await self._claim(ctx, binding, d), what)
        # One subscription's creates are one effect, whichever step made each attempt: a
        # create that ended (dead, cancelled) with its outcome unknown holds this one
        # until its window has passed and the list has been read back (issue 22).
        # One read: this step's attempts with the kin's unresolved ones (they count as its
        # own), and whether one of the kin's was sent under another binding generation.
        kin = create_kin(binding.binding_id, want.name)
        attempts, others = await self.calls.attempts(ctx, kin)
        foreign = next((a.attempt_id for a in others
                        if pinned_generation(a.pre_dispatch_evidence) != p.binding_generation),
                       None)
        if foreign:
            return DeadLetter("earlier_create_unresolved", f"an earlier {what} (attempt"
                              f" {foreign}) may have been applied under another binding"
                              " generation: a list now cannot read it back; operator"
                              " disposition needed before it is created again")
        claim = self._decide(ctx, binding, d, attempts)
        if isinstance(claim, WaitWindow):
            return self._waiting(claim, what)
        assert p.binding_generation is not None
        access = await self.calls.token(ctx, binding, p.binding_generation)
        if isinstance(access, TokenUnavailable):
            return self.calls.no_token(ctx, access)
        if isinstance(claim, ReadBack):
            listed = await self.calls.list_subscriptions(ctx, d, binding,
                                                         p.binding_generation, access)
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
            if match is not None:
                self.calls.dispose_applied(ctx, claim.attempt_ids, "the list shows a"
                                           " subscription of the desired shape no row names")
                self._finish_create(ctx, p, want, row, match.raw_id, None,
                                    "adopted by read-back after an unknown create outcome")
                logs.event("subscription_adopted", work_id=ctx.item.work_id,
                           subscription=want.name, generation=generation)
                return Succeeded(f"{want.name}: the unknown create proven applied by"
                                 " read-back")
            await self.calls.dispose_absent(ctx, claim.attempt_ids, "past the in-flight"
                                            " window the list shows no subscription of the"
                                            " desired shape")
        body = canonical_bytes(d.create.body.render_values({
            "$resource": want.resource, "$action": want.action, "$url": want.url,
            "$secret": route.secret.reveal(), "$payload_version": want.payload_version}))
        sent = await self.calls.send(
            ctx, binding, method=d.create.method, path=d.create.path.text, body=body,
            headers={"Accept": d.content_type, "Content-Type": d.content_type},
            credential=self.calls.headers(d.auth_header, d.auth_prefix, access),
            access=access, generation=p.binding_generation,
            evidence={"name": want.name, "generation": generation, "reason": p.reason,
                      "secret_generation": want.secret_generation}, kin=kin)
        if not isinstance(sent, Sent):
            return sent
        seen, doc = sent.seen, sent.doc
        c = classify(_CONTRACT, seen)
        provider_id = identity_text(d.create.id.find(doc))
        if c.outcome is OutcomeClass.ACCEPTED and provider_id is None:
            c = attrs.evolve(c, outcome=OutcomeClass.OUTCOME_UNKNOWN, failure_class="no_id")
        self.calls.record(ctx, sent.attempt_id, c, seen)
        if c.outcome is OutcomeClass.ACCEPTED:
            assert provider_id is not None
            token = (d.create.cleanup_token.find(doc) if d.create.cleanup_token else None)
            self._finish_create(ctx, p, want, row, provider_id,
                                token if isinstance(token, str) else None, p.reason)
            logs.event("subscription_created", work_id=ctx.item.work_id, subscription=want.name,
                       generation=generation, reason=p.reason)
            return Succeeded(f"{want.name} created at generation {generation} ({p.reason})")
        self._note(ctx, want.name, "create_" + c.outcome.value.lower(), c.failure_class)
        if seen.status == 401:
            return await self.calls.after_401(ctx, binding, p.binding_generation, access)
        if c.outcome is OutcomeClass.REJECTED:
            return DeadLetter(f"create_{seen.status}", f"the provider refused to create"
                              f" {want.name} (HTTP {seen.status})")
        if c.outcome is OutcomeClass.OUTCOME_UNKNOWN:
            window = max(d.max_in_flight_s, binding.max_in_flight) + max(
                d.max_clock_skew_s, binding.max_clock_skew)
            return RetryLater("outcome_unknown", f"the create of {want.name} may have been"
                              f" applied; the list is read back after the {window:g} s"
                              " in-flight window", window + 0.5)
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

        what = f"delete of subscription {pid}"
        pin = await self._pin(ctx, binding, p)
        claim = await self._claim(ctx, binding, d)
        if not pin.holds:
            return self._stale(p, pin, claim, what)
        if isinstance(claim, WaitWindow):
            return self._waiting(claim, what)
        assert p.binding_generation is not None
        access = await self.calls.token(ctx, binding, p.binding_generation)
        cleanup: str | None = None
        if isinstance(access, TokenUnavailable):
            # No binding token for good (re-authorization needed, revoked): the
            # subscription's own cleanup token (L1's cleanup header) may still remove it.
            # Only a first send: nothing of it is in doubt, so nothing needs reading back.
            if d.delete.cleanup_header and isinstance(claim, Send) and definitive(
                    access.reason):
                cleanup = await self._cleanup_token(ctx, p)
            if cleanup is None:
                return self.calls.no_token(ctx, access)
        elif isinstance(claim, ReadBack):
            listed = await self.calls.list_subscriptions(ctx, d, binding,
                                                         p.binding_generation, access)
            if not isinstance(listed, list):
                return listed
            if all(x.raw_id != pid for x in listed):
                self.calls.dispose_applied(ctx, claim.attempt_ids, "past the in-flight"
                                           " window the list no longer shows it")
                self._finish_delete(ctx, p)
                return Succeeded(f"subscription {pid} proven deleted by read-back")
            await self.calls.dispose_absent(ctx, claim.attempt_ids, "past the in-flight"
                                            " window the list still shows it")
        token = access if isinstance(access, AccessToken) else None
        path = d.delete.path.render(remote_id=pid)
        credential = (self.calls.headers(d.auth_header, d.auth_prefix, token)
                      if cleanup is None else {d.delete.cleanup_header: cleanup})
        sent = await self.calls.send(
            ctx, binding, method=d.delete.method, path=path, body=b"",
            headers={"Accept": d.content_type}, credential=credential, access=token,
            generation=p.binding_generation if cleanup is None else None,
            evidence={"name": p.name, "provider_id": pid,
                      "expected_generation": p.generation, "reason": p.reason,
                      "credential": "binding" if cleanup is None else "cleanup_token"},
            guard=fence)
        if not isinstance(sent, Sent):
            if isinstance(sent, DeadLetter):
                logs.warn("subscription_delete_refused", work_id=ctx.item.work_id,
                          provider_id=pid, expected_generation=p.generation,
                          reason=sent.failure_class)
                self._note(ctx, p.name, "cleanup_refused", sent.failure_class)
            return sent
        seen = sent.seen
        c = classify(_CONTRACT, seen)
        if seen.status in d.delete.absent_statuses:
            c = attrs.evolve(c, outcome=OutcomeClass.ACCEPTED, failure_class="already_absent")
        self.calls.record(ctx, sent.attempt_id, c, seen)
        if c.outcome is OutcomeClass.ACCEPTED:
            self._finish_delete(ctx, p)
            logs.event("subscription_deleted", work_id=ctx.item.work_id, provider_id=pid,
                       reason=p.reason)
            return Succeeded(f"subscription {pid} deleted ({p.reason})")
        self._note(ctx, p.name, "delete_" + c.outcome.value.lower(), c.failure_class)
        if seen.status == 401 and cleanup is None:
            return await self.calls.after_401(ctx, binding, p.binding_generation, token)
        if c.outcome is OutcomeClass.REJECTED:
            return DeadLetter(f"delete_{seen.status}", f"the provider refused to delete"
                              f" subscription {pid} (HTTP {seen.status})")
        if c.outcome is OutcomeClass.OUTCOME_UNKNOWN:
            return RetryLater("outcome_unknown", f"the delete of subscription {pid} may have"
                              " been applied; the list is read back after the in-flight"
                              " window", max(d.max_in_flight_s, binding.max_in_flight)
                              + max(d.max_clock_skew_s, binding.max_clock_skew) + 0.5)
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


def subscription_handler(reconciler: SubscriptionReconciler) -> Any:
    async def handle(ctx: WorkContext) -> Outcome:
        return await reconciler.handle(ctx)

    return handle
