"""The ``cursor_reconcile`` work family: list a stream's changed records and hand each one
to the inbound Flow as an ``inbound_apply`` WorkItem (read daemon/core/cursor.py first).

One claim is one run of one stream (a binding and an L1 resource with a ``list``):

1. resolve the pinned Catalog, the binding, the resource and its L2 object binding (the
   reconciliation policy: interval, overlap, safety lag, page size);
2. list from ``cursor - overlap`` (incremental) or from the repair's start, oldest first,
   page after page through the provider's ``next`` link (which must stay on the binding's
   origin: the token never goes elsewhere);
3. for each page, in one fenced transaction: insert the page's ``inbound_apply`` items
   (their dedupe keys make a re-listed record a no-op) and move the cursor;
4. at the end, with the finalization: count the run and queue the next incremental run
   ``interval`` seconds later (a WorkItem like any other: no second queue, no timer).

A page that cannot be read is a retry (what was checkpointed stays); a page that is not
what L1 says is a dead item with the reason. Bounded and full repairs are the same run
with origin ``repair``, queued by ``integrationd reconcile repair`` (audited); they never
move the incremental cursor.
"""

from __future__ import annotations

import functools
import json
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any, Final

import attrs
import httpx

from config.catalog import Catalog
from config.definitions import ObjectBinding, ResourceDefinition
from config.settings import BindingSettings
from daemon.core.cursor import (
    BadPage,
    Cursor,
    Stream,
    iso_from_ns,
    parse_rows,
    plan_page,
    since_ns,
)
from daemon.core.json_input import loads_exact
from daemon.core.outcomes import DeadLetter, Deferred, Outcome, RetryLater, Succeeded
from daemon.core.work import WorkSpec
from daemon.providers.executor import BoundedHttp
from daemon.services import logs
from daemon.services.catalog_view import CatalogView
from daemon.services.credentials import Credentials
from daemon.services.families import Handler, WorkContext
from daemon.services.read_quota import ReadQuota, quota_read, read_keys
from daemon.services.token_refresh import TokenUnavailable
from storage.port import SqlTx
from storage.reconcile import StreamState, read_stream, write_stream
from storage.work_admin import insert_work

RECONCILE_FAMILY: Final = "cursor_reconcile"
PAYLOAD_VERSION: Final = 1
MODES: Final = frozenset({"incremental", "repair"})
_MAX_PAGES: Final = 10_000


class BadRun(ValueError):
    pass


