"""The console's view of principal bindings and their grants (seed 8.1, 8.2).

Each configured binding with its durable PrincipalBinding (generation, state) and the
grant of that generation (state, token version, key id, expiry, last refresh). Never a
secret: the bundle's ciphertext is not even read out of the stored value.
"""

from __future__ import annotations

from typing import Any

from storage.work_store import WorkStore

Json = dict[str, Any]


async def principal_facts(store: WorkStore, binding_ids: list[str]) -> dict[str, Json]:
    """binding id -> {"durable": ..., "grant": ...} (None where there is none)."""
    durable = await store.binding_get_many(binding_ids)
    out: dict[str, Json] = {}
    for binding_id in binding_ids:
        facts = durable.get(binding_id)
        grant = (await store.grant_get(binding_id, facts.generation)
                 if facts is not None else None)
        out[binding_id] = {
            "durable": None if facts is None else {
                "generation": facts.generation, "state": facts.state.value,
                "kind": facts.kind.value},
            "grant": None if grant is None else {
                "state": grant.state.value, "token_version": grant.token_version,
                "key_id": grant.sealed.key_id, "expires_at_us": grant.expires_at_us,
                "last_refresh_at_us": grant.last_refresh_at_us},
        }
    return out
