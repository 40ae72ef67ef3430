"""PrincipalBinding rows: the durable fact every command's binding generation pins.

The transitions are pure (:mod:`daemon.core.principals`, and the operator's identity
flows of :mod:`daemon.core.connect_flows`); here each one is a
compare-and-swap on the (generation, state) the caller read, with its audit entry in the
same transaction, so two operators (or a connect flow and an operator) racing on one
binding have one winner and the loser is told the binding changed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs

from daemon.core.connect_flows import Flow, FlowPlan, plan_operator_flow
from daemon.core.principals import (
    BindingEvent,
    BindingFacts,
    BindingIdentity,
    BindingState,
    PrincipalKind,
    transition,
)
from storage.idgen import new_ulid
from storage.port import AuditEntry, Database, DuplicateKey, Row, SqlTx, WorkConflict
from storage.work_admin import append_audit
from storage.work_rows import placeholders

_COLUMNS = (
    "binding_id, kind, org_id, app_installation_id, provider, user_id, issuer,"
    " remote_account_id, remote_subject, installation_id, scopes_json, generation, state"
)


def _from_row(row: Row) -> BindingFacts:
    return BindingFacts(
        binding_id=str(row[0]), kind=PrincipalKind(row[1]), org_id=str(row[2]),
        app_installation_id=str(row[3]), provider=str(row[4]), user_id=str(row[5]),
        identity=BindingIdentity(issuer=str(row[6]), remote_account_id=str(row[7]),
                                 remote_subject=str(row[8]), installation_id=str(row[9]),
                                 scopes=tuple(json.loads(str(row[10])))),
        generation=int(row[11]), state=BindingState(row[12]),
    )


def facts_json(facts: BindingFacts) -> str:
    """An audit-safe description (no secret lives on a binding)."""
    return json.dumps({"generation": facts.generation, "state": facts.state.value,
                       "issuer": facts.identity.issuer,
                       "remote_account_id": facts.identity.remote_account_id,
                       "remote_subject": facts.identity.remote_subject,
                       "installation_id": facts.identity.installation_id,
                       "scopes": list(facts.identity.scopes)}, sort_keys=True)


async def read_binding(tx: SqlTx, binding_id: str) -> BindingFacts | None:
    rows = await tx.fetchall(f"SELECT {_COLUMNS} FROM principal_bindings WHERE binding_id = ?",
                             (binding_id,))
    return _from_row(rows[0]) if rows else None


@attrs.frozen
class Actor:
    name: str
    role: str
    reason: str


def binding_audit(actor: Actor, action: str, binding_id: str, before: str, after: str,
           now_us: int) -> AuditEntry:
    return AuditEntry(audit_id=new_ulid(now_us), at_us=now_us, actor=actor.name,
                      role=actor.role, action=action, target_kind="principal_binding",
                      target_id=binding_id, reason=actor.reason, before=before, after=after)


# Who bootstraps a binding's durable row from the configuration.
_CONFIG = Actor(name="config", role="system",
                reason="bootstrap from [[bindings]]: the first durable generation")


async def insert_binding(tx: SqlTx, facts: BindingFacts, now_us: int) -> None:
    ident = facts.identity
    await tx.execute(
        f"INSERT INTO principal_bindings ({_COLUMNS}, created_at_us, updated_at_us)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (facts.binding_id, facts.kind.value, facts.org_id, facts.app_installation_id,
         facts.provider, facts.user_id, ident.issuer, ident.remote_account_id,
         ident.remote_subject, ident.installation_id, json.dumps(list(ident.scopes)),
         facts.generation, facts.state.value, now_us, now_us))


async def update_binding(tx: SqlTx, current: BindingFacts, after: BindingFacts,
                         now_us: int) -> bool:
    """CAS ``current`` (as read) to ``after``; False when it changed meanwhile."""
    ident = after.identity
    matched = await tx.execute(
        "UPDATE principal_bindings SET issuer = ?, remote_account_id = ?,"
        " remote_subject = ?, installation_id = ?, scopes_json = ?, generation = ?,"
        " state = ?, updated_at_us = ?"
        " WHERE binding_id = ? AND generation = ? AND state = ?",
        (ident.issuer, ident.remote_account_id, ident.remote_subject,
         ident.installation_id, json.dumps(list(ident.scopes)), after.generation,
         after.state.value, now_us, current.binding_id, current.generation,
         current.state.value))
    return matched == 1


class PrincipalBindings:
    db: Database

    async def binding_connect(self, facts: BindingFacts, actor: Actor,
                              now_us: int) -> BindingFacts:
        async def body(tx: SqlTx) -> BindingFacts:
            await insert_binding(tx, facts, now_us)
            await append_audit(tx, binding_audit(actor, "binding.connect", facts.binding_id,
                                                 "", facts_json(facts), now_us))
            return facts

        try:
            return await self.db.transact(body, name="binding.connect")
        except DuplicateKey:
            raise WorkConflict(f"binding {facts.binding_id} already exists: reconnect or"
                               " change it") from None

    async def binding_bootstrap(self, facts: BindingFacts, now_us: int) -> BindingFacts:
        """The durable row of a ``[[bindings]]`` entry: created from ``facts`` (the TOML's
        identity and generation) only when none exists, audited as ``binding.bootstrap``;
        an existing row is returned as it is (the TOML never moves a generation)."""

        async def body(tx: SqlTx) -> BindingFacts:
            current = await read_binding(tx, facts.binding_id)
            if current is not None:
                return current
            await insert_binding(tx, facts, now_us)
            await append_audit(tx, binding_audit(_CONFIG, "binding.bootstrap",
                                                 facts.binding_id, "", facts_json(facts),
                                                 now_us))
            return facts

        try:
            return await self.db.transact(body, name="binding.bootstrap")
        except DuplicateKey:  # another replica bootstrapped it first
            found = await self.binding_get(facts.binding_id)
            assert found is not None
            return found

    async def binding_get_many(self, binding_ids: Sequence[str]) -> dict[str, BindingFacts]:
        """The current facts of each binding that exists (one read)."""
        wanted = sorted(set(binding_ids))
        if not wanted:
            return {}

        async def body(tx: SqlTx) -> dict[str, BindingFacts]:
            rows = await tx.fetchall(
                f"SELECT {_COLUMNS} FROM principal_bindings"
                f" WHERE binding_id IN ({placeholders(len(wanted))})", wanted)
            return {f.binding_id: f for f in map(_from_row, rows)}

        return await self.db.transact(body, name="binding.get_many", write=False)

    async def binding_get(self, binding_id: str) -> BindingFacts | None:
        async def body(tx: SqlTx) -> BindingFacts | None:
            return await read_binding(tx, binding_id)

        return await self.db.transact(body, name="binding.get", write=False)

    async def binding_find_user(self, org_id: str, app_installation_id: str,
                                provider: str | None, user_id: str) -> list[BindingFacts]:
        """The per-user bindings of one user in one scope (of one provider, or any)."""

        async def body(tx: SqlTx) -> list[BindingFacts]:
            rows = await tx.fetchall(
                f"SELECT {_COLUMNS} FROM principal_bindings WHERE org_id = ?"
                " AND app_installation_id = ? AND kind = ? AND user_id = ?"
                " ORDER BY binding_id",
                (org_id, app_installation_id, PrincipalKind.PER_USER.value, user_id))
            found = [_from_row(r) for r in rows]
            return [f for f in found if provider is None or f.provider == provider]

        return await self.db.transact(body, name="binding.find_user", write=False)

    async def binding_list(self, org_id: str | None = None) -> list[BindingFacts]:
        async def body(tx: SqlTx) -> list[BindingFacts]:
            where, params = ("WHERE org_id = ?", (org_id,)) if org_id else ("", ())
            rows = await tx.fetchall(
                f"SELECT {_COLUMNS} FROM principal_bindings {where} ORDER BY binding_id", params)
            return [_from_row(r) for r in rows]

        return await self.db.transact(body, name="binding.list", write=False)

    async def binding_transition(self, binding_id: str, event: BindingEvent, actor: Actor, *,
                                 expected_generation: int, now_us: int,
                                 identity: BindingIdentity | None = None) -> BindingFacts:
        """Apply ``event`` if the binding is still at ``expected_generation``; a refusal
        (:class:`daemon.core.principals.BindingRefused`) or a lost race writes nothing."""

        async def body(tx: SqlTx) -> BindingFacts:
            current = await read_binding(tx, binding_id)
            if current is None:
                raise WorkConflict(f"no binding {binding_id}")
            if current.generation != expected_generation:
                raise WorkConflict(f"binding {binding_id} is at generation"
                                   f" {current.generation}, not {expected_generation}")
            after = transition(current, event, identity)
            if after == current:
                return current
            if not await update_binding(tx, current, after, now_us):
                raise WorkConflict(f"binding {binding_id} changed concurrently")
            await append_audit(tx, binding_audit(actor, f"binding.{event.value}",
                                                 binding_id, facts_json(current),
                                                 facts_json(after), now_us))
            return after

        return await self.db.transact(body, name="binding.transition")

    async def binding_operator_flow(self, binding_id: str, flow: Flow, actor: Actor, *,
                                    expected_generation: int, now_us: int,
                                    changes: dict[str, object]) -> FlowPlan:
        """An operator's identity flow (change_issuer, reinstall, rebind, change_scopes:
        :func:`daemon.core.connect_flows.plan_operator_flow`) on the binding as it is read
        here, ``changes`` applied to its identity: a compare-and-swap on the generation
        the operator saw, audited as ``binding.<flow>`` with the facts before and after.
        A refusal (:class:`~daemon.core.principals.BindingRefused`) or a lost race
        (:class:`~storage.port.WorkConflict`) writes nothing; so does a flow that changes
        nothing. No grant is handed over or touched (the module doc of
        :mod:`daemon.core.connect_flows` says what a moved generation then needs)."""

        async def body(tx: SqlTx) -> FlowPlan:
            current = await read_binding(tx, binding_id)
            identity = None
            if current is not None and changes:
                fields: dict[str, Any] = dict(changes)
                identity = attrs.evolve(current.identity, **fields)
            plan = plan_operator_flow(current, flow, binding_id=binding_id,
                                      expected_generation=expected_generation,
                                      identity=identity)
            assert plan.before is not None
            if plan.before == plan.after and not plan.bumped:
                return plan
            if not await update_binding(tx, plan.before, plan.after, now_us):
                raise WorkConflict(f"binding {binding_id} changed concurrently")
            after = json.dumps({**json.loads(facts_json(plan.after)), "flow": flow.value},
                               sort_keys=True)
            await append_audit(tx, binding_audit(actor, f"binding.{flow.value}", binding_id,
                                                 facts_json(plan.before), after, now_us))
            return plan

        return await self.db.transact(body, name="binding.operator_flow")
