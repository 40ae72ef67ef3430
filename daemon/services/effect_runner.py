"""The ``external_effect`` work family: drive one ExternalCommand to a terminal result.

Theory of operation (DoOnce)
----------------------------
Each claim of a command's WorkItem does at most one of these, in order:

1. The command is already settled: nothing to do (replays are harmless).
2. An earlier attempt is unresolved (dispatched, outcome unknown, or a crash
   after the checkpoint): *reconcile*. Read the remote record back; applied
   -> settle with a success result; proven absent -> record that and go on
   to dispatch; unproven -> retry later, and after the attempts are spent the
   item is dead, awaiting an operator's disposition. Never a blind resend.
3. An attempt was accepted (or proven applied) but the result was not yet
   persisted (a crash in between): settle with a success result.
4. Pre-dispatch checks (catalog operation, pinned binding generation still
   current, an active remote link, the request fits the definition): a
   failure settles with ``NO_EFFECT`` when the evidence allows it, never by
   converting an ambiguous history.
5. Dispatch: write the fenced dispatch-start checkpoint and commit it, send
   exactly one request, classify the observation, record it (fenced), then:
   ACCEPTED -> settle success; REJECTED -> settle ``NO_EFFECT``
   (``DEFINITIVE_NO_EFFECT``) when every attempt has affirmative no-effect
   evidence; retryable -> retry later (the provider's delay for 429);
   OUTCOME_UNKNOWN -> reconcile on the next claim.

Settling persists the result and forbids further dispatch in the same fenced
transaction that queues the receipt for the Runtime.
"""

from __future__ import annotations

import json

import attrs
import httpx

