"""Every provider call of the subscription family, under the effect contract (seed 9;
design section 11, "one way out").

Theory of operation
-------------------
The family declares what it sends as L1 data (``config/subscription_defs.py``); this
module sends it the way effects are sent, with the same services and nothing of its own:

* **credential**: :class:`~daemon.services.credentials.Credentials`, the service effects
  use: a static token, or the pinned binding generation's AuthorizationGrant through the
  single-winner token owner (refreshed, or S2S-minted for the durable installation only
  while the binding is still at that generation). A run takes the current durable
  generation's token and pins that generation into every step it queues; a step takes
  the pinned one. No token for a reason no retry cures: the item is dead with it; any
  other reason: the claim is given back unstarted (``Deferred``). A 401 to a token from
  a grant earns one refresh (the rejected version), then a retry;
* **list**: L1's ``list`` request and pointers (:meth:`SubscriptionCalls.list_subscriptions`);
* **quota**: the list is a provider read (:func:`daemon.services.read_quota.quota_read`);
  a create or delete reserves one slot of every key before its checkpoint
  (:func:`daemon.services.effect_quota.reserve`), sends only inside it, and settles the
  reservation with the attempt (sent / released / spent_unknown), a 429 moving the keys
  for every replica, exactly as the effect runner does;
* **DoOnce**: a create or delete writes its dispatch-start checkpoint in
  ``effect_attempts`` (command id = the step's WorkItem id) and commits it before a byte
  leaves; the pins are in that statement (:func:`storage.effects.insert_attempt_pinned`:
  the binding connected at the pinned generation, no unresolved attempt of the step, nor,
  for a create, of any earlier create step of the same subscription: issue 22) and
  the caller's guard runs in its transaction. The one classified outcome commits with
  the finalization; reconciliation appends a disposition (``proven_applied`` /
  ``proven_absent``) through :func:`storage.effects.dispose`, never rewriting the attempt.

No provider name appears here, and no token is logged.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import attrs
import httpx
import trio

from config.definitions import OperationDefinition
from config.settings import BindingSettings
from config.subscription_defs import SubscriptionDefinition
from daemon.core.canonical import canonical_bytes
from daemon.core.effects import Classification, DispatchObservation, Phase
from daemon.core.outcomes import DeadLetter, Deferred, Outcome, RetryLater
from daemon.core.quota import ReservationState
from daemon.core.subscriptions import Remote, StepAttempt
from daemon.providers.executor import SEND_WINDOW_CLOSED, Answer, BoundedHttp, exchange
from daemon.providers.template import identity_text
from daemon.services import effect_quota as quota
from daemon.services import logs
from daemon.services.credentials import Credentials, definitive
from daemon.services.families import WorkContext
from daemon.services.read_quota import ReadQuota, quota_read, read_keys
from daemon.services.token_refresh import AccessToken, TokenUnavailable
from storage.effect_values import AttemptDraft, Disposition, EffectAttempt, Kin
from storage.effects import (
    attempts_of,
    dispose,
    insert_attempt_pinned,
    record_outcome,
    unresolved_of_kin,
)
from storage.idgen import new_ulid
from storage.port import SqlTx

# A claim that got no token for a reason a wait can cure is given back for this long.
TOKEN_DEFER_US = 2_000_000
# Who appends a read-back's disposition.
RECONCILER = "subscription-reconciler"

# A guard run in the checkpoint's transaction: a refusal (nothing written) or None.
Guard = Callable[[SqlTx], Awaitable[DeadLetter | None]]


def client_deadline_s(binding: BindingSettings) -> float:
    """When the client gives up on an exchange at the latest (a free connection, then the
    request, each within the binding's timeout): as for effects."""
    return 2 * binding.timeout


@attrs.frozen
class Listed:
    """One subscription the provider lists: its shape, and its id as the provider wrote
    it."""

    remote: Remote
    raw_id: str


@attrs.frozen
class Sent:
    """One exchange made after its committed checkpoint."""

    attempt_id: str
    seen: DispatchObservation
    doc: Any
    # The token the request carried (its version: a 401 earns a refresh past it).
    access: AccessToken | None


@attrs.define(eq=False)
class SubscriptionCalls:
    http: BoundedHttp
    credentials: Credentials = attrs.Factory(Credentials)
    # The Catalog's operations: a provider's quota dimensions are declared on them.
    operations: tuple[OperationDefinition, ...] = ()
    # work.clock_spread, in us: the quota schedule's margin for the replicas' clocks.
    quota_clock_spread_us: int = 0
    on_quota: Callable[[str], None] = lambda event: None
    on_quota_reset_ignored: Callable[[str], None] = lambda reason: None
    on_credential_failure: Callable[[str], None] = lambda reason: None

    # ---- credentials ----

    async def token(self, ctx: WorkContext, binding: BindingSettings,
                    generation: int | None, *, rejected_version: int | None = None
                    ) -> AccessToken | TokenUnavailable:
        """The pinned generation's token (None: the current durable generation's)."""
        try:
            if generation is None:
                return await self.credentials.current_token(ctx.store, ctx.fence, binding)
            return await self.credentials.token(ctx.fence, binding, generation,
                                                rejected_version=rejected_version)
        except TokenUnavailable as exc:
            logs.warn("subscription_token_unavailable", work_id=ctx.item.work_id,
                      binding_id=binding.binding_id, reason=exc.reason)
            self.on_credential_failure(exc.reason)
            return exc

    @staticmethod
    def no_token(ctx: WorkContext, exc: TokenUnavailable) -> Outcome:
        """Before any checkpoint: dead for a definitive reason, else given back."""
        if definitive(exc.reason):
            return DeadLetter(exc.reason, str(exc))
        return Deferred(exc.reason, ctx.clock.now_us() + TOKEN_DEFER_US,
                        f"no access token yet ({exc}); nothing was sent")

    async def after_401(self, ctx: WorkContext, binding: BindingSettings,
                        generation: int | None, access: AccessToken | None) -> Outcome:
        """The provider refused the token: a grant's earns one refresh past the rejected
        version, and the work is retried at once; a static token cannot be refreshed."""
        if access is None or binding.auth == "static_token":
            return DeadLetter("http_401", "the provider refused the binding's static token")
        refreshed = await self.token(ctx, binding, generation,
                                     rejected_version=access.token_version)
        if isinstance(refreshed, TokenUnavailable):
            return self.no_token(ctx, refreshed)
        return RetryLater("token_rejected", "the provider refused the access token"
                          " (http_401): refreshed once, the call is retried", 0.0)

    @staticmethod
    def headers(auth_header: str, auth_prefix: str, access: AccessToken | None
                ) -> dict[str, str]:
        return {} if access is None else {auth_header: auth_prefix + access.token.reveal()}

    # ---- quota ----

    def _keys(self, binding: BindingSettings) -> tuple[tuple[quota.QuotaKey, ...], float]:
        return read_keys(self.operations, binding, clock_spread_us=self.quota_clock_spread_us)

    async def read(self, ctx: WorkContext, binding: BindingSettings, method: str, url: str,
                   headers: Mapping[str, str]) -> Answer | Deferred:
        """One provider read on the binding's quota (``httpx.HTTPError`` propagates)."""
        keys, retry_after = self._keys(binding)
        rq = ReadQuota(keys, retry_after, self.on_quota, self.on_quota_reset_ignored)
        return await quota_read(ctx, rq, functools.partial(
            self.http.request, method, url, headers=dict(headers),
            timeout_s=binding.timeout))

    async def list_subscriptions(self, ctx: WorkContext, d: SubscriptionDefinition,
                                 binding: BindingSettings, generation: int,
                                 access: AccessToken) -> list[Listed] | Outcome:
        """The provider's subscriptions, by L1's ``list`` request and pointers (one read
        on the binding's quota); an outcome when they cannot be had."""
        headers = {"Accept": d.content_type,
                   **self.headers(d.auth_header, d.auth_prefix, access)}
        try:
            answer = await self.read(ctx, binding, d.list.method,
                                           binding.base_url.rstrip("/") + d.list.path.text,
                                           headers)
        except httpx.HTTPError as exc:
            return RetryLater("list_unavailable", "the subscription list did not answer"
                              f" ({type(exc).__name__})")
        if isinstance(answer, Deferred):
            return answer
        if answer.status_code == 401:
            return await self.after_401(ctx, binding, generation, access)
        if answer.status_code != 200:
            return RetryLater("list_unavailable", "the subscription list did not answer 200"
                              f" ({answer.status_code})")
        try:
            doc = answer.json()
        except ValueError:
            return DeadLetter("bad_list", "the subscription list is not JSON")
        items = d.list.items.find(doc)
        if not isinstance(items, list):
            return DeadLetter("bad_list", "the subscription list is not what L1 declares")
        out = []
        for item in items:
            pid = identity_text(d.list.item_id.find(item))
            version = d.list.item_payload_version.find(item)
            if pid is None or not isinstance(version, int):
                return DeadLetter("bad_list", "a listed subscription has no id or version")
            out.append(Listed(Remote(
                provider_id=pid, resource=str(d.list.item_resource.find(item)),
                action=str(d.list.item_action.find(item)),
                url=str(d.list.item_url.find(item)), payload_version=version,
                active=d.list.item_active.find(item) is not False), pid))
        return out

    # ---- DoOnce ----

    async def attempts(self, ctx: WorkContext, kin: Kin | None = None
                       ) -> tuple[list[StepAttempt], list[EffectAttempt]]:
        """This step's earlier attempts, and (``kin``) every unresolved attempt of its
        kin's items (an earlier step of the same effect, dead or not), as the pure
        decision reads them; beside them, in the same read, the kin's unresolved attempts
        that other items made, as stored (a create judges their binding generation)."""
        async def read(tx: SqlTx) -> tuple[list[StepAttempt], list[EffectAttempt]]:
            own = await attempts_of(tx, ctx.item.work_id)
            ids = {a.attempt_id for a in own}
            kin_attempts = [] if kin is None else [
                a for a in await unresolved_of_kin(tx, kin) if a.attempt_id not in ids]
            return [StepAttempt(attempt_id=a.attempt_id,
                                dispatched_at_us=a.dispatch_started_at_us,
                                gave_up_at_us=a.gave_up_at_us, unresolved=a.unresolved)
                    for a in (*own, *kin_attempts)], [
                a for a in kin_attempts if a.work_id != ctx.item.work_id]

        found: tuple[list[StepAttempt], list[EffectAttempt]] = await ctx.store.db.transact(
            read, name="subscriptions.attempts", write=False)
        return found

    @staticmethod
    async def dispose_absent(ctx: WorkContext, attempt_ids: Iterable[str], note: str) -> None:
        """Committed now (fenced): the next checkpoint needs no attempt left unresolved."""
        await ctx.store.effect_dispose(ctx.fence, list(attempt_ids),
                                       Disposition.PROVEN_ABSENT, note, ctx.clock.now_us)

    @staticmethod
    def dispose_applied(ctx: WorkContext, attempt_ids: Iterable[str], note: str) -> None:
        """With the finalization, beside the row the read-back adopts."""
        ids = list(attempt_ids)
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            await dispose(tx, ids, Disposition.PROVEN_APPLIED, note, RECONCILER, now)

        ctx.on_finalize(write)

    async def send(self, ctx: WorkContext, binding: BindingSettings, *, method: str, path: str,
                   body: bytes, headers: Mapping[str, str], credential: Mapping[str, str],
                   access: AccessToken | None, generation: int | None,
                   evidence: Mapping[str, Any], guard: Guard | None = None,
                   kin: Kin | None = None) -> Sent | Outcome:
        """Reserve quota, commit the pinned checkpoint (``generation`` None: the call
        carries no binding credential; ``kin``: refused while any of its items has an
        unresolved attempt), then one exchange inside the slot. ``headers`` are the ones
        safe to keep; ``credential`` is added only to the request."""
        keys, default_retry_after_s = self._keys(binding)
        reserved = await quota.reserve(ctx.store, ctx.clock, ctx.fence, list(keys))
        if isinstance(reserved, quota.QuotaWait):
            self.on_quota("waited")
            delay = max(0.0, (reserved.until_us - ctx.clock.now_us()) / 1_000_000)
            return Deferred("quota_wait", reserved.until_us,
                            quota.waiting_summary(reserved.key, delay))
        if reserved:
            self.on_quota("reserved")
        deadline_s = client_deadline_s(binding)
        pins: dict[str, Any] = {**evidence, "binding_generation": generation}
        if reserved:
            pins["quota_reservations"] = [r.reservation_id for r in reserved]
        now = ctx.clock.now_us()
        draft = AttemptDraft(
            command_id=ctx.item.work_id, method=method, target_path=path,
            safe_headers=canonical_bytes(dict(headers)).decode(),
            body_sha256="sha256:" + hashlib.sha256(body).hexdigest(),
            idempotency_key=ctx.item.dedupe_key or ctx.item.work_id,
            pre_dispatch_evidence=canonical_bytes(pins).decode(),
            give_up_after_us=int(deadline_s * 1_000_000) + quota.slot_wait_us(reserved, now))

        async def checkpoint(tx: SqlTx) -> str | DeadLetter:
            if guard is not None:
                refusal = await guard(tx)
                if refusal is not None:
                    return refusal
            # The attempt's start and give-up deadline at the time the fenced transaction
            # runs (as the fence is judged), not at the reading before a wait for it: an
            # earlier deadline would end the in-flight window too soon.
            started = ctx.clock.now_us()
            attempt_id = new_ulid(started)
            if await insert_attempt_pinned(tx, attempt_id, ctx.fence, draft, started,
                                           binding_id=binding.binding_id,
                                           binding_generation=generation, kin=kin):
                return attempt_id
            return DeadLetter("binding_generation", f"binding {binding.binding_id} is no"
                              f" longer connected at generation {generation} (reconnected,"
                              " reinstalled or disconnected since the step was queued),"
                              " or an attempt of this step (or of an earlier step of the"
                              " same effect) is unresolved: nothing was sent")

        attempt = await ctx.fenced(checkpoint, name="subscriptions.checkpoint")
        if isinstance(attempt, DeadLetter):
            if reserved:  # nothing was sent on them: the slots come back
                at = ctx.clock.now_us()
                await quota.move_reservations(ctx.store, ctx.fence, reserved,
                                              ReservationState.RELEASED, ctx.clock.now_us)
                await quota.give_back_unsent(ctx.store, reserved,
                                             DispatchObservation(Phase.NOT_CONNECTED), at)
            return attempt
        # The checkpoint is committed: only now may bytes leave, and only inside the slot.
        doc: Any = None
        if reserved and not await quota.wait_for_slots(ctx.clock, reserved):
            seen = DispatchObservation(Phase.NOT_CONNECTED, detail=SEND_WINDOW_CLOSED)
        else:
            may_send = (lambda: quota.still_usable(reserved, ctx.clock.now_us())
                        ) if reserved else None
            names = tuple(sorted({h for r in reserved
                                  for h in (r.key.remaining_header, r.key.reset_header) if h}))
            with trio.move_on_after(deadline_s) as waited:
                seen, doc = await exchange(
                    self.http, method, binding.base_url.rstrip("/") + path,
                    headers={**headers, **credential}, body=body or None,
                    timeout_s=binding.timeout, may_send=may_send, quota_headers=names)
            if waited.cancelled_caught:
                seen, doc = DispatchObservation(Phase.SENT, detail="ClientDeadline"), None
        if reserved:
            seen = await self._settle_quota(ctx, reserved, seen, attempt,
                                            default_retry_after_s)
        return Sent(attempt, seen, doc, access)

    async def _settle_quota(self, ctx: WorkContext, reserved: list[quota.Reserved],
                            seen: DispatchObservation, attempt_id: str,
                            default_s: float) -> DispatchObservation:
        """As the effect runner does after a dispatch (:func:`quota.settle_after_dispatch`);
        a 429 without a Retry-After takes the reset it was given, else ``default_s``."""
        reset_s = await quota.settle_after_dispatch(
            ctx.store, reserved, seen, attempt_id, default_retry_after_s=default_s,
            now_us=ctx.clock.now_us(), on_finalize=ctx.on_finalize, on_quota=self.on_quota,
            on_ignored=self.on_quota_reset_ignored)
        if seen.status == 429 and seen.retry_after_s is None:
            seen = attrs.evolve(seen, retry_after_s=reset_s if reset_s is not None
                                else default_s)
        return seen

    @staticmethod
    def record(ctx: WorkContext, attempt_id: str, verdict: Classification,
               seen: DispatchObservation) -> None:
        """The attempt's one outcome, with the finalization (only under the live fence)."""
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            await record_outcome(tx, attempt_id, outcome=verdict.outcome.value,
                                 evidence=verdict.evidence.value, response_status=seen.status,
                                 provider_evidence={}, failure_class=verdict.failure_class,
                                 gave_up_at_us=now, now_us=now)

        ctx.on_finalize(write)
