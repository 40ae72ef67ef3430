"""The ``inbound_apply`` work family: apply one observed remote change to the local record.

Theory of operation
-------------------
The shell around :mod:`daemon.core.inbound_flow` (read its rules first). One claim:

1. parses the :class:`~daemon.core.inbound_change.InboundChange` payload, resolves the
   pinned Catalog revision, the binding, the L1 resource and the L2 object binding
   (anything missing or changed is drift: fail closed);
2. reads, in one transaction, the active RemoteLink of the remote record (by its locator)
   and the record's watermarks;
3. asks :func:`~daemon.core.inbound_flow.decide` for a step and performs it: ``Hydrate``
   (GET the record with the L1 ``get`` definition), ``Lookup`` (ask the Runtime which
   Leads hold the match value), ``Adopt`` (a fenced, audited RemoteLink adoption) and
   again; then one terminal step:

   * ``Apply``: the Runtime mutation is an effect like any provider call: a fenced
     dispatch-start checkpoint in ``effect_attempts`` is committed *before* the request
     leaves; the Runtime applies a mutation key once, so a resend after a lost answer is
     replay-safe (``REPLAY_SAFE_RETRY``, the same key next claim). The outcome and the
     watermark advance commit with the item's finalization, only if its fence holds;
   * ``Retire``: the link is retired (fenced, audited: the observed remote deletion) and
     the deletion recorded on the watermark; the local Lead is never deleted;
   * ``FailClosed``: the item is dead with a stable code (the operator's reconciliation
     item); ``Nothing``: done, with what was observed recorded.

A Runtime answer 410 (the Lead was deleted there) retires local synchronization state:
the link is retired; the remote record is never touched.
"""

from __future__ import annotations

import hashlib
import urllib.parse
from collections.abc import Callable
from typing import Any

import attrs
import httpx

from config.catalog import Catalog
from config.definitions import ObjectBinding, ResourceDefinition
from config.settings import BindingSettings, RuntimeClient, Settings
from daemon.core.canonical import canonical_bytes
from daemon.core.effects import OutcomeClass
from daemon.core.identity import (
    integration_link_key_v2,
    integration_remote_locator_hash,
)
from daemon.core.inbound_change import BadInboundChange, InboundChange
from daemon.core.inbound_flow import (
    CONFLICTING_LOCATOR,
    Adopt,
    Apply,
    FailClosed,
    FlowView,
    Hydrate,
    LinkFacts,
    Lookup,
    Nothing,
    Retire,
    Snapshot,
    decide,
    lost_webhook,
    remote_time_ns,
)
from daemon.core.json_input import NotExact, loads_exact
from daemon.core.outcomes import DeadLetter, Deferred, Outcome, RetryLater, Succeeded
from daemon.core.principals import scope_digest
from daemon.providers.executor import Answer, BoundedHttp
from daemon.providers.template import identity_text
from daemon.services import logs
from daemon.services.catalog_view import CatalogView
from daemon.services.credentials import Credentials
from daemon.services.families import Handler, WorkContext
from daemon.services.principal_bootstrap import bootstrap_facts
from daemon.services.read_quota import ReadQuota, quota_read, read_keys
from daemon.services.token_refresh import TokenUnavailable
from storage.effect_values import AttemptDraft, RemoteLink
from storage.effects import record_outcome
from storage.inbound import (
    Watermark,
    WatermarkAdvance,
    advance_watermark,
    checkpoint_mutation,
    read_watermark,
)
from storage.links import adopt_link, read_link_by_locator, retire_link
from storage.port import SqlTx, WorkConflict

INBOUND_MUTATIONS_PATH = "/runtime/v1/inbound-mutations"
LEADS_PATH = "/runtime/v1/leads"
ACTOR = "integrationd"
ROLE = "inbound_flow"
_MAX_ROUNDS = 5


@attrs.frozen
class _Resolved:
    catalog: Catalog
    binding: BindingSettings
    resource: ResourceDefinition
    object_binding: ObjectBinding
    runtime: RuntimeClient
    scope_digest: str
    locator_hash: str


def _runtime_url(runtime: RuntimeClient, path: str) -> str:
    """The Runtime's other endpoints live beside its results endpoint."""
    return urllib.parse.urljoin(runtime.results_url, path)


