"""The console's view of principal bindings and their grants (seed 8.1, 8.2).

Each binding, configured (``[[bindings]]``) or connected by the Runtime's connect flows
(per-user principals among them), with its durable PrincipalBinding (generation, state,
kind, user), the grant of that generation (state, token version, key id, expiry, last
refresh; "refreshing" while a refresh or mint holds its lease; why it needs
re-authorization, a stable code and its sentence) and its transition
history from the audit log (who, when, which flow, generation before and after, why).
Never a secret: the bundle's ciphertext is not even read out of the stored value, and
the audit entries of bindings hold none.
"""

from __future__ import annotations

import json
from typing import Any

from daemon.core.principals import BindingFacts
from storage.grants import StoredGrant
from storage.work_store import WorkStore

Json = dict[str, Any]
HISTORY = 20


def _generation(doc: str) -> int | None:
    try:
        value = json.loads(doc).get("generation") if doc else None
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


async def history(store: WorkStore, binding_id: str) -> list[Json]:
    """The binding's last transitions, newest first."""
    entries = await store.audit_list(limit=HISTORY, target_id=binding_id)
    return [{"at_us": e.at_us, "actor": e.actor, "role": e.role, "action": e.action,
             "reason": e.reason, "generation_before": _generation(e.before),
             "generation_after": _generation(e.after)}
            for e in entries if e.target_kind == "principal_binding"]


def identity_json(facts: BindingFacts) -> Json:
    ident = facts.identity
    return {"issuer": ident.issuer, "remote_account_id": ident.remote_account_id,
            "remote_subject": ident.remote_subject,
            "installation_id": ident.installation_id or None, "scopes": list(ident.scopes)}


def grant_reason_json(grant: StoredGrant) -> Json | None:
    """Why the grant needs re-authorization (a stable code and its sentence), or None."""
    return None if grant.reason is None else {"code": grant.reason.code,
                                              "text": grant.reason.text}


async def principal_facts(store: WorkStore, binding_ids: list[str], now_us: int
                          ) -> dict[str, Json]:
    """binding id -> {"durable", "grant", "history"} (None where there is none)."""
    durable = await store.binding_get_many(binding_ids)
    out: dict[str, Json] = {}
    for binding_id in binding_ids:
        facts = durable.get(binding_id)
        grant = (await store.grant_get(binding_id, facts.generation)
                 if facts is not None else None)
        refreshing = (grant is not None and facts is not None
                      and await store.refresh_in_flight(binding_id, facts.generation, now_us))
        out[binding_id] = {
            "durable": None if facts is None else {
                "generation": facts.generation, "state": facts.state.value,
                "kind": facts.kind.value, "user_id": facts.user_id or None,
                # The authority for new work (docs/identity.md), not the TOML's value.
                "remote_account_id": facts.identity.remote_account_id,
                "installation_id": facts.identity.installation_id or None},
            # What the identity flows change (no secret lives on a binding).
            "identity": None if facts is None else identity_json(facts),
            "grant": None if grant is None else {
                "state": "refreshing" if refreshing and grant.state.value == "valid"
                else grant.state.value,
                "token_version": grant.token_version,
                "key_id": grant.sealed.key_id, "expires_at_us": grant.expires_at_us,
                "last_refresh_at_us": grant.last_refresh_at_us,
                "reason": grant_reason_json(grant)},
            "history": await history(store, binding_id),
        }
    return out


async def connected_bindings(store: WorkStore, configured: set[str], now_us: int
                             ) -> list[Json]:
    """The durable bindings no ``[[bindings]]`` entry names: those the Runtime connected
    (per-user principals among them), with the same facts as the configured ones."""
    others = [b for b in await store.binding_list() if b.binding_id not in configured]
    facts = await principal_facts(store, [b.binding_id for b in others], now_us)
    return [{"binding_id": b.binding_id, "provider": b.provider, "org_id": b.org_id,
             "app_installation_id": b.app_installation_id,
             "remote_account_id": b.identity.remote_account_id,
             **facts[b.binding_id]} for b in others]
