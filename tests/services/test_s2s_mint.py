"""The S2S mint through the single-winner token owner (issue 9 item 4; seed 8.2).

A real token endpoint (``sandbox/s2s_token_sim.py``) checks each RS256 app JWT with the
app's public key and ``iss``; a real database holds the grant. Many claimants that see an
expired token cause exactly one mint; a JWT the endpoint refuses marks the grant "needs
re-authorization" after one call; no token, key or JWT reaches the logs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from config.settings import Secret
from daemon.core.token_bundle import BundleContext, SecretText, TokenBundle, TokenKey, seal
from daemon.core.work import Fence
from daemon.services.clock import WallClock
from daemon.services.token_refresh import MintEndpoint, TokenOwner, TokenUnavailable
from sandbox.s2s_token_sim import S2STokenEndpoint, s2s_routes
from storage.grants import GrantState
from storage.work_store import WorkStore
from tests.support.work import claim, enqueue

KEY = TokenKey("k1", bytes(range(32)))
CLOCK = WallClock()
APP_ID = "s2s-app-1"
INSTALL = "install-42"


def _private_pem() -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _public_pem(private_pem: bytes) -> bytes:
    key = serialization.load_pem_private_key(private_pem, password=None)
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


PRIVATE = _private_pem()
OTHER_PRIVATE = _private_pem()


@pytest.fixture
async def s2s() -> AsyncIterator[tuple[S2STokenEndpoint, str]]:
    sim = S2STokenEndpoint(app_id=APP_ID, public_key_pem=_public_pem(PRIVATE),
                           installs={INSTALL})
    async with trio.open_nursery() as nursery:
        port = await nursery.start(sim.run)
        yield sim, (f"http://127.0.0.1:{port}/api/app/installs/{INSTALL}/actions/"
                    "accessToken")
        nursery.cancel_scope.cancel()


async def _setup(store: WorkStore, items: int) -> list[Fence]:
    now = CLOCK.now_us()
    # An S2S grant has no refresh token: its first token is minted on first use.
    bundle = TokenBundle(access_token=SecretText("none-yet"), refresh_token=None,
                         expires_at_us=now - 1)
    await store.grant_install(binding_id="b1", generation=1,
                              sealed=seal(bundle, KEY, BundleContext("b1", 1, 1)),
                              expires_at_us=bundle.expires_at_us, now_us=now)
    await enqueue(store, items, now=now)
    got = await claim(store, now=now, limit=items)
    return [i.fence for i in got.claimed if i.fence is not None]


def _endpoint(url: str, private: bytes = PRIVATE, app_id: str = APP_ID) -> MintEndpoint:
    return MintEndpoint(url, app_id, Secret(private.decode()))


async def test_many_claimants_see_an_expired_token_one_mint_reaches_the_endpoint(
        store: WorkStore, s2s: tuple[S2STokenEndpoint, str],
        caplog: pytest.LogCaptureFixture) -> None:
    sim, url = s2s
    fences = await _setup(store, items=6)
    got: list[tuple[str, int]] = []
    async with httpx.AsyncClient() as http:
        owner = TokenOwner(store, {"k1": KEY}, "k1", http, CLOCK)

        async def one(fence: Fence) -> None:
            token = await owner.access_token(fence, "b1", 1, _endpoint(url))
            got.append((token.token.reveal(), token.token_version))

        async with trio.open_nursery() as nursery:
            for fence in fences:
                nursery.start_soon(one, fence)
    assert [e["answer"] for e in sim.journal] == ["ok"]
    assert len(got) == 6 and {v for _, v in got} == {2}
    (token,) = {t for t, _ in got}
    assert token in sim.access_tokens
    grant = await store.grant_get("b1", 1)
    assert grant is not None and grant.token_version == 2
    # One hour, as the endpoint said (within this test's own runtime).
    assert 3500 * 1_000_000 < grant.expires_at_us - CLOCK.now_us() <= 3600 * 1_000_000
    assert token not in caplog.text and PRIVATE.decode() not in caplog.text


@pytest.mark.parametrize(("private", "app_id"), [
    (OTHER_PRIVATE, APP_ID),  # signed by another key
    (PRIVATE, "someone-else"),  # another issuer
])
async def test_a_refused_app_jwt_needs_reauthorization_after_one_call(
        store: WorkStore, s2s: tuple[S2STokenEndpoint, str], private: bytes,
        app_id: str) -> None:
    sim, url = s2s
    (fence,) = await _setup(store, items=1)
    async with httpx.AsyncClient() as http:
        owner = TokenOwner(store, {"k1": KEY}, "k1", http, CLOCK)
        with pytest.raises(TokenUnavailable) as info:
            await owner.access_token(fence, "b1", 1, _endpoint(url, private, app_id))
        assert info.value.reason == "needs_reauthorization"
        with pytest.raises(TokenUnavailable) as again:
            await owner.access_token(fence, "b1", 1, _endpoint(url))
        assert again.value.reason == "needs_reauthorization"
    assert [str(e["answer"]).split(":")[0] for e in sim.journal] == ["invalid_jwt"]
    grant = await store.grant_get("b1", 1)
    assert grant is not None and grant.state is GrantState.NEEDS_REAUTHORIZATION
    assert grant.reason is not None and grant.reason.code == "invalid_jwt"


async def test_the_routes_mount_in_another_simulator() -> None:
    sim = S2STokenEndpoint(app_id=APP_ID, public_key_pem=_public_pem(PRIVATE))
    ((method, pattern, _),) = s2s_routes(sim)
    assert method == "POST"
    assert pattern.match(f"/api/app/installs/{INSTALL}/actions/accessToken") is not None
    assert pattern.match("/api/v2/prospects/1") is None