from config.catalog import Catalog, OperationDefinition
from config.settings import BindingSettings
from daemon.core.canonical import canonical_bytes
from daemon.core.effects import (
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
from daemon.core.identity import integration_scope_digest
from daemon.core.outcomes import DeadLetter, Outcome, RetryLater, Skipped, Succeeded
from daemon.providers.executor import BadRequestForOperation, HttpExecutor, prepare
from daemon.services import logs
from daemon.services.families import Handler, WorkContext
from storage.effect_values import (
    APPLIED_DISPOSITIONS,
    AttemptDraft,
    Command,
    Disposition,
    EffectAttempt,
    Settlement,
)

# Outcome classes (or dispositions) that prove an attempt had no external effect.
_NO_EFFECT_OUTCOMES = frozenset({
    OutcomeClass.REJECTED, OutcomeClass.RETRYABLE_PRE_DISPATCH, OutcomeClass.REPLAY_SAFE_RETRY,
})


def _no_effect_reason(attempts: list[EffectAttempt]) -> NoEffectReason | None:
    """The reason a no-effect result may be claimed for this history, or None."""
    if not attempts or all(a.outcome == OutcomeClass.RETRYABLE_PRE_DISPATCH for a in attempts):
        return NoEffectReason.REJECTED_BEFORE_DISPATCH
    for a in attempts:
        if a.disposition is not None:
            if a.disposition in APPLIED_DISPOSITIONS:
                return None
            continue
        if a.outcome is None or a.outcome not in _NO_EFFECT_OUTCOMES:
            return None
    return NoEffectReason.DEFINITIVE_NO_EFFECT


@attrs.define(eq=False)
class EffectRunner:
    catalog: Catalog
    executor: HttpExecutor
    receipt_max_attempts: int

    async def handle(self, ctx: WorkContext) -> Outcome:
        command_id = str(json.loads(ctx.item.payload)["command_id"])
        command = await ctx.store.command_get(command_id)
        if command is None:
            return DeadLetter("missing_command", f"no command {command_id}")
        if command.settlement is not Settlement.OPEN:
            return Skipped(f"command already {command.settlement.value}")
        attempts = await ctx.store.effect_attempts(command_id)
        op = self.catalog.operation(command.operation)
        binding = self.catalog.binding(command.binding_id)
        if any(a.unresolved for a in attempts):
            if op is None or binding is None:
                return RetryLater("reconcile_unavailable",
                                  "operation or binding gone; cannot read back", 60.0)
            outcome = await self._reconcile(ctx, command, op, binding, attempts)
            if outcome is not None:
                return outcome
            attempts = await ctx.store.effect_attempts(command_id)
        if any(a.outcome == OutcomeClass.ACCEPTED or a.disposition in APPLIED_DISPOSITIONS
               for a in attempts):
            return await self._settle_success(ctx, command)
        return await self._dispatch(ctx, command, op, binding, attempts)

    # ----------------------------------------------------------- dispatch

    async def _dispatch(self, ctx: WorkContext, command: Command, op: OperationDefinition | None,
                        binding: BindingSettings | None,
                        attempts: list[EffectAttempt]) -> Outcome:
        if op is None:
            return await self._refuse(ctx, command, attempts, "unknown_operation",
                                      f"operation {command.operation} is not in the catalog")
        if binding is None or binding.generation != command.binding_generation:
            return await self._refuse(ctx, command, attempts, "binding_generation",
                                      "the pinned binding generation is no longer current")
        link = await ctx.store.link_get(_scope_digest(binding), op.local_object,
                                        command.local_id)
        if link is None or link.state.value != "active" or link.remote_id is None:
            return await self._refuse(ctx, command, attempts, "no_remote_link",
                                      f"no active remote link for {op.local_object}")
        if binding.token is None:
            return RetryLater("no_credentials", "the binding has no token configured", 60.0)
        try:
            prepared = prepare(op, binding, link.remote_id, json.loads(command.frozen_request),
                               idempotency_key=command.command_id)
        except BadRequestForOperation as exc:
            return await self._refuse(ctx, command, attempts, "bad_request", str(exc))
        evidence = canonical_bytes({
            "binding_generation": binding.generation,
            "catalog_revision": command.catalog_revision,
            "link_generation": link.generation,
            "link_key": link.link_key,
        }).decode()
        attempt_id = await ctx.store.effect_checkpoint(
            ctx.fence,
            AttemptDraft(
                command_id=command.command_id, method=prepared.method,
                target_path=prepared.path,
                safe_headers=canonical_bytes(prepared.safe_headers).decode(),
                body_sha256=prepared.body_sha256, idempotency_key=prepared.idempotency_key,
                pre_dispatch_evidence=evidence,
            ),
            ctx.clock.now_us(),
        )
        # The checkpoint is committed: only now may bytes leave.
        seen, provider_evidence = await self.executor.dispatch(
            prepared, binding.token.reveal(), binding.timeout)
        verdict = classify(op.contract, seen)
        await ctx.store.effect_record(
            ctx.fence, attempt_id, outcome=verdict.outcome.value, response_status=seen.status,
            provider_evidence=provider_evidence, failure_class=verdict.failure_class,
            now_us=ctx.clock.now_us(),
        )
        logs.event("effect_attempt", command_id=command.command_id, attempt_id=attempt_id,
                   work_id=ctx.item.work_id, epoch=ctx.fence.ownership_epoch,
                   outcome=verdict.outcome.value, status=seen.status, detail=seen.detail)
        match verdict.outcome:
            case OutcomeClass.ACCEPTED:
                return await self._settle_success(ctx, command)
            case OutcomeClass.REJECTED:
                attempts = await ctx.store.effect_attempts(command.command_id)
                return await self._refuse(ctx, command, attempts, verdict.failure_class,
                                          f"provider rejected the request ({seen.status})")
            case OutcomeClass.RETRYABLE_PRE_DISPATCH | OutcomeClass.REPLAY_SAFE_RETRY:
                what = seen.detail or str(seen.status)
                return RetryLater(verdict.failure_class, f"not applied ({what})",
                                  verdict.retry_after_s)
            case _:
                what = seen.detail or str(seen.status)
                window = binding.max_in_flight or op.contract.max_in_flight_s
                return RetryLater("outcome_unknown",
                                  f"dispatch outcome unknown ({what}); reconciling", window)

    async def _refuse(self, ctx: WorkContext, command: Command, attempts: list[EffectAttempt],
                      failure_class: str, summary: str) -> Outcome:
        """Settle with NO_EFFECT when the history proves it; otherwise wait for an operator."""
        reason = _no_effect_reason(attempts)
        if reason is None:
            return DeadLetter(failure_class, f"{summary}; earlier attempts are not proven"
                              " effect-free: operator repair needed")
        result = NoEffectResult(reason)
        await ctx.store.effect_settle(
            ctx.fence, command_id=command.command_id, settlement=Settlement.NO_EFFECT,
            result_format_version=RESULT_FORMAT_NO_EFFECT, remote_id="",
            canonical_result=result.canonical.decode(), result_digest=result.digest,
            receipt_max_attempts=self.receipt_max_attempts, now_us=ctx.clock.now_us(),
        )
        return DeadLetter(failure_class, f"{summary}; no-effect result ({reason.value}) sent")

    async def _settle_success(self, ctx: WorkContext, command: Command) -> Outcome:
        op = self.catalog.operation(command.operation)
        binding = self.catalog.binding(command.binding_id)
        remote_id = ""
        if op is not None and binding is not None:
            link = await ctx.store.link_get(_scope_digest(binding), op.local_object,
                                            command.local_id)
            remote_id = link.remote_id if link is not None and link.remote_id else ""
        if not remote_id:
            return DeadLetter("no_remote_link", "applied, but the remote link is gone:"
                              " operator repair needed")
        await ctx.store.effect_settle(
            ctx.fence, command_id=command.command_id, settlement=Settlement.SUCCEEDED,
            result_format_version=RESULT_FORMAT_SUCCESS, remote_id=remote_id,
            canonical_result="", result_digest="",
            receipt_max_attempts=self.receipt_max_attempts, now_us=ctx.clock.now_us(),
        )
        return Succeeded("applied; success result sent")

    # --------------------------------------------------------- reconcile

    async def _reconcile(self, ctx: WorkContext, command: Command, op: OperationDefinition,
                         binding: BindingSettings,
                         attempts: list[EffectAttempt]) -> Outcome | None:
        """Resolve unresolved attempts; ``None`` means proceed (they were proven absent)."""
        unresolved = [a for a in attempts if a.unresolved]
        link = await ctx.store.link_get(_scope_digest(binding), op.local_object,
                                        command.local_id)
        if link is None or link.remote_id is None or binding.token is None:
            return DeadLetter("outcome_unknown", "cannot read back (no link or credentials):"
                              " operator disposition needed")
        desired = json.loads(command.frozen_request).get("properties", {})
        try:
            snapshot: RemoteSnapshot = await self.executor.read(
                op, binding, link.remote_id, sorted(desired), binding.token.reveal(),
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
            await ctx.store.effect_dispose(ctx.fence, ids, Disposition.PROVEN_APPLIED,
                                           "read-back shows the desired values",
                                           ctx.clock.now_us())
            return await self._settle_success(ctx, command)
        if verdict.verdict is Reconciled.ABSENT:
            await ctx.store.effect_dispose(ctx.fence, ids, Disposition.PROVEN_ABSENT,
                                           "unmodified since before dispatch, window passed",
                                           ctx.clock.now_us())
            return None
        if verdict.retry_after_s is not None:
            return RetryLater("outcome_unknown", "waiting out the provider's in-flight window",
                              verdict.retry_after_s + 0.5)
        return RetryLater("outcome_unknown", "read-back proves neither effect nor absence:"
                          " operator disposition needed")


def _scope_digest(binding: BindingSettings) -> str:
    return integration_scope_digest(binding.org_id, binding.app_installation_id,
                                    binding.provider, binding.remote_account_id)


def effect_handler(runner: EffectRunner) -> Handler:
    async def handle(ctx: WorkContext) -> Outcome:
        return await runner.handle(ctx)

    return handle
