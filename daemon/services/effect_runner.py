"""The ``external_effect`` work family: drive one ExternalCommand to a terminal result.

Theory of operation (DoOnce)
----------------------------
Each claim of a command's WorkItem reads its context once (command, attempts,
remote link) and then does at most one of these, in order:

1. The command is already settled: nothing to do (replays are harmless).
2. An earlier attempt is unresolved (dispatched, outcome unknown, or a crash
   after the checkpoint): *reconcile*. Read the remote record back; applied
   -> settle with a success result; proven absent -> record that and go on
   to dispatch; unproven -> retry later, and after the attempts are spent the
   item is dead, awaiting an operator's disposition. Never a blind resend.
3. An attempt was accepted (or proven applied) but the result was not yet
   persisted: settle with a success result.
4. Pre-dispatch checks (catalog operation, pinned binding generation still
   current, an active remote link, the request fits the definition): a
   failure settles with ``NO_EFFECT`` when the evidence allows it, never by
   converting an ambiguous history.
5. Dispatch: write the fenced dispatch-start checkpoint and commit it, send
   exactly one request, classify the observation. The classification (and,
   when it is terminal, the settlement and the queued receipt) commit in the
   same transaction that finalizes the WorkItem, only if its fence still
   holds (``WorkContext.on_finalize``): one batched commit after the call.

Settling persists the result and forbids further dispatch in the same
transaction that queues the receipt for the Runtime.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
import httpx

from config.catalog import Catalog, OperationDefinition
from config.settings import BindingSettings
from daemon.core.canonical import canonical_bytes
from daemon.core.effects import (
    Classification,
    DispatchObservation,
    OutcomeClass,
    Reconciled,
    RemoteSnapshot,
    classify,
    reconcile,
)
from daemon.core.handoff import (
    RESULT_FORMAT_NO_EFFECT,
    RESULT_FORMAT_SUCCESS,
    NoEffectReason,
    NoEffectResult,
)
from daemon.core.identity import integration_link_key_v2, integration_scope_digest
from daemon.core.outcomes import DeadLetter, Outcome, RetryLater, Skipped, Succeeded
from daemon.core.work import WorkItem
from daemon.providers.executor import (
    BadRequestForOperation,
    HttpExecutor,
    desired_fields,
    prepare,
)
from daemon.services import logs
from daemon.services.batcher import Batcher
from daemon.services.checkpoints import CheckpointBatcher
from daemon.services.families import Handler, WorkContext
from storage.commands import read_command
from storage.effect_values import (
    APPLIED_DISPOSITIONS,
    AttemptDraft,
    Command,
    Disposition,
    EffectAttempt,
    RemoteLink,
    Settlement,
)
from storage.effects import (
    RECEIPT_FAMILY,
    EffectContextRow,
    attempts_of,
    dispose,
    record_outcome,
    settle,
)
from storage.links import read_link
from storage.port import SqlTx
from storage.work_store import WorkStore

# Outcome classes that prove an attempt had no external effect.
_NO_EFFECT_OUTCOMES = frozenset({
    OutcomeClass.REJECTED, OutcomeClass.RETRYABLE_PRE_DISPATCH, OutcomeClass.REPLAY_SAFE_RETRY,
})


def no_effect_reason(history: list[tuple[str | None, str | None]]) -> NoEffectReason | None:
    """The reason a no-effect result may be claimed, from every attempt's
    (outcome, disposition); None when the history does not prove it."""
    if all(outcome == OutcomeClass.RETRYABLE_PRE_DISPATCH for outcome, _ in history):
        return NoEffectReason.REJECTED_BEFORE_DISPATCH  # also: no attempt at all
    for outcome, disposition in history:
        if disposition is not None:
            if disposition in APPLIED_DISPOSITIONS:
                return None
            continue
        if outcome is None or outcome not in _NO_EFFECT_OUTCOMES:
            return None
    return NoEffectReason.DEFINITIVE_NO_EFFECT


def _history(attempts: list[EffectAttempt]) -> list[tuple[str | None, str | None]]:
    return [(a.outcome, a.disposition) for a in attempts]


@attrs.frozen
class EffectContext:
    """Everything one claim needs, read once."""

    command: Command
    attempts: list[EffectAttempt]
    operation: OperationDefinition | None
    binding: BindingSettings | None
    link: RemoteLink | None

    @property
    def remote_id(self) -> str | None:
        if self.link is None or self.link.state.value != "active":
            return None
        return self.link.remote_id


def _scope_digest(binding: BindingSettings) -> str:
    return integration_scope_digest(binding.org_id, binding.app_installation_id,
                                    binding.provider, binding.remote_account_id)


@attrs.define(eq=False)
class EffectRunner:
    catalog: Catalog
    executor: HttpExecutor
    receipt_max_attempts: int
    # Called with (operation, outcome class) after every external call.
    on_attempt: Callable[[str, str], None] = lambda operation, outcome: None
    # Group commit for checkpoints; None commits each one on its own.
    checkpoints: CheckpointBatcher | None = None
    # Shared context reads; None reads each one on its own.
    contexts: Batcher[tuple[str, str], EffectContextRow | None] | None = None

    async def _context(self, ctx: WorkContext, command_id: str,
                       link_hint: str = "") -> EffectContext | None:
        """Read once. With the link key admission put in the payload (``link_hint``),
        the command, its attempt count and the link come in one read, shared with
        other handlers' reads (``contexts``); the attempts are read only when there
        are any. The key computed from the current binding still decides."""
        if not link_hint:
            return await self._context_unhinted(ctx, command_id)
        request = (command_id, link_hint)
        if self.contexts is not None:
            found = await self.contexts.submit(request)
        else:
            (found,) = await ctx.store.effect_contexts([request])
        if found is None:
            return None
        command, attempt_count, hinted = found
        op = self.catalog.operation(command.operation)
        binding = self.catalog.binding(command.binding_id)
        key = (integration_link_key_v2(_scope_digest(binding), op.local_object, command.local_id)
               if op is not None and binding is not None else None)
        if not attempt_count and key == link_hint:
            return EffectContext(command, [], op, binding, hinted)

        async def rest(tx: SqlTx) -> tuple[RemoteLink | None, list[EffectAttempt]]:
            link = hinted if key == link_hint else (await read_link(tx, key) if key else None)
            return link, (await attempts_of(tx, command_id) if attempt_count else [])

        link, attempts = await ctx.store.db.transact(rest, name="effect.context", write=False)
        return EffectContext(command, attempts, op, binding, link)

    async def _context_unhinted(self, ctx: WorkContext, command_id: str) -> EffectContext | None:
        async def body(tx: SqlTx) -> EffectContext | None:
            command = await read_command(tx, command_id)
            if command is None:
                return None
            op = self.catalog.operation(command.operation)
            binding = self.catalog.binding(command.binding_id)
            link = None
            if op is not None and binding is not None:
                link = await read_link(tx, integration_link_key_v2(
                    _scope_digest(binding), op.local_object, command.local_id))
            return EffectContext(command, await attempts_of(tx, command_id), op, binding, link)

        return await ctx.store.db.transact(body, name="effect.context", write=False)

    async def handle(self, ctx: WorkContext) -> Outcome:
        payload = json.loads(ctx.item.payload)
        command_id = str(payload["command_id"])
        ec = await self._context(ctx, command_id, str(payload.get("link_key") or ""))
        if ec is None:
            return DeadLetter("missing_command", f"no command {command_id}")
        if ec.command.settlement is not Settlement.OPEN:
            return Skipped(f"command already {ec.command.settlement.value}")
        if any(a.unresolved for a in ec.attempts):
            outcome = await self._reconcile(ctx, ec)
            if outcome is not None:
                return outcome
            ec = await self._context(ctx, command_id, str(payload.get("link_key") or "")) or ec
        if any(a.outcome == OutcomeClass.ACCEPTED or a.disposition in APPLIED_DISPOSITIONS
               for a in ec.attempts):
            return self._settle_success(ctx, ec)
        return await self._dispatch(ctx, ec)

    # ----------------------------------------------------------- dispatch

    async def _dispatch(self, ctx: WorkContext, ec: EffectContext) -> Outcome:
        command, op, binding = ec.command, ec.operation, ec.binding
        if op is None:
            return self._refuse(ctx, ec, _history(ec.attempts), "unknown_operation",
                                f"operation {command.operation} is not in the catalog")
        if binding is None or binding.generation != command.binding_generation:
            return self._refuse(ctx, ec, _history(ec.attempts), "binding_generation",
                                "the pinned binding generation is no longer current")
        remote_id = ec.remote_id
        if remote_id is None or ec.link is None:
            return self._refuse(ctx, ec, _history(ec.attempts), "no_remote_link",
                                f"no active remote link for {op.local_object}")
        if binding.token is None:
            return RetryLater("no_credentials", "the binding has no token configured", 60.0)
        try:
            prepared = prepare(op, binding, remote_id, json.loads(command.frozen_request),
                               idempotency_key=command.command_id)
        except BadRequestForOperation as exc:
            return self._refuse(ctx, ec, _history(ec.attempts), "bad_request", str(exc))
        evidence = canonical_bytes({
            "binding_generation": binding.generation,
            "catalog_revision": command.catalog_revision,
            "link_generation": ec.link.generation,
            "link_key": ec.link.link_key,
        }).decode()
        draft = AttemptDraft(
            command_id=command.command_id, method=prepared.method,
            target_path=prepared.path,
            safe_headers=canonical_bytes(prepared.safe_headers).decode(),
            body_sha256=prepared.body_sha256, idempotency_key=prepared.idempotency_key,
            pre_dispatch_evidence=evidence,
        )
        if self.checkpoints is not None:
            attempt_id = await self.checkpoints.checkpoint(ctx.fence, draft)
        else:
            attempt_id = await ctx.store.effect_checkpoint(ctx.fence, draft, ctx.clock.now_us())
        # The checkpoint is committed: only now may bytes leave.
        seen, provider_evidence = await self.executor.dispatch(
            prepared, binding.token.reveal(), binding.timeout)
        verdict = classify(op.contract, seen)
        self.on_attempt(op.name, verdict.outcome.value)
        logs.event("effect_attempt", command_id=command.command_id, attempt_id=attempt_id,
                   work_id=ctx.item.work_id, epoch=ctx.fence.ownership_epoch,
                   outcome=verdict.outcome.value, status=seen.status, detail=seen.detail)
        self._record(ctx, attempt_id, verdict, seen, provider_evidence)
        return self._next(ctx, ec, attempt_id, verdict, seen)

    def _record(self, ctx: WorkContext, attempt_id: str, verdict: Classification,
                seen: DispatchObservation, provider_evidence: dict[str, Any]) -> None:
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            await record_outcome(tx, attempt_id, outcome=verdict.outcome.value,
                                 response_status=seen.status,
                                 provider_evidence=provider_evidence,
                                 failure_class=verdict.failure_class, now_us=now)

        ctx.on_finalize(write)

    def _next(self, ctx: WorkContext, ec: EffectContext, attempt_id: str,
              verdict: Classification, seen: DispatchObservation) -> Outcome:
        what = seen.detail or str(seen.status)
        match verdict.outcome:
            case OutcomeClass.ACCEPTED:
                return self._settle_success(ctx, ec)
            case OutcomeClass.REJECTED:
                history = [*_history(ec.attempts), (verdict.outcome.value, None)]
                return self._refuse(ctx, ec, history, verdict.failure_class,
                                    f"provider rejected the request ({seen.status})")
            case OutcomeClass.RETRYABLE_PRE_DISPATCH | OutcomeClass.REPLAY_SAFE_RETRY:
                return RetryLater(verdict.failure_class, f"not applied ({what})",
                                  verdict.retry_after_s)
            case _:
                assert ec.operation is not None and ec.binding is not None
                window = ec.binding.max_in_flight or ec.operation.contract.max_in_flight_s
                return RetryLater("outcome_unknown",
                                  f"dispatch outcome unknown ({what}); reconciling", window)

    def _refuse(self, ctx: WorkContext, ec: EffectContext,
                history: list[tuple[str | None, str | None]], failure_class: str,
                summary: str) -> Outcome:
        """Settle with NO_EFFECT when the history proves it; otherwise wait for an operator."""
        reason = no_effect_reason(history)
        if reason is None:
            return DeadLetter(failure_class, f"{summary}; earlier attempts are not proven"
                              " effect-free: operator repair needed")
        result = NoEffectResult(reason)
        self._settle_on_finalize(ctx, ec.command, Settlement.NO_EFFECT, RESULT_FORMAT_NO_EFFECT,
                                 "", result.canonical.decode(), result.digest)
        return DeadLetter(failure_class, f"{summary}; no-effect result ({reason.value}) sent")

    def _settle_success(self, ctx: WorkContext, ec: EffectContext) -> Outcome:
        remote_id = ec.remote_id
        if not remote_id:
            return DeadLetter("no_remote_link", "applied, but the remote link is gone:"
                              " operator repair needed")
        self._settle_on_finalize(ctx, ec.command, Settlement.SUCCEEDED, RESULT_FORMAT_SUCCESS,
                                 remote_id, "", "")
        return Succeeded("applied; success result sent")

    def _settle_on_finalize(self, ctx: WorkContext, command: Command, settlement: Settlement,
                            result_format: int, remote_id: str, canonical: str,
                            digest: str) -> None:
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            await settle(tx, command_id=command.command_id, command=command,
                         settlement=settlement,
                         result_format_version=result_format, remote_id=remote_id,
                         canonical_result=canonical, result_digest=digest,
                         receipt_max_attempts=self.receipt_max_attempts, now_us=now)

        ctx.on_finalize(write)
        if command.handoff_key is not None:
            ctx.wake_after_finalize(RECEIPT_FAMILY)  # the receipt goes out at once

    # --------------------------------------------------------- reconcile

    async def _reconcile(self, ctx: WorkContext, ec: EffectContext) -> Outcome | None:
        """Resolve unresolved attempts; ``None`` means proceed (they were proven absent)."""
        op, binding, remote_id = ec.operation, ec.binding, ec.remote_id
        if op is None or binding is None:
            return RetryLater("reconcile_unavailable",
                              "operation or binding gone; cannot read back", 60.0)
        if remote_id is None or binding.token is None:
            return DeadLetter("outcome_unknown", "cannot read back (no link or credentials):"
                              " operator disposition needed")
        unresolved = [a for a in ec.attempts if a.unresolved]
        try:
            desired = desired_fields(op, json.loads(ec.command.frozen_request))
            snapshot: RemoteSnapshot = await self.executor.read(
                op, binding, remote_id, sorted(desired), binding.token.reveal(),
                binding.timeout)
        except (httpx.HTTPError, LookupError, ValueError) as exc:
            return RetryLater("reconcile_read_failed", type(exc).__name__)
        window_s = binding.max_in_flight or op.contract.max_in_flight_s
        verdict = reconcile(
            desired, snapshot,
            earliest_dispatch_us=min(a.dispatch_started_at_us for a in unresolved),
            latest_dispatch_us=max(a.dispatch_started_at_us for a in unresolved),
            now_us=ctx.clock.now_us(), clock_skew_us=int(binding.max_clock_skew * 1_000_000),
            max_in_flight_us=int(window_s * 1_000_000),
        )
        ids = [a.attempt_id for a in unresolved]
        if verdict.verdict is Reconciled.APPLIED:
            now = ctx.clock.now_us()

            async def proven(tx: SqlTx) -> None:
                await dispose(tx, ids, Disposition.PROVEN_APPLIED,
                              "read-back shows the desired values", "reconciler", now)

            ctx.on_finalize(proven)
            return self._settle_success(ctx, ec)
        if verdict.verdict is Reconciled.ABSENT:
            # Committed now: the dispatch that follows needs it in place.
            await ctx.store.effect_dispose(ctx.fence, ids, Disposition.PROVEN_ABSENT,
                                           "unmodified since before dispatch, window passed",
                                           ctx.clock.now_us())
            return None
        if verdict.retry_after_s is not None:
            return RetryLater("outcome_unknown", "waiting out the provider's in-flight window",
                              verdict.retry_after_s + 0.5)
        return RetryLater("outcome_unknown", "read-back proves neither effect nor absence:"
                          " operator disposition needed")


async def replay_refusal(catalog: Catalog, store: WorkStore, item: WorkItem) -> str | None:
    """Seed 10: no replay while an outcome is unknown (until reconciliation or an
    operator's disposition), nor when the pinned binding or Catalog revision
    is no longer what this service serves (identity/authority ambiguous)."""
    payload = json.loads(item.payload)
    command = await store.command_get(str(payload.get("command_id", "")))
    if command is None:
        return "its command is missing"
    if any(a.unresolved for a in await store.effect_attempts(command.command_id)):
        return ("an effect attempt's outcome is unknown; reconcile it or record an operator"
                " disposition first")
    binding = catalog.binding(command.binding_id)
    if binding is None or binding.generation != command.binding_generation:
        return ("the command's binding generation is no longer current; issue a repair"
                " command instead")
    if command.catalog_revision != catalog.revision:
        return (f"the command names Catalog revision {command.catalog_revision}, this"
                f" service serves {catalog.revision}")
    return None


def effect_handler(runner: EffectRunner) -> Handler:
    async def handle(ctx: WorkContext) -> Outcome:
        return await runner.handle(ctx)

    return handle
