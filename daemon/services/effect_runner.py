"""The ``external_effect`` work family: drive one ExternalCommand to a terminal result.

Theory of operation (DoOnce)
----------------------------
This module is the shell around :mod:`daemon.core.effect_step`, where every
rule of one claim lives (read it first). Each claim reads its context once
(command with its pins, attempts, the pinned remote link), builds a
:class:`~daemon.core.effect_step.ClaimView` with the operation definition the
command pinned and the request the executor prepared, and performs the one
step :func:`~daemon.core.effect_step.decide` returns:

* ``Reconcile``: read the pinned record back, then decide again with it;
* ``RecordAbsent``: commit the proven-absent dispositions, re-read, decide again;
* ``Dispatch``: get the token and the quota slots, write the fenced
  dispatch-start checkpoint carrying the request's pins and commit it (a pin
  that moved since the context read refuses it: nothing is written or sent, the
  slots come back, and the refusal settles as any refusal before dispatch),
  send exactly one request, classify the observation, and perform the step
  :func:`~daemon.core.effect_step.after_attempt` returns. The classification
  (and, when it is terminal, the settlement and the queued receipt) commit in
  the same transaction that finalizes the WorkItem, only if its fence still
  holds (``WorkContext.on_finalize``): one batched commit after the call;
* ``SettleSuccess`` / ``SettleNoEffect``: persist the result, forbid further
  dispatch and queue the receipt for the Runtime, with the finalization; the
  item *completes* (a settled command leaves nothing for an operator);
* ``Blocked``: the item is dead with the step's reason, for an operator;
* ``Wait``: retry later; ``Nothing``: skipped;
* ``Requeue``: our own quota or send gate held the request back (nothing left):
  the claim is given back unstarted at once, its attempt refunded (a deferral).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import trio

from config.catalog import Catalog, OperationDefinition
from config.settings import BindingSettings
from daemon.core.canonical import canonical_bytes
from daemon.core.effect_step import (
    AttemptView,
    BindingView,
    Blocked,
    ClaimView,
    CommandView,
    Dispatch,
    DispatchPins,
    LinkView,
    Nothing,
    OperationView,
    Readback,
    Reconcile,
    RecordAbsent,
    Requeue,
    SettleNoEffect,
    SettleSuccess,
    Step,
    Wait,
    after_attempt,
    credential_refusal,
    decide,
    refused_before_dispatch,
)
from daemon.core.effects import (
    Classification,
    DispatchObservation,
    OutcomeClass,
    Phase,
    classify,
)
from daemon.core.handoff import (
    RESULT_FORMAT_NO_EFFECT,
    RESULT_FORMAT_SUCCESS,
    NoEffectResult,
)
from daemon.core.outcomes import (
    DeadLetter,
    Deferred,
    Outcome,
    RetryLater,
    Skipped,
    Succeeded,
)
from daemon.core.work import WorkItem
from daemon.providers.executor import (
    MODIFIED_AT,
    SEND_WINDOW_CLOSED,
    BadRequestForOperation,
    HttpExecutor,
    PreparedRequest,
    desired_fields,
    prepare,
)
from daemon.services import effect_quota as quota
from daemon.services import logs
from daemon.services.batcher import Batcher
from daemon.services.catalog_view import CatalogView
from daemon.services.checkpoints import CheckpointBatcher
from daemon.services.credentials import Credentials, definitive
from daemon.services.families import Handler, WorkContext
from daemon.services.per_user import command_binding
from daemon.services.token_refresh import AccessToken, TokenUnavailable
from storage.effect_values import (
    AttemptDraft,
    BindingNow,
    Command,
    Disposition,
    EffectAttempt,
    RemoteLink,
    Settlement,
)
from storage.effects import (
    RECEIPT_FAMILY,
    DispatchRefused,
    EffectContextRow,
    attempts_of,
    dispose,
    read_binding_now,
    record_outcome,
    settle,
)
from storage.links import read_link
from storage.port import SqlTx
from storage.work_store import WorkStore

# How many decide/perform rounds one claim may take (reconcile, record absence,
# dispatch): a bound, so a bug can never loop.
_MAX_ROUNDS = 4
# A claim that got no access token before its dispatch checkpoint, for a reason a wait
# can cure (a refresh still running elsewhere, a timeout, a malformed answer), is given
# back unstarted for this long.
TOKEN_DEFER_US = 2_000_000


@attrs.frozen
class EffectContext:
    """Everything one claim needs, read once."""

    command: Command
    attempts: list[EffectAttempt]
    operation: OperationDefinition | None
    binding: BindingSettings | None
    link: RemoteLink | None
    # The Catalog revision the command pinned, as stored (None: not stored any more).
    pinned: Catalog | None = None
    # The binding's durable PrincipalBinding now (None: it has no row).
    principal: BindingNow | None = None


def _client_deadline_s(binding: BindingSettings) -> float:
    """When the client gives up on an exchange at the latest: waiting for a free
    connection and the request each take at most the binding's timeout."""
    return 2 * binding.timeout


