"""Helpers for token-owner tests: a grant whose access token has expired, and live claims
that may refresh it."""

from __future__ import annotations

from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from daemon.core.work import Fence
from storage.work_store import WorkStore
from tests.support.work import claim, enqueue

SEC = 1_000_000


async def expired_grant_and_claims(store: WorkStore, key: TokenKey, now_us: int, *,
                                   access: str, refresh: str, claims: int = 2) -> list[Fence]:
    """Binding ``b1`` generation 1 holds version 1, already expired, sealed under ``key``;
    ``claims`` noop items are claimed (an hour's lease): their fences."""
    bundle = TokenBundle(access_token=SecretText(access), refresh_token=SecretText(refresh),
                         expires_at_us=now_us - 1)
    await store.grant_install(binding_id="b1", generation=1,
                              sealed=seal(bundle, key, BundleContext("b1", 1, 1)),
                              expires_at_us=now_us - 1, now_us=now_us)
    await enqueue(store, claims, now=now_us)
    got = await claim(store, now=now_us, limit=claims, ttl=3600 * SEC)
    return [i.fence for i in got.claimed if i.fence is not None]
