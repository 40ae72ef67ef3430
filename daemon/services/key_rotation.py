"""Key rotation: rewrap every stored token bundle under the active key (seed 8.2).

Rewrapping keeps the secret material and its authority; it only changes the wrapping, and
as a change of secret material at rest it moves the grant to the next token version, by
the same compare-and-swap a refresh uses. A refresh that wins the race has already sealed
under the active key, so the rotation simply finds it done. A grant whose refresh is in
flight (its lease live, or its call left and not yet activated) is left to the refresh
and counted as ``refreshing`` (``AuthorizationGrants.grant_rewrap``): a rewrap then would
make the refresh's activation fail and drop its answer with the refresh token it
rotated (simulation seed 7); the next rotation rewraps what the refresh sealed.

Dispatch never stops: a worker opening a bundle reads whichever version is current, under
whichever key sealed it, as long as both keys are loaded (``[keys] previous``) until the
rotation has finished.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import attrs

from daemon.core.token_bundle import BundleContext, BundleRefused, TokenKey, open_bundle, rewrap
from storage.grants import AuthorizationGrants, RewrapOutcome, StoredGrant
from storage.idgen import new_ulid
from storage.port import AuditEntry

_RACE_TRIES = 20


@attrs.frozen
class RotationReport:
    rewrapped: int
    already_current: int
    # (binding id, generation, stable reason): bundles that could not be opened.
    refused: tuple[tuple[str, int, str], ...]
    # Grants left to a refresh in flight (rotate again once it is done).
    refreshing: int = 0


def _context(grant: StoredGrant, version: int | None = None) -> BundleContext:
    return BundleContext(grant.binding_id, grant.generation,
                         grant.token_version if version is None else version)


async def verify_keys(store: AuthorizationGrants, keys: Mapping[str, TokenKey]) -> list[str]:
    """Problems with the loaded keys against the stored bundles (empty when none): a key
    id that seals a bundle but is not loaded, or a loaded key that does not open its
    bundles (a wrong key under the right id). Each message names the key id."""
    problems: list[str] = []
    tried: set[str] = set()
    for grant in await store.grant_list():
        key_id = grant.sealed.key_id
        if key_id in tried:
            continue
        tried.add(key_id)
        if key_id not in keys:
            problems.append(f"token key {key_id!r} seals stored bundles but is not loaded"
                            " (add it to keys.previous until a rotation has moved them)")
            continue
        try:
            open_bundle(grant.sealed, keys, _context(grant))
        except BundleRefused:
            problems.append(f"token key {key_id!r} does not open the bundles it should"
                            " (a different key under that id?)")
    return problems


# How many of a key id's stored bundles the start-up check tries before it says the key
# opens none of them (one that opens proves the key; a row that does not is refused at use).
WRONG_KEY_SAMPLE = 8


async def wrong_keys(store: AuthorizationGrants, keys: Mapping[str, TokenKey]
                     ) -> list[tuple[str, str]]:
    """Loaded keys that open none of the stored bundles sealed under their id, tried up to
    ``WRONG_KEY_SAMPLE`` each: (key id, message). That is a different key under the right
    id (a swapped or mistyped key file, another deployment's), which the start-up refuses
    in one line; a key that opens any of them is right, and a bundle it does not open was
    tampered or rolled back (refused when used, never a reason to stop the replica).
    A key id that seals bundles but is not loaded is not checked here (``keys status``)."""
    tried: dict[str, int] = {}
    proven: set[str] = set()
    for grant in await store.grant_list():
        key_id = grant.sealed.key_id
        if key_id not in keys or key_id in proven or tried.get(key_id, 0) >= WRONG_KEY_SAMPLE:
            continue
        tried[key_id] = tried.get(key_id, 0) + 1
        try:
            open_bundle(grant.sealed, keys, _context(grant))
        except BundleRefused:
            continue
        proven.add(key_id)
    return [(key_id, f"token key {key_id!r} opens none of the {count} stored bundle(s)"
                     " sealed under its id that were tried (a different key under that id?)")
            for key_id, count in sorted(tried.items()) if key_id not in proven]


async def rotate_keys(store: AuthorizationGrants, keys: Mapping[str, TokenKey], active: str, *,
                      actor: str, reason: str, now_us: int) -> RotationReport:
    new_key = keys[active]
    rewrapped = already = refreshing = 0
    refused: list[tuple[str, int, str]] = []
    for listed in await store.grant_list():
        grant: StoredGrant | None = listed
        for _ in range(_RACE_TRIES):
            if grant is None or grant.sealed.key_id == active:
                already += 1
                break
            try:
                sealed = rewrap(grant.sealed, keys, _context(grant), new_key,
                                _context(grant, grant.token_version + 1))
            except BundleRefused as exc:
                refused.append((grant.binding_id, grant.generation, exc.reason))
                break
            audit = AuditEntry(
                audit_id=new_ulid(now_us), at_us=now_us, actor=actor, role="admin",
                action="grant.rewrap", target_kind="authorization_grant",
                target_id=f"{grant.binding_id}:{grant.generation}", reason=reason,
                before=json.dumps({"key_id": grant.sealed.key_id,
                                   "token_version": grant.token_version}),
                after=json.dumps({"key_id": active, "token_version": grant.token_version + 1}),
            )
            outcome = await store.grant_rewrap(
                binding_id=grant.binding_id, generation=grant.generation,
                expected_version=grant.token_version, sealed=sealed,
                expires_at_us=grant.expires_at_us, now_us=now_us, audit=audit)
            if outcome is RewrapOutcome.REWRAPPED:
                rewrapped += 1
                break
            if outcome is RewrapOutcome.REFRESHING:
                refreshing += 1
                break
            # A refresh (or another rotation) moved it first: look again.
            grant = await store.grant_get(grant.binding_id, grant.generation)
    return RotationReport(rewrapped, already, tuple(refused), refreshing)