@attrs.define(eq=False)
class InboundFlow:
    settings: Settings
    catalog: Catalog  # the current one (what the configuration serves)
    catalogs: CatalogView
    provider_http: BoundedHttp
    runtime_http: BoundedHttp
    # The binding's token (static, grant or S2S mint) for the hydration GET.
    credentials: Credentials = attrs.Factory(Credentials)
    timeout_s: float = 10.0
    # Called once per finished claim with (origin, result): metrics.count_inbound.
    on_result: Callable[[str, str], None] = lambda origin, result: None
    # Called with (provider, resource) when reconciliation saw a version no webhook did.
    on_lost_webhook: Callable[[str, str], None] = lambda provider, resource: None
    # Called with a quota event of a hydration GET (reserved, waited, throttled, ...).
    on_quota: Callable[[str], None] = lambda event: None
    on_quota_reset_ignored: Callable[[str], None] = lambda reason: None

    async def handle(self, ctx: WorkContext) -> Outcome:
        try:
            change = InboundChange.from_payload(ctx.item.payload)
        except BadInboundChange as exc:
            self.on_result("unknown", "bad_payload")
            return DeadLetter("bad_payload", str(exc))
        outcome = await self._handle(ctx, change)
        label = (outcome.failure_class if isinstance(outcome, DeadLetter) else
                 "retry" if isinstance(outcome, RetryLater) else "done")
        self.on_result(change.origin, label)
        return outcome

    async def _resolve(self, ctx: WorkContext, change: InboundChange) -> _Resolved | str:
        pinned = await self.catalogs.pinned(ctx.item.catalog_revision, ctx.item.catalog_digest)
        if pinned is None:
            return (f"the pinned Catalog revision {ctx.item.catalog_revision} is not stored")
        binding = pinned.binding(change.binding)
        current = self.catalog.binding(change.binding)
        if binding is None or current is None:
            return f"binding {change.binding} is not in the pinned and the current Catalog"
        if binding.provider != change.provider or current.provider != change.provider:
            return f"binding {change.binding} is not a {change.provider} binding"
        if binding.org_id != ctx.item.org_id or (
                (current.org_id, current.app_installation_id, current.remote_account_id)
                != (binding.org_id, binding.app_installation_id, binding.remote_account_id)):
            return f"binding {change.binding} now names another org, installation or account"
        resource = next((r for r in pinned.resources.values()
                         if r.provider == change.provider and r.type == change.resource_type),
                        None)
        if resource is None:
            return f"no {change.provider} resource of type {change.resource_type}"
        object_binding = next((o for o in pinned.object_bindings
                               if o.provider == change.provider
                               and o.resource == resource.name), None)
        if object_binding is None:
            return f"no object binding for {change.provider}.{resource.name}"
        runtime = next((r for r in self.settings.runtimes
                        if (r.org_id, r.app_installation_id)
                        == (binding.org_id, binding.app_installation_id)), None)
        if runtime is None or not runtime.results_url or runtime.results_token is None:
            return (f"no Runtime with a results_url and token serves org {binding.org_id}"
                    f" installation {binding.app_installation_id}")
        # The durable binding's remote account scopes the links (docs/identity.md): the
        # same scope outbound commands admitted now use, whatever the TOML still says.
        # (A configured binding with no row yet is bootstrapped from its entry, as at
        # admission.)
        principal = (await ctx.store.binding_get(change.binding)
                     or await ctx.store.binding_bootstrap(bootstrap_facts(current),
                                                          ctx.clock.now_us()))
        account = principal.identity.remote_account_id
        if change.remote_account is not None and change.remote_account != account:
            # Observed under the account the binding named before a rebind: its record id
            # is another account's, and must never be matched, adopted or applied here.
            return (f"the change was observed under remote account {change.remote_account};"
                    f" binding {change.binding} now names {account}: it is not applied")
        scope = scope_digest(principal)
        locator = integration_remote_locator_hash(scope, resource.name, change.resource_id)
        return _Resolved(pinned, current, resource, object_binding, runtime, scope, locator)

    async def _read(self, ctx: WorkContext, r: _Resolved,
                    change: InboundChange) -> tuple[RemoteLink | None, Watermark]:
        async def body(tx: SqlTx) -> tuple[RemoteLink | None, Watermark]:
            return (await read_link_by_locator(tx, r.locator_hash),
                    await read_watermark(tx, r.locator_hash, r.scope_digest, r.resource.name,
                                         change.resource_id))

        return await ctx.store.db.transact(body, name="inbound.context", write=False)

    @staticmethod
    def _view(change: InboundChange, r: _Resolved | str, link: RemoteLink | None,
              mark: Watermark | None) -> FlowView:
        if isinstance(r, str):
            return FlowView(change=change, drift=r)
        assert mark is not None
        return FlowView(
            change=change, inbound=r.object_binding.inbound_remote(),
            match=r.object_binding.match,
            link=None if link is None else LinkFacts(
                link_key=link.link_key, local_id=link.local_id, generation=link.generation,
                remote_id=link.remote_id),
            stamps=mark.field_stamps, deleted_ns=mark.deleted_ns)

    async def _handle(self, ctx: WorkContext, change: InboundChange) -> Outcome:
        resolved = await self._resolve(ctx, change)
        link: RemoteLink | None = None
        mark: Watermark | None = None
        if not isinstance(resolved, str):
            link, mark = await self._read(ctx, resolved, change)
        view = self._view(change, resolved, link, mark)
        for _ in range(_MAX_ROUNDS):
            step = decide(view)
            if isinstance(step, FailClosed):
                logs.event("inbound_fail_closed", work_id=ctx.item.work_id, code=step.code,
                           resource_type=change.resource_type, resource_id=change.resource_id)
                return DeadLetter(step.code, step.sentence)
            assert not isinstance(resolved, str) and mark is not None
            if isinstance(step, Hydrate):
                snapshot = await self._hydrate(ctx, resolved, change)
                if isinstance(snapshot, RetryLater | Deferred):
                    return snapshot
                view = attrs.evolve(view, snapshot=snapshot)
            elif isinstance(step, Lookup):
                found = await self._lookup(resolved, step)
                if isinstance(found, RetryLater):
                    return found
                view = attrs.evolve(view, candidates=found)
            elif isinstance(step, Adopt):
                adopted = await self._adopt(ctx, resolved, change, step, view)
                if isinstance(adopted, DeadLetter):
                    return adopted
                view = attrs.evolve(view, link=adopted)
            elif isinstance(step, Apply):
                return await self._apply(ctx, resolved, change, mark, step)
            elif isinstance(step, Retire):
                return self._retire(ctx, change, mark, step)
            else:
                assert isinstance(step, Nothing)
                self._observed(ctx, change, mark, WatermarkAdvance(deleted_ns=step.deleted_ns))
                return Succeeded(step.reason)
        return RetryLater("inbound_rounds", "no terminal step within one claim")

    # ---- reads ----

    async def _hydrate(self, ctx: WorkContext, r: _Resolved,
                       change: InboundChange) -> Snapshot | RetryLater | Deferred:
        get, binding = r.resource.get, r.binding
        try:
            access = await self.credentials.current_token(ctx.store, ctx.fence, binding)
        except TokenUnavailable as exc:
            return RetryLater(exc.reason, str(exc))
        url = binding.base_url.rstrip("/") + get.path.render(remote_id=change.resource_id)
        headers = {get.auth.header: f"{get.auth.prefix}{access.token.reveal()}",
                   "Accept": get.accept}
        keys, retry_after = read_keys(self.catalog.operations.values(), binding,
                                      clock_spread_us=self.settings.work.clock_spread_us)
        try:
            # On the binding's shared quota, like its effects (daemon/services/read_quota.py).
            answer = await quota_read(ctx, ReadQuota(keys, retry_after, self.on_quota,
                                                      self.on_quota_reset_ignored),
                                      lambda: self.provider_http.request(
                                          get.method, url, headers=headers,
                                          timeout_s=binding.timeout))
        except httpx.HTTPError as exc:
            return RetryLater("hydrate_unreachable", type(exc).__name__)
        if isinstance(answer, Deferred):
            return answer
        response = answer
        if response.status_code in get.absent_statuses:
            return Snapshot(absent=True)
        if response.status_code != 200:
            return RetryLater(f"hydrate_{response.status_code}",
                              f"the read of {change.resource_type} {change.resource_id}"
                              f" answered {response.status_code}")
        try:
            doc = loads_exact(response.content)  # fractions as exact text, as in webhooks
        except NotExact as exc:
            return RetryLater("hydrate_unsupported_number", str(exc))
        except ValueError:
            return RetryLater("hydrate_not_json", "the read answered a body that is not JSON")
        attributes = get.attributes.find(doc)
        updated = get.updated_at.find(doc)
        return Snapshot(remote_id=identity_text(get.id.find(doc)),
                        attributes=attributes if isinstance(attributes, dict) else {},
                        updated_at=updated if isinstance(updated, str) else None)

    async def _lookup(self, r: _Resolved, step: Lookup) -> tuple[str, ...] | RetryLater:
        assert r.runtime.results_token is not None
        found: set[str] = set()
        for value in step.values:
            try:
                response = await self.runtime_http.request(
                    "GET", _runtime_url(r.runtime, LEADS_PATH),
                    params={"field": step.local_field, "value": value},
                    headers={"Authorization": f"Bearer {r.runtime.results_token.reveal()}"},
                    timeout_s=self.timeout_s)
            except httpx.HTTPError as exc:
                return RetryLater("runtime_unreachable", type(exc).__name__)
            if response.status_code != 200:
                return RetryLater(f"runtime_{response.status_code}",
                                  f"the Runtime's Lead lookup answered {response.status_code}")
            ids = response.json().get("lead_ids")
            if not isinstance(ids, list):
                return RetryLater("runtime_bad_answer", "the Lead lookup answer has no ids")
            found.update(str(i) for i in ids)
        return tuple(sorted(found))

    # ---- fenced writes ----

    async def _adopt(self, ctx: WorkContext, r: _Resolved, change: InboundChange, step: Adopt,
                     view: FlowView) -> LinkFacts | DeadLetter:
        now = ctx.clock.now_us()
        field = view.match[1] if view.match else "?"

        async def body(tx: SqlTx) -> RemoteLink:
            return await adopt_link(
                tx, r.scope_digest, r.object_binding.local_object, step.local_id,
                r.resource.name, change.resource_id, actor=ACTOR, role=ROLE,
                reason=f"{change.origin} {change.kind}: the only local record with this"
                       f" {field}", now_us=now)

        try:
            link = await ctx.fenced(body, name="inbound.adopt")
        except WorkConflict as exc:
            return DeadLetter(CONFLICTING_LOCATOR, f"adopting {r.object_binding.local_object}"
                              f" {step.local_id} failed: {exc}")
        return LinkFacts(link_key=link.link_key, local_id=link.local_id,
                         generation=link.generation, remote_id=link.remote_id)

    def _observed(self, ctx: WorkContext, change: InboundChange, mark: Watermark,
                  advance: WatermarkAdvance) -> None:
        """Record what this change observed (with the finalization, fenced)."""
        updated_ns = remote_time_ns(change.remote_updated_at or
                                    change.attributes.get("updatedAt"))
        if lost_webhook(change.origin, updated_ns, mark.webhook_seen_ns) and (
                updated_ns is not None and max(mark.field_stamps.values(), default=-1)
                < updated_ns):
            self.on_lost_webhook(change.provider, change.resource_type)
            logs.event("inbound_lost_webhook", work_id=ctx.item.work_id,
                       resource_type=change.resource_type, resource_id=change.resource_id)
        if change.origin == "webhook" and updated_ns is not None:
            advance = attrs.evolve(advance, webhook_seen_ns=updated_ns)
        if not advance.stamps and advance.webhook_seen_ns is None and advance.deleted_ns is None:
            return
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            await advance_watermark(tx, mark, advance, now)

        ctx.on_finalize(write)

    def _retire(self, ctx: WorkContext, change: InboundChange, mark: Watermark,
                step: Retire) -> Outcome:
        now = ctx.clock.now_us()
        reason = (f"remote {change.resource_type} {change.resource_id} observed destroyed"
                  f" ({change.origin}); the local record is kept")

        async def write(tx: SqlTx) -> None:
            await retire_link(tx, step.link.link_key, expected_generation=step.link.generation,
                              actor=ACTOR, role=ROLE, reason=reason, now_us=now)

        ctx.on_finalize(write)
        self._observed(ctx, change, mark, WatermarkAdvance(
            deleted_ns=step.observed_ns if step.observed_ns is not None else 0))
        return Succeeded("remote record destroyed; link retired, local record kept")

    async def _apply(self, ctx: WorkContext, r: _Resolved, change: InboundChange,
                     mark: Watermark, step: Apply) -> Outcome:
        runtime = r.runtime
        assert runtime.results_token is not None
        body = {"mutation_key": step.mutation_key, "lead_id": step.local_id,
                "fields": dict(step.fields),
                "source": {"provider": change.provider, "remote_object": r.resource.name,
                           "remote_id": change.resource_id, "origin": change.origin}}
        raw = canonical_bytes(body)
        draft = AttemptDraft(
            command_id=ctx.item.work_id, method="POST", target_path=INBOUND_MUTATIONS_PATH,
            safe_headers="{}", body_sha256="sha256:" + hashlib.sha256(raw).hexdigest(),
            idempotency_key=step.mutation_key,
            pre_dispatch_evidence=canonical_bytes({
                "binding_generation": r.binding.generation,
                "catalog_revision": r.catalog.revision,
                "link_key": view_link_key(step, r),
                "remote_updated_ns": step.updated_ns,
            }).decode(),
            give_up_after_us=int(self.timeout_s * 1_000_000))

        async def checkpoint(tx: SqlTx) -> str:
            # Read inside the fenced transaction, as the fence is.
            return await checkpoint_mutation(tx, ctx.fence, draft, ctx.clock.now_us())

        # Committed before a byte leaves: the journal knows the attempt even if we die.
        attempt_id = await ctx.fenced(checkpoint, name="inbound.checkpoint")
        status: int | None = None
        error = ""
        try:
            response = await self.runtime_http.request(
                "POST", _runtime_url(runtime, INBOUND_MUTATIONS_PATH), content=raw,
                headers={"Authorization": f"Bearer {runtime.results_token.reveal()}",
                         "Content-Type": "application/json"},
                timeout_s=self.timeout_s)
            status = response.status_code
            error = _error_code(response)
        except httpx.HTTPError as exc:
            error = type(exc).__name__
        outcome, evidence = _classify(status)
        self._record(ctx, attempt_id, outcome, evidence, status, error)
        if status == 200:
            self._observed(ctx, change, mark, WatermarkAdvance(stamps=step.stamps))
            logs.debug("inbound_applied", work_id=ctx.item.work_id, attempt_id=attempt_id,
                       fields=sorted(step.fields), origin=change.origin)
            return Succeeded(f"applied {', '.join(sorted(step.fields))}")
        if status == 410:
            # The local record was deleted: retire local synchronization state only.
            link_key = view_link_key(step, r)
            now2 = ctx.clock.now_us()

            async def retire(tx: SqlTx) -> None:
                link = await read_link_by_locator(tx, r.locator_hash)
                if link is not None and link.link_key == link_key:
                    await retire_link(tx, link.link_key, expected_generation=link.generation,
                                      actor=ACTOR, role=ROLE,
                                      reason="the local record was deleted; the remote"
                                             " record is kept", now_us=now2)

            ctx.on_finalize(retire)
            return Succeeded("local record deleted; link retired, remote record kept")
        if status in (400, 404, 409):
            return DeadLetter(f"runtime_{status}", f"the Runtime refused the mutation"
                              f" ({error or status}); failing closed")
        return RetryLater("runtime_unavailable" if status is None else f"runtime_{status}",
                          f"the Runtime mutation did not complete ({error or status}); the"
                          " same key is resent")

    @staticmethod
    def _record(ctx: WorkContext, attempt_id: str, outcome: OutcomeClass, evidence: str,
                status: int | None, error: str) -> None:
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            await record_outcome(tx, attempt_id, outcome=outcome.value, evidence=evidence,
                                 response_status=status,
                                 provider_evidence={"error": error} if error else {},
                                 failure_class="" if status == 200 else (
                                     error or f"http_{status}"),
                                 gave_up_at_us=now, now_us=now)

        ctx.on_finalize(write)


def view_link_key(step: Apply, r: _Resolved) -> str:
    return integration_link_key_v2(r.scope_digest, r.object_binding.local_object,
                                   step.local_id)


def _classify(status: int | None) -> tuple[OutcomeClass, str]:
    """The Runtime applies a key once: an unanswered send is safe to resend."""
    if status == 200:
        return OutcomeClass.ACCEPTED, "applied"
    if status is None or status >= 500 or status == 429:
        return OutcomeClass.REPLAY_SAFE_RETRY, "maybe_applied"
    return OutcomeClass.REJECTED, "not_applied"


def _error_code(response: Answer) -> str:
    try:
        doc: Any = response.json()
    except ValueError:
        return ""
    value = doc.get("error") if isinstance(doc, dict) else None
    return value[:64] if isinstance(value, str) else ""


def inbound_handler(flow: InboundFlow) -> Handler:
    async def handle(ctx: WorkContext) -> Outcome:
        return await flow.handle(ctx)

    return handle