def _desired(op: OperationDefinition | None, command: Command) -> dict[str, str | None]:
    """The values the command asks for (what a read-back must show), where the pinned
    operation's definition says the frozen request holds them (none if it cannot say)."""
    if op is None:
        return {}
    try:
        return desired_fields(op, json.loads(command.frozen_request))
    except BadRequestForOperation:
        return {}


def command_view(command: Command) -> CommandView:
    return CommandView(
        command_id=command.command_id, settlement=command.settlement.value,
        intent_kind=command.intent_kind, binding_generation=command.binding_generation,
        link_key=command.link_key, link_generation=command.link_generation,
        remote_id=command.remote_id)


# The pre-dispatch evidence key of the link's last-modified time (see _dispatch).
LINK_MODIFIED_AT = "link_modified_at_us"


def _unchanged_since(pre_dispatch_evidence: str) -> int | None:
    """The link's last-modified time an attempt's pins recorded, if any."""
    try:
        pins = json.loads(pre_dispatch_evidence)
    except ValueError:
        return None
    value = pins.get(LINK_MODIFIED_AT) if isinstance(pins, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def attempt_view(a: EffectAttempt) -> AttemptView:
    return AttemptView(attempt_id=a.attempt_id, outcome=a.outcome, evidence=a.evidence,
                       disposition=a.disposition, dispatched_at_us=a.dispatch_started_at_us,
                       gave_up_at_us=a.gave_up_at_us, failure_class=a.failure_class,
                       unchanged_since_us=_unchanged_since(a.pre_dispatch_evidence))


def operation_view(op: OperationDefinition) -> OperationView:
    replay = op.contract.replay
    return OperationView(name=op.name, intent_kinds=op.intent_kinds,
                         max_in_flight_s=op.contract.max_in_flight_s,
                         max_clock_skew_s=op.contract.max_clock_skew_s,
                         replay_retention_s=replay.retention_s if replay is not None else None)


def binding_view(b: BindingSettings, now: BindingNow, *, grants: bool = False) -> BindingView:
    """``grants``: token keys are loaded, so a grant can be opened."""
    grant = b.auth in ("grant", "s2s")  # a token from the AuthorizationGrant
    return BindingView(generation=now.generation, connected=now.connected,
                       # A grant's token is checked when it is needed (its state, expiry).
                       has_token=grants if grant else b.token is not None,
                       refreshable=grant and grants,
                       client_deadline_s=_client_deadline_s(b), max_in_flight_s=b.max_in_flight,
                       max_clock_skew_s=b.max_clock_skew)


def link_view(link: RemoteLink) -> LinkView:
    return LinkView(state=link.state.value, generation=link.generation,
                    remote_id=link.remote_id)


@attrs.define(eq=False)
class EffectRunner:
    # The current Catalog (what the configuration serves). Every definition comes from
    # the pinned revision; the binding's generation from its durable PrincipalBinding.
    catalog: Catalog
    catalogs: CatalogView
    executor: HttpExecutor
    receipt_max_attempts: int
    # Called with (operation, outcome class) after every external call.
    on_attempt: Callable[[str, str], None] = lambda operation, outcome: None
    # Group commit for checkpoints; None commits each one on its own.
    checkpoints: CheckpointBatcher | None = None
    # Shared context reads; None reads each one on its own.
    contexts: Batcher[tuple[str, str], EffectContextRow | None] | None = None
    # Where access tokens come from (a static token, or a grant through the token owner).
    credentials: Credentials = attrs.Factory(Credentials)
    # Called with a stable reason when an effect finds no usable token.
    on_credential_failure: Callable[[str], None] = lambda reason: None
    # Called with a quota event (reserved, waited, throttled, given_back, corrected,
    # exhausted).
    on_quota: Callable[[str], None] = lambda event: None
    # A provider reset header that was not used, by reason (malformed, negative, ...).
    on_quota_reset_ignored: Callable[[str], None] = lambda reason: None
    # work.clock_spread, in us: the quota schedule's margin for the replicas' clocks.
    quota_clock_spread_us: int = 0
    # This process's quota admission hints (one grant at a time per key, the ledger's
    # last "no slot before then", and when claims given back come back).
    quota_hints: quota.QuotaHints = attrs.Factory(quota.QuotaHints)

    async def _definitions(self, command: Command) -> tuple[
            Catalog | None, OperationDefinition | None, BindingSettings | None]:
        """The command's operation and binding from exactly its pinned revision
        (cached after the first read: a revision never changes)."""
        pinned = await self.catalogs.pinned(command.catalog_revision, command.catalog_digest)
        if pinned is None:
            return None, None, None
        op = pinned.operation(command.operation)
        return pinned, op, command_binding(pinned, command, op)

    async def _context(self, ctx: WorkContext, command_id: str,
                       link_hint: str = "") -> EffectContext | None:
        """Read once. With the link key admission put in the payload (``link_hint``),
        the command, its attempt count and the link come in one read, shared with
        other handlers' reads (``contexts``); the attempts are read only when there
        are any. The link read is always the one the command pinned."""
        if not link_hint:
            return await self._context_unhinted(ctx, command_id)
        request = (command_id, link_hint)
        if self.contexts is not None:
            found = await self.contexts.submit(request)
        else:
            (found,) = await ctx.store.effect_contexts([request])
        if found is None:
            return None
        command, attempt_count, hinted, principal = found
        pinned, op, binding = await self._definitions(command)
        key = command.link_key
        if not attempt_count and key == link_hint:
            return EffectContext(command, [], op, binding, hinted, pinned, principal)

        async def rest(tx: SqlTx) -> tuple[RemoteLink | None, list[EffectAttempt]]:
            link = hinted if key == link_hint else (await read_link(tx, key) if key else None)
            return link, (await attempts_of(tx, command_id) if attempt_count else [])

        link, attempts = await ctx.store.db.transact(rest, name="effect.context", write=False)
        return EffectContext(command, attempts, op, binding, link, pinned, principal)

    async def _context_unhinted(self, ctx: WorkContext, command_id: str) -> EffectContext | None:
        command = await ctx.store.command_get(command_id)
        if command is None:
            return None
        pinned, op, binding = await self._definitions(command)

        async def body(tx: SqlTx) -> tuple[RemoteLink | None, list[EffectAttempt],
                                           BindingNow | None]:
            link = await read_link(tx, command.link_key) if command.link_key else None
            return (link, await attempts_of(tx, command_id),
                    await read_binding_now(tx, command.binding_id))

        link, attempts, principal = await ctx.store.db.transact(body, name="effect.context",
                                                                write=False)
        return EffectContext(command, attempts, op, binding, link, pinned, principal)

    def _view(self, ctx: WorkContext, ec: EffectContext | None
              ) -> ClaimView[PreparedRequest]:
        if ec is None:
            return ClaimView(command=None, operation=None, binding=None, link=None)
        command, op, binding = ec.command, ec.operation, ec.binding
        request: PreparedRequest | None = None
        error = ""
        if op is not None and binding is not None and command.remote_id is not None:
            try:
                request = prepare(op, binding, command.remote_id,
                                  json.loads(command.frozen_request),
                                  idempotency_key=command.command_id)
            except BadRequestForOperation as exc:
                error = str(exc)
        # The pinned revision defines the binding; its generation and state are the
        # durable PrincipalBinding's now (what the generation check compares with the pin).
        # A binding this configuration no longer serves is missing, whatever its row says.
        served = command_binding(self.catalog, command, op) is not None
        return ClaimView(
            command=command_view(command),
            operation=operation_view(op) if op is not None else None,
            binding=(binding_view(binding, ec.principal,
                                  grants=self.credentials.owner is not None)
                     if binding is not None and served and ec.principal is not None
                     else None),
            catalog_refusal=None if ec.pinned is not None else (
                "catalog_revision_unavailable",
                f"the pinned Catalog revision {command.catalog_revision}"
                f" ({command.catalog_digest or 'no digest'}) is not stored"),
            link=link_view(ec.link) if ec.link is not None else None,
            attempts=tuple(attempt_view(a) for a in ec.attempts),
            request=request, request_error=error, desired=_desired(op, command),
            now_us=ctx.clock.now_us(),
        )

    async def handle(self, ctx: WorkContext) -> Outcome:
        payload = json.loads(ctx.item.payload)
        command_id = str(payload["command_id"])
        hint = str(payload.get("link_key") or "")
        ec = await self._context(ctx, command_id, hint)
        view = self._view(ctx, ec)
        for _ in range(_MAX_ROUNDS):
            step = decide(view)
            match step:
                case Reconcile():
                    assert ec is not None
                    readback = await self._read(ctx, ec, step)
                    view = attrs.evolve(view, readback=readback, now_us=ctx.clock.now_us())
                case RecordAbsent(attempt_ids=ids):
                    # Committed now: the dispatch that follows needs it in place.
                    await ctx.store.effect_dispose(
                        ctx.fence, list(ids), Disposition.PROVEN_ABSENT,
                        "unmodified since before dispatch, window passed",
                        ctx.clock.now_us)
                    ec = await self._context(ctx, command_id, hint)
                    view = self._view(ctx, ec)
                case Dispatch(request=request):
                    assert ec is not None
                    return await self._dispatch(ctx, ec, view, request)
                case _:
                    assert ec is not None or isinstance(step, Blocked)
                    return self._perform(ctx, ec, step)
        return RetryLater("effect_step_rounds", "no terminal step within one claim")

    # ----------------------------------------------------------- perform

    def _perform(self, ctx: WorkContext, ec: EffectContext | None,
                 step: Step[PreparedRequest]) -> Outcome:
        match step:
            case Nothing(reason=reason):
                return Skipped(reason)
            case Blocked(code=code, sentence=sentence):
                return DeadLetter(code, sentence)
            case Wait(code=code, sentence=sentence, delay_s=delay):
                return RetryLater(code, sentence, delay)
            case Requeue(code=code, sentence=sentence):
                # Contention of ours, not a failure: back unstarted, its attempt refunded.
                return Deferred(code, ctx.clock.now_us(), sentence)
            case SettleSuccess(remote_id=remote_id, proven_applied=ids,
                               modified_at_us=modified):
                assert ec is not None
                if ids:
                    now = ctx.clock.now_us()

                    async def proven(tx: SqlTx) -> None:
                        await dispose(tx, list(ids), Disposition.PROVEN_APPLIED,
                                      "read-back shows the desired values", "reconciler", now)

                    ctx.on_finalize(proven)
                self._settle_on_finalize(ctx, ec.command, Settlement.SUCCEEDED,
                                         RESULT_FORMAT_SUCCESS, remote_id, "", "",
                                         modified_at_us=modified)
                return Succeeded("applied; success result sent")
            case SettleNoEffect(code=code, sentence=sentence, reason=reason):
                assert ec is not None
                result = NoEffectResult(reason)
                self._settle_on_finalize(ctx, ec.command, Settlement.NO_EFFECT,
                                         RESULT_FORMAT_NO_EFFECT, "",
                                         result.canonical.decode(), result.digest)
                return Succeeded(f"{sentence}; no-effect result ({reason.value}) sent",
                                 terminal_outcome="no_effect", failure_class=code)
        raise AssertionError(f"step {step!r} is not performed here")

    async def _token(self, ctx: WorkContext, ec: EffectContext,
                     rejected_version: int | None = None) -> AccessToken:
        """The access token of the pinned binding generation (read-back and dispatch)."""
        assert ec.binding is not None and ec.command.binding_generation is not None
        return await self.credentials.token(ctx.fence, ec.binding,
                                            ec.command.binding_generation,
                                            rejected_version=rejected_version)

    async def _read(self, ctx: WorkContext, ec: EffectContext, step: Reconcile) -> Readback:
        op, binding, remote_id = ec.operation, ec.binding, ec.command.remote_id
        assert op is not None and binding is not None
        assert remote_id is not None
        try:
            access = await self._token(ctx, ec)
        except TokenUnavailable as exc:
            return Readback(None, exc.reason)
        try:
            snapshot = await self.executor.read(op, binding, remote_id, list(step.fields),
                                                access.token.reveal(), binding.timeout)
        except (httpx.HTTPError, LookupError, ValueError) as exc:
            return Readback(None, type(exc).__name__)
        return Readback(snapshot)

    # ----------------------------------------------------------- dispatch

    async def _dispatch(self, ctx: WorkContext, ec: EffectContext,
                        view: ClaimView[PreparedRequest], prepared: PreparedRequest) -> Outcome:
        command, op, binding, link = ec.command, ec.operation, ec.binding, ec.link
        assert op is not None and binding is not None
        assert link is not None and ec.principal is not None
        # The token first: nothing is written, nor sent, without one.
        try:
            access = await self._token(ctx, ec)
        except TokenUnavailable as exc:
            return self._no_token(ctx, ec, view, exc, pre_dispatch=True)
        # Then one slot of every quota key the provider declares, bound to this claim.
        reserved = await quota.reserve(ctx.store, ctx.clock, ctx.fence,
                                       quota.quota_keys(
                                           op, binding,
                                           clock_spread_us=self.quota_clock_spread_us),
                                       self.quota_hints)
        if isinstance(reserved, quota.QuotaWait):
            # Before the checkpoint: nothing was started, so the claim is given back
            # for its turn (the earliest time the ledger allows, or after the claims
            # already told that time: quota.QuotaHints), its attempt refunded.
            self.on_quota("waited")
            turn = self.quota_hints.turn(reserved)
            delay = max(0.0, (turn - ctx.clock.now_us()) / 1_000_000)
            return Deferred("quota_wait", turn, quota.waiting_summary(reserved.key, delay))
        pins: dict[str, Any] = {
            "binding_generation": ec.principal.generation,
            "catalog_revision": command.catalog_revision,
            "link_generation": link.generation,
            "link_key": link.link_key,
            "remote_id": command.remote_id,
        }
        if reserved:  # the quota slots this attempt is sent on (pre-dispatch evidence)
            pins["quota_reservations"] = [r.reservation_id for r in reserved]
        if link.modified_at_us is not None:
            # The record as our latest accepted change left it, known before this
            # dispatch: a read-back still showing it proves this one absent.
            pins[LINK_MODIFIED_AT] = link.modified_at_us
        evidence = canonical_bytes(pins).decode()
        if reserved:
            self.on_quota("reserved")
        assert ec.pinned is not None and command.binding_generation is not None
        assert command.link_key is not None and command.remote_id is not None
        assert command.link_generation is not None
        draft = AttemptDraft(
            # What this request was built for; the checkpoint refuses it unless every
            # pin is still current when it commits (a rebind, reconnect or reinstall
            # during the waits above stops it there).
            pins=DispatchPins(
                binding_generation=command.binding_generation, link_key=command.link_key,
                link_generation=command.link_generation, remote_id=command.remote_id,
                catalog_revision=ec.pinned.revision, catalog_digest=ec.pinned.digest),
            command_id=command.command_id, method=prepared.method,
            target_path=prepared.path,
            safe_headers=canonical_bytes(prepared.safe_headers).decode(),
            body_sha256=prepared.body_sha256, idempotency_key=prepared.idempotency_key,
            pre_dispatch_evidence=evidence,
            # The wait for a future slot comes after the checkpoint: the bound includes it.
            give_up_after_us=int(_client_deadline_s(binding) * 1_000_000)
            + quota.slot_wait_us(reserved, ctx.clock.now_us()),
        )
        try:
            if self.checkpoints is not None:
                attempt_id = await self.checkpoints.checkpoint(ctx.fence, draft)
            else:
                attempt_id = await ctx.store.effect_checkpoint(ctx.fence, draft,
                                                               ctx.clock.now_us)
        except DispatchRefused as refused:
            # A pin moved after the context read: no attempt was written, nothing left.
            # Refused before dispatch, as the next claim's decide would refuse it.
            logs.warn("effect_dispatch_refused", command_id=command.command_id,
                      work_id=ctx.item.work_id, epoch=ctx.fence.ownership_epoch,
                      reason=refused.code)
            if reserved:
                await quota.release_unused(ctx.store, ctx.fence, reserved,
                                           ctx.clock.now_us)
            return self._perform(ctx, ec, refused_before_dispatch(view, refused.code,
                                                                  refused.sentence))
        # The checkpoint is committed: only now may bytes leave.
        self.quota_hints.prepared(reserved, ctx.clock.now_us())
        # One deadline for the whole exchange (a free connection, then the request):
        # the give-up bound the checkpoint recorded is then true.
        if reserved and not await quota.wait_for_slots(ctx.clock, reserved):
            # The checkpoint (or the wake-up) outlasted a slot's jitter: sending now could
            # land in a window the schedule did not give it. Nothing leaves; the slots
            # come back.
            seen = DispatchObservation(Phase.HELD, detail=SEND_WINDOW_CLOSED)
            provider_evidence: dict[str, Any] = {}
        else:
            # And once more as the first byte is about to leave: a free connection, a
            # connect and the event loop's lag all come after the check above.
            may_send = (lambda: quota.still_usable(reserved, ctx.clock.now_us())
                        ) if reserved else None
            with trio.move_on_after(_client_deadline_s(binding)) as deadline:
                seen, provider_evidence = await self.executor.dispatch(
                    prepared, access.token.reveal(), binding.timeout, may_send)
            if deadline.cancelled_caught:
                seen, provider_evidence = DispatchObservation(
                    Phase.SENT, detail="ClientDeadline",
                    idempotency_header=prepared.idempotency_header), {}
        verdict = classify(op.contract, seen)
        self.on_attempt(op.name, verdict.outcome.value)
        logs.debug("effect_attempt", command_id=command.command_id, attempt_id=attempt_id,
                   work_id=ctx.item.work_id, epoch=ctx.fence.ownership_epoch,
                   outcome=verdict.outcome.value, status=seen.status, detail=seen.detail)
        self._record(ctx, attempt_id, verdict, seen, provider_evidence)
        if reserved:
            # A 429's delay: its Retry-After; without one, the reset header L1 names; else
            # L1's default.
            reset_s = await quota.settle_after_dispatch(
                ctx.store, reserved, seen, attempt_id,
                default_retry_after_s=op.contract.default_retry_after_s,
                now_us=ctx.clock.now_us(), on_finalize=ctx.on_finalize,
                on_quota=self.on_quota, on_ignored=self.on_quota_reset_ignored)
            if reset_s is not None:  # the work comes back when the provider resets
                verdict = attrs.evolve(verdict, retry_after_s=reset_s)
        step = after_attempt(view, verdict, seen.detail or str(seen.status))
        modified = provider_evidence.get(MODIFIED_AT)
        if isinstance(step, SettleSuccess) and verdict.outcome is OutcomeClass.ACCEPTED \
                and isinstance(modified, int) and not isinstance(modified, bool):
            step = attrs.evolve(step, modified_at_us=modified)
        if isinstance(step, Wait) and step.code == "token_rejected":
            # One refresh now, under this claim's fence; the retry uses the new version.
            try:
                await self._token(ctx, ec, rejected_version=access.token_version)
            except TokenUnavailable as exc:
                return self._no_token(ctx, ec, view, exc, verdict)
        return self._perform(ctx, ec, step)

    def _no_token(self, ctx: WorkContext, ec: EffectContext, view: ClaimView[PreparedRequest],
                  exc: TokenUnavailable, verdict: Classification | None = None, *,
                  pre_dispatch: bool = False) -> Outcome:
        """No token: a definitive reason settles the work with it (fail closed, alerted);
        anything else (a refresh still running elsewhere, a timeout, a malformed answer)
        waits. Before the dispatch checkpoint the wait is a deferral (nothing was
        started: the claim goes back unstarted, its attempt refunded, journaled with the
        reason), so no number of slow refreshes can exhaust ``max_attempts``."""
        logs.warn("effect_token_unavailable", command_id=ec.command.command_id,
                  binding_id=ec.command.binding_id, reason=exc.reason)
        self.on_credential_failure(exc.reason)
        if definitive(exc.reason):
            return self._perform(ctx, ec, credential_refusal(view, exc.reason, str(exc),
                                                             verdict))
        if pre_dispatch:
            return Deferred(exc.reason, ctx.clock.now_us() + TOKEN_DEFER_US,
                            f"no access token yet ({exc}); nothing was sent")
        return RetryLater(exc.reason, str(exc), 5.0)

    def _record(self, ctx: WorkContext, attempt_id: str, verdict: Classification,
                seen: DispatchObservation, provider_evidence: dict[str, Any]) -> None:
        # The exchange is over (answered, or the client gave up on it) now.
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            await record_outcome(tx, attempt_id, outcome=verdict.outcome.value,
                                 evidence=verdict.evidence.value,
                                 response_status=seen.status,
                                 provider_evidence=provider_evidence,
                                 failure_class=verdict.failure_class, gave_up_at_us=now,
                                 now_us=now, exchange=None if seen.exchange is None
                                 else seen.exchange.to_json())

        ctx.on_finalize(write)

    def _settle_on_finalize(self, ctx: WorkContext, command: Command, settlement: Settlement,
                            result_format: int, remote_id: str, canonical: str,
                            digest: str, *, modified_at_us: int | None = None) -> None:
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            await settle(tx, command_id=command.command_id, command=command,
                         settlement=settlement,
                         result_format_version=result_format, remote_id=remote_id,
                         canonical_result=canonical, result_digest=digest,
                         receipt_max_attempts=self.receipt_max_attempts, now_us=now,
                         modified_at_us=modified_at_us)

        ctx.on_finalize(write)
        if command.handoff_key is not None:
            ctx.wake_after_finalize(RECEIPT_FAMILY)  # the receipt goes out at once


async def replay_refusal(catalogs: CatalogView, store: WorkStore,
                         item: WorkItem) -> str | None:
    """Seed 10, the configuration's half of the replay guard: the command's pinned
    operation and binding must still be served by the current configuration
    (identity/authority ambiguous otherwise: issue a repair command).

    It reads only what never changes on a command (its binding id and operation).
    Everything that does change (settlement, repair, unresolved or applied attempts,
    a newer intent, the binding generation, the pinned Catalog revision against the
    current one, which the caller resolved explicitly and passes with the replay) is
    decided inside the replay's own transaction, after it took the command's row
    (:mod:`storage.command_operator`): a check here would be advice, not a guard."""
    payload = json.loads(item.payload)
    command = await store.command_get(str(payload.get("command_id", "")))
    if command is None:
        return "its command is missing"
    current = catalogs.current
    if command_binding(current, command, current.operation(command.operation)) is None:
        return ("the command's binding is not configured for its operation in the current"
                " Catalog revision; issue a repair command instead")
    return None


def effect_handler(runner: EffectRunner) -> Handler:
    async def handle(ctx: WorkContext) -> Outcome:
        return await runner.handle(ctx)

    return handle