@attrs.frozen(kw_only=True)
class RunPayload:
    binding: str
    resource: str
    mode: str = "incremental"
    run_id: str = ""
    from_ns: int | None = None
    until_ns: int | None = None

    def to_payload(self) -> str:
        return json.dumps({"version": PAYLOAD_VERSION, **attrs.asdict(self)}, sort_keys=True,
                          separators=(",", ":"))

    @classmethod
    def from_payload(cls, text: str) -> RunPayload:
        try:
            doc = json.loads(text)
        except ValueError:
            raise BadRun("payload: not JSON") from None
        if not isinstance(doc, dict) or doc.get("version") != PAYLOAD_VERSION:
            raise BadRun(f"payload: not a version-{PAYLOAD_VERSION} reconciliation run")
        for name in ("binding", "resource", "mode", "run_id"):
            if not isinstance(doc.get(name, ""), str):
                raise BadRun(f"{name}: not a string")
        for name in ("from_ns", "until_ns"):
            value = doc.get(name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
                raise BadRun(f"{name}: not an integer")
        if doc.get("mode") not in MODES:
            raise BadRun(f"mode: {doc.get('mode')!r} is not one of {sorted(MODES)}")
        if doc["mode"] == "repair" and not doc.get("run_id"):
            raise BadRun("run_id: a repair needs one")
        return cls(binding=doc.get("binding", ""), resource=doc.get("resource", ""),
                   mode=doc["mode"], run_id=doc.get("run_id", ""), from_ns=doc.get("from_ns"),
                   until_ns=doc.get("until_ns"))


def stream_key(binding: str, resource: str) -> str:
    return f"{binding}:{resource}"


def run_spec(catalog: Catalog, binding: BindingSettings, run: RunPayload, *, number: int,
             max_attempts: int, run_after_us: int | None = None) -> WorkSpec:
    """The WorkItem of one run: incremental run ``number`` of a stream (one per number, by
    its dedupe key), or one repair (by its run id). ``max_attempts``: the family's
    configured one (``[families.cursor_reconcile]``)."""
    key = (f"reconcile:{stream_key(run.binding, run.resource)}:run:{number}"
           if run.mode == "incremental" else f"reconcile:repair:{run.run_id}")
    return WorkSpec(
        family=RECONCILE_FAMILY, org_id=binding.org_id,
        app_installation_id=binding.app_installation_id, subject_kind="stream",
        subject_id=stream_key(run.binding, run.resource),
        definition_ref=f"{binding.provider}/{run.binding}",
        catalog_revision=catalog.revision, catalog_digest=catalog.digest,
        payload=run.to_payload(),
        source_lane=f"reconcile:{stream_key(run.binding, run.resource)}",
        run_after_us=run_after_us, max_attempts=max_attempts, dedupe_key=key)


@attrs.frozen
class _Resolved:
    catalog: Catalog
    binding: BindingSettings
    resource: ResourceDefinition
    object_binding: ObjectBinding
    stream: Stream


@attrs.define(eq=False)
class CursorReconciler:
    catalog: Catalog  # the current one
    catalogs: CatalogView
    http: BoundedHttp
    # The inbound_apply family's configured max_attempts: each change listed carries it.
    inbound_max_attempts: int = attrs.field(kw_only=True)
    # The cursor_reconcile family's configured max_attempts: the next run carries it.
    max_attempts: int = attrs.field(kw_only=True)
    # The binding's token (static, grant or S2S mint) for the list requests.
    credentials: Credentials = attrs.Factory(Credentials)
    # Called with (stream key, epoch seconds the stream is complete through) after each
    # incremental run: every change up to the run's horizon has been offered.
    on_complete: Callable[[str, float], None] = lambda stream, through_s: None
    # Called with (stream key, records offered) after each page.
    on_offered: Callable[[str, int], None] = lambda stream, count: None
    # Called with a quota event of a list request (reserved, waited, throttled, ...).
    on_quota: Callable[[str], None] = lambda event: None
    on_quota_reset_ignored: Callable[[str], None] = lambda reason: None
    # work.clock_spread, in us: the quota schedule's margin for the replicas' clocks.
    quota_clock_spread_us: int = 0

    async def _resolve(self, ctx: WorkContext, run: RunPayload) -> _Resolved | str:
        pinned = await self.catalogs.pinned(ctx.item.catalog_revision, ctx.item.catalog_digest)
        if pinned is None:
            return f"the pinned Catalog revision {ctx.item.catalog_revision} is not stored"
        binding = pinned.binding(run.binding)
        current = self.catalog.binding(run.binding)
        if binding is None or current is None or current.provider != binding.provider:
            return f"binding {run.binding} is not in the pinned and the current Catalog"
        resource = pinned.resource(binding.provider, run.resource)
        if resource is None or resource.list is None:
            return f"{binding.provider} has no listable resource {run.resource}"
        object_binding = next((o for o in pinned.object_bindings
                               if o.provider == binding.provider
                               and o.resource == resource.name), None)
        if object_binding is None:
            return f"no object binding for {binding.provider}.{resource.name}"
        stream = Stream(provider=binding.provider, binding=run.binding, resource=resource.name,
                        resource_type=resource.type)
        return _Resolved(pinned, current, resource, object_binding, stream)

    def _first_url(self, r: _Resolved, since: int) -> str:
        listing = r.resource.list
        assert listing is not None
        size = r.object_binding.reconcile.page_size or listing.page_size
        query = [(listing.since_param, listing.since_format.replace("{since}",
                                                                    iso_from_ns(since))),
                 *listing.query, (listing.page_size_param, str(size))]
        return (r.binding.base_url.rstrip("/") + listing.path + "?"
                + urllib.parse.urlencode(query))

    async def handle(self, ctx: WorkContext) -> Outcome:
        try:
            run = RunPayload.from_payload(ctx.item.payload)
        except BadRun as exc:
            return DeadLetter("bad_payload", str(exc))
        resolved = await self._resolve(ctx, run)
        if isinstance(resolved, str):
            return DeadLetter("binding_drift", resolved)
        r = resolved
        listing = r.resource.list
        assert listing is not None
        try:
            access = await self.credentials.current_token(ctx.store, ctx.fence, r.binding)
        except TokenUnavailable as exc:
            return RetryLater(exc.reason, str(exc))
        token = access.token
        # The account the listing reads (the durable binding's; the configured one while
        # the binding has no row yet).
        principal = await ctx.store.binding_get(run.binding)
        account = (principal.identity.remote_account_id if principal is not None
                   else r.binding.remote_account_id)
        policy = r.object_binding.reconcile
        key = r.stream.key

        async def read(tx: SqlTx) -> StreamState:
            return await read_stream(tx, key, run.binding, run.resource)

        state = await ctx.store.db.transact(read, name="reconcile.read", write=False)
        now_ns = ctx.clock.now_us() * 1000
        horizon = now_ns - int(policy.safety_lag_s * 1e9)
        incremental = run.mode == "incremental"
        # The first run of a stream (no cursor yet) is its initial sync: it lists from the
        # beginning and offers what it finds as a repair (no webhook was owed for records
        # older than the stream, so none is counted lost); it still sets the cursor.
        initial = incremental and state.cursor is None
        start = (since_ns(state.cursor, int(policy.overlap_s * 1e9)) if incremental
                 else (run.from_ns or 0))
        url = self._first_url(r, start)
        origin = urllib.parse.urlsplit(r.binding.base_url)
        headers = {listing.auth.header: f"{listing.auth.prefix}{token.reveal()}",
                   "Accept": listing.accept}
        offered = 0
        cursor: Cursor | None = state.cursor
        # Every page on the binding's shared quota, like its effects (read_quota.py): no
        # slot now, the run is deferred to the time one is free (the pages checkpointed
        # so far stay; the next claim lists on from the cursor).
        keys, retry_after = read_keys(r.catalog.operations.values(), r.binding,
                                      clock_spread_us=self.quota_clock_spread_us)
        rq = ReadQuota(keys, retry_after, self.on_quota,
                       self.on_quota_reset_ignored)
        for _ in range(_MAX_PAGES):
            try:
                answer = await quota_read(ctx, rq, functools.partial(
                    self.http.request, listing.method, url, headers=headers,
                    timeout_s=r.binding.timeout))
            except httpx.HTTPError as exc:
                return RetryLater("list_unreachable", type(exc).__name__)
            if isinstance(answer, Deferred):
                return answer
            response = answer
            if response.status_code != 200:
                return RetryLater(f"list_{response.status_code}",
                                  f"the list answered {response.status_code}")
            try:
                # A fraction is kept as its exact decimal text: the changes become
                # canonical WorkItem payloads, which have no floats.
                doc: Any = loads_exact(response.content)
                rows = parse_rows(listing.items.find(doc), id_of=listing.item_id.find,
                                  attributes_of=listing.item_attributes.find,
                                  updated_of=listing.item_updated_at.find)
            except (ValueError, BadPage) as exc:
                return DeadLetter("bad_page", f"a listed page is not what L1 declares: {exc}")
            plan = plan_page(r.stream, rows, cursor=cursor if incremental else None,
                             horizon_ns=horizon, until_ns=run.until_ns,
                             origin="reconcile" if incremental and not initial else "repair",
                             run_id=run.run_id if not initial else "initial")
            # Each change pins the account it was listed from (the Flow refuses it after
            # a rebind to another account).
            specs = [attrs.evolve(c, remote_account=account).work_spec(
                         org_id=r.binding.org_id, catalog_revision=ctx.item.catalog_revision,
                         catalog_digest=ctx.item.catalog_digest,
                         max_attempts=self.inbound_max_attempts)
                     for c in plan.changes]
            moved = plan.cursor if incremental else None
            state = await ctx.fenced(_checkpoint(specs, state, moved, ctx.clock.now_us()),
                                     name="reconcile.page")
            cursor = state.cursor if incremental else cursor
            offered += len(specs)
            self.on_offered(key, len(specs))
            nxt = listing.next.find(doc)
            if plan.done or not isinstance(nxt, str) or not nxt:
                break
            parts = urllib.parse.urlsplit(nxt)
            if (parts.scheme, parts.netloc) != (origin.scheme, origin.netloc):
                return DeadLetter("foreign_next_link", "the next-page link leaves the"
                                  " binding's origin; the token is not sent there")
            url = nxt
        else:
            # Not finished within one claim: what was checkpointed stays; the next claim
            # lists on from the cursor (a repair starts its period again: its keys dedupe).
            return RetryLater("reconcile_pages", f"{_MAX_PAGES} pages in one claim; continuing")
        if incremental:
            self._schedule_next(ctx, r, run, state, policy.interval_s)
            self.on_complete(key, horizon / 1e9)
        logs.event("reconcile_run", work_id=ctx.item.work_id, stream=key, mode=run.mode,
                   offered=offered)
        return Succeeded(f"{offered} records offered to the inbound Flow")

    def _schedule_next(self, ctx: WorkContext, r: _Resolved, run: RunPayload,
                       state: StreamState, interval_s: float) -> None:
        now = ctx.clock.now_us()
        spec = run_spec(r.catalog, r.binding, run, number=state.runs + 1,
                        max_attempts=self.max_attempts,
                        run_after_us=now + int(interval_s * 1_000_000))
        spec = attrs.evolve(spec, catalog_revision=ctx.item.catalog_revision,
                            catalog_digest=ctx.item.catalog_digest)

        async def write(tx: SqlTx) -> None:
            latest = await read_stream(tx, state.stream_key, state.binding_id, state.resource)
            await write_stream(tx, latest, cursor=latest.cursor, runs=latest.runs + 1,
                               last_run_at_us=now, now_us=now)
            await insert_work(tx, [spec], now)

        ctx.on_finalize(write)


def _checkpoint(specs: list[WorkSpec], before: StreamState, moved: Cursor | None,
                now_us: int) -> Callable[[SqlTx], Awaitable[StreamState]]:
    """One page's items and the cursor they moved: one commit, or neither."""

    async def body(tx: SqlTx) -> StreamState:
        if specs:
            # Re-listed records (the overlap) already have their item: find them with one
            # read and insert the rest in one multi-row INSERT. Only this stream's runs make
            # these keys and its lane runs one at a time, so no other writer races the read
            # (if one ever did, the INSERT's unique key fails this transaction: retried).
            keys = [s.dedupe_key for s in specs if s.dedupe_key is not None]
            rows = await tx.fetchall(
                "SELECT dedupe_key FROM work_items WHERE dedupe_key IN"
                f" ({', '.join('?' for _ in keys)})", keys) if keys else []
            seen = {str(r[0]) for r in rows}
            fresh = list({s.dedupe_key: s for s in reversed(specs)
                          if s.dedupe_key not in seen}.values())[::-1]  # once per key
            if fresh:
                await insert_work(tx, fresh, now_us, fresh_dedupe_keys=True)
        if moved is None:
            return before
        return await write_stream(tx, before, cursor=moved, runs=before.runs,
                                  last_run_at_us=before.last_run_at_us, now_us=now_us)

    return body


def reconcile_handler(reconciler: CursorReconciler) -> Handler:
    async def handle(ctx: WorkContext) -> Outcome:
        return await reconciler.handle(ctx)

    return handle
