"""The Runtime's connect flows, applied: one transaction per flow (seed 8.1, 8.2).

The decision is pure (:func:`daemon.core.connect_flows.plan_flow`); here, in one
transaction: the idempotency row is looked up (a retry with the same body is answered
from it, another body under the same key is refused), the binding is read, planned,
written as a compare-and-swap on the (generation, state) read, its grant installed,
replaced or revoked, the audit entry appended with the Runtime as actor, and the
idempotency row written with the answer. A refusal writes nothing.

This module never sees a token in the clear: the caller passes a ``seal`` function that
turns the bundle's context (binding, generation, token version) into a sealed bundle.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from daemon.core.connect_flows import Flow, GrantAction, plan_flow
from daemon.core.principals import BindingFacts, BindingIdentity, BindingRefused
from daemon.core.token_bundle import BundleContext, SealedBundle
from storage.grants import GrantState, insert_grant, mark_grant, read_grant, replace_grant
from storage.port import Database, DuplicateKey, SqlTx, WorkConflict
from storage.principals import (
    Actor,
    binding_audit,
    facts_json,
    insert_binding,
    read_binding,
    update_binding,
)
from storage.work_admin import append_audit

Sealer = Callable[[BundleContext], SealedBundle]


@attrs.frozen(kw_only=True)
class FlowGrant:
    """The grant a flow installs: its sealer (holding the secret) and its expiry."""

    seal: Sealer = attrs.field(repr=False)
    expires_at_us: int


@attrs.frozen(kw_only=True)
class FlowRequest:
    runtime_name: str
    idempotency_key: str
    request_digest: str
    # The caller's scope: a binding outside it is "unknown" (nothing disclosed).
    org_id: str
    app_installation_id: str
    binding_id: str
    flow: Flow
    expected_generation: int | None = None
    # The identity fields the flow changes (name, value), applied to the binding as it
    # is read in the flow's transaction.
    changes: tuple[tuple[str, object], ...] = ()
    new: BindingFacts | None = None
    grant: FlowGrant | None = None
    actor: Actor


@attrs.frozen
class FlowResult:
    response: dict[str, object]
    replayed: bool


class FlowKeyReused(Exception):
    """The idempotency key was used before with another request."""


def _response(facts: BindingFacts, bumped: bool, token_version: int | None) -> dict[str, object]:
    return {"binding_id": facts.binding_id, "kind": facts.kind.value,
            "provider": facts.provider, "user_id": facts.user_id or None,
            "generation": facts.generation, "state": facts.state.value,
            "generation_bumped": bumped, "token_version": token_version,
            "identity": json.loads(facts_json(facts))}


async def _replayed(tx: SqlTx, req: FlowRequest) -> FlowResult | None:
    rows = await tx.fetchall(
        "SELECT request_digest, response_json FROM binding_flow_requests"
        " WHERE runtime_name = ? AND idempotency_key = ?",
        (req.runtime_name, req.idempotency_key))
    if not rows:
        return None
    if str(rows[0][0]) != req.request_digest:
        raise FlowKeyReused(req.idempotency_key)
    return FlowResult(dict(json.loads(str(rows[0][1]))), True)


async def _apply(tx: SqlTx, req: FlowRequest, now_us: int) -> FlowResult:
    found = await _replayed(tx, req)
    if found is not None:
        return found
    current = await read_binding(tx, req.binding_id)
    if current is not None and (current.org_id, current.app_installation_id) != (
            req.org_id, req.app_installation_id):
        current = None  # another scope's binding: unknown here (or taken, for connect)
        if req.flow is Flow.CONNECT:
            raise BindingRefused("binding_exists", f"binding {req.binding_id} already"
                                 " exists")
    identity: BindingIdentity | None = None
    if current is not None and req.changes:
        changes: dict[str, Any] = dict(req.changes)
        identity = attrs.evolve(current.identity, **changes)
    plan = plan_flow(current, req.flow, binding_id=req.binding_id,
                     expected_generation=req.expected_generation,
                     has_grant=req.grant is not None, identity=identity, new=req.new)
    after = plan.after
    if plan.before is None:
        await insert_binding(tx, after, now_us)
    elif plan.before != after and not await update_binding(tx, plan.before, after, now_us):
        raise WorkConflict(f"binding {req.binding_id} changed concurrently")
    version: int | None = None
    if plan.grant is GrantAction.INSTALL:
        assert req.grant is not None
        sealed = req.grant.seal(BundleContext(after.binding_id, after.generation, 1))
        stored = await insert_grant(tx, binding_id=after.binding_id,
                                    generation=after.generation, sealed=sealed,
                                    expires_at_us=req.grant.expires_at_us, now_us=now_us)
        version = stored.token_version
        if plan.before is not None:  # the superseded generation's grant is never used again
            await mark_grant(tx, after.binding_id, plan.before.generation, GrantState.REVOKED,
                             now_us)
    elif plan.grant is GrantAction.REPLACE:
        assert req.grant is not None
        old = await read_grant(tx, after.binding_id, after.generation)
        if old is None:
            sealed = req.grant.seal(BundleContext(after.binding_id, after.generation, 1))
            stored = await insert_grant(tx, binding_id=after.binding_id,
                                        generation=after.generation, sealed=sealed,
                                        expires_at_us=req.grant.expires_at_us, now_us=now_us)
            version = stored.token_version
        else:
            version = old.token_version + 1
            sealed = req.grant.seal(BundleContext(after.binding_id, after.generation, version))
            if not await replace_grant(tx, binding_id=after.binding_id,
                                       generation=after.generation,
                                       expected_version=old.token_version, sealed=sealed,
                                       expires_at_us=req.grant.expires_at_us, now_us=now_us,
                                       refreshed=False):
                raise WorkConflict(f"binding {req.binding_id}'s grant changed concurrently")
    else:
        if plan.grant is GrantAction.REVOKE:
            await mark_grant(tx, after.binding_id, after.generation, GrantState.REVOKED,
                             now_us)
        old = await read_grant(tx, after.binding_id, after.generation)
        version = None if old is None else old.token_version
    response = _response(after, plan.bumped, version)
    if plan.before != after or plan.grant is not GrantAction.NONE:
        before = "" if plan.before is None else facts_json(plan.before)
        after_json = json.dumps({**json.loads(facts_json(after)),
                                 "token_version": version, "flow": req.flow.value},
                                sort_keys=True)
        await append_audit(tx, binding_audit(req.actor, f"binding.{req.flow.value}",
                                             req.binding_id, before, after_json, now_us))
    await tx.execute(
        "INSERT INTO binding_flow_requests (runtime_name, idempotency_key, request_digest,"
        " binding_id, flow, response_json, created_at_us) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (req.runtime_name, req.idempotency_key, req.request_digest, req.binding_id,
         req.flow.value, json.dumps(response, sort_keys=True), now_us))
    return FlowResult(response, False)


class BindingFlows:
    db: Database

    async def binding_flow(self, req: FlowRequest, now_us: int) -> FlowResult:
        """Apply one connect flow exactly once per (runtime, idempotency key).

        Raises :class:`~daemon.core.principals.BindingRefused` (nothing written),
        :class:`FlowKeyReused`, or :class:`~storage.port.WorkConflict` when another
        writer moved the binding between the read and the write."""

        async def body(tx: SqlTx) -> FlowResult:
            return await _apply(tx, req, now_us)

        try:
            return await self.db.transact(body, name="binding.flow")
        except (DuplicateKey, WorkConflict, BindingRefused) as exc:
            # A concurrent writer may have won: the same request under the same key
            # (answer it as a retry is answered; under READ COMMITTED its idempotency row
            # can be missing from our first read while its new generation is not), or
            # another flow or connect of this binding (the refusal stands).
            async def again(tx: SqlTx) -> FlowResult | None:
                return await _replayed(tx, req)

            found = await self.db.transact(again, name="binding.flow_replay", write=False)
            if found is not None:
                return found
            if isinstance(exc, DuplicateKey):
                raise BindingRefused("binding_exists",
                                     f"binding {req.binding_id} already exists") from None
            raise
