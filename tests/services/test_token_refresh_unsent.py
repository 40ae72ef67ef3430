"""A refresh owner that committed its dispatch marker and then never sent its request, while
a successor judged its expired lease in doubt (the Galera torture run of 2026-12-07 08:00,
docs/performance.md: a grant left ``refresh_in_doubt`` whose refresh token the provider
never saw, its binding's effects waiting for an operator).

Two ways an owner knows for certain that no byte of its request left after its marker:

* the marker's COMMIT was not confirmed (its answer lost, or not read within the
  adapter's 15 s COMMIT timeout: a freeze across the COMMIT; the simulation's
  ``lost_after_commit``), so the owner does not send;
* the connection to the token endpoint was never made (``ConnectError``).

Frozen past its refresh lease in either place, the owner woke to a grant a successor had
marked in doubt because of its marker. Before: it ended its lease (or left it) and the
grant stayed in doubt for good, though its refresh token was never presented. Now: in the
transaction that ends its lease (only while the lease is still its own), it puts the grant
back to valid at the *same* version, so the next owner refreshes, once.

The real OAuth simulator on loopback; a manual MockClock moves time only where the test
says."""

from __future__ import annotations

import logging
import socket
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from config.settings import Secret
from daemon.core.token_bundle import TokenKey
from daemon.core.work import Fence
from daemon.services.clock import TrioClock
from daemon.services.token_refresh import (
    AccessToken,
    RefreshEndpoint,
    TokenOwner,
    TokenUnavailable,
)
from sandbox.oauth_sim import refreshes_per_token, running_oauth, token_digest
from storage.grants import GrantState
from storage.port import CommitOutcomeUnknown
from storage.refresh_leases import MarkerRefused
from storage.work_store import WorkStore
from tests.support.grants import expired_grant_and_claims

KEY = TokenKey("k1", bytes(range(32)))
CLIENT_SECRET = "client-SECRET-unsent"
SEC = 1_000_000
LEASE_S = 30


def _owner(store: WorkStore, http: httpx.AsyncClient, clock: TrioClock) -> TokenOwner:
    return TokenOwner(store, {"k1": KEY}, "k1", http, clock, lease_us=LEASE_S * SEC,
                      call_margin_us=5 * SEC, wait_us=35 * SEC)


def _closed_port_url() -> str:
    """A loopback token URL nobody listens on: the connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/oauth/token"


async def _ask(got: list[object], owner: TokenOwner, fence: Fence,
               endpoint: RefreshEndpoint) -> None:
    try:
        got.append(await owner.access_token(fence, "b1", 1, endpoint))
    except Exception as exc:  # what the frozen owner ends with is asserted below
        got.append(exc)


def _failed_reasons(caplog: pytest.LogCaptureFixture) -> list[tuple[str, Any]]:
    return [(str(getattr(r, "fields", {}).get("reason")), getattr(r, "fields", {}).get("healed"))
            for r in caplog.records if r.getMessage() == "token_refresh_failed"]


@pytest.mark.parametrize("where", ["marker_commit_unconfirmed", "never_connected"])
async def test_an_owner_that_never_sent_after_its_marker_heals_the_doubt_it_caused(
        store: WorkStore, mock_clock: trio.testing.MockClock,
        caplog: pytest.LogCaptureFixture, where: str) -> None:
    caplog.set_level(logging.WARNING, logger="integrationd")
    clock = TrioClock()
    async with running_oauth(CLIENT_SECRET) as (sim, url):
        sim.seed("refresh-SECRET-0")
        first_fence, second_fence = await expired_grant_and_claims(
            store, KEY, clock.now_us(), access="access-SECRET-0", refresh="refresh-SECRET-0")
        endpoint = RefreshEndpoint(url, "client-1", Secret(CLIENT_SECRET))
        # The frozen owner's request would go nowhere if it ever left (never_connected
        # needs a refused connection; the other case must never reach the simulator).
        first_endpoint = RefreshEndpoint(
            _closed_port_url() if where == "never_connected" else url, "client-1",
            Secret(CLIENT_SECRET))
        frozen, thawed = trio.Event(), trio.Event()
        marker = store.refresh_dispatch
        inner = store.db.transact

        async def marker_then_frozen(**kw: Any) -> MarkerRefused | None:
            written = await marker(**kw)
            assert written is None  # committed: the call may leave
            frozen.set()
            await thawed.wait()
            return written

        async def commit_unconfirmed(body: Any, *, name: str, write: bool = True) -> Any:
            result = await inner(body, name=name, write=write)
            if name == "refresh.dispatch":
                frozen.set()  # the COMMIT happened; its answer is not read in time
                await thawed.wait()
                raise CommitOutcomeUnknown(f"{name}: no answer to COMMIT within 15s")
            return result

        got: list[object] = []
        async with httpx.AsyncClient() as http:
            first, second = _owner(store, http, clock), _owner(store, http, clock)
            async with trio.open_nursery() as nursery:
                if where == "never_connected":
                    setattr(store, "refresh_dispatch", marker_then_frozen)  # noqa: B010
                else:
                    store.db.transact = commit_unconfirmed  # type: ignore[method-assign]
                nursery.start_soon(_ask, got, first, first_fence, first_endpoint)
                await frozen.wait()  # the marker is committed; nothing has left
                setattr(store, "refresh_dispatch", marker)  # noqa: B010
                store.db.transact = inner  # type: ignore[method-assign]
                mock_clock.jump(LEASE_S + 1)  # frozen past the refresh lease
                with pytest.raises(TokenUnavailable) as judged:
                    await second.access_token(second_fence, "b1", 1, endpoint)
                assert judged.value.reason == "refresh_in_doubt"
                thawed.set()  # the owner wakes: it has not sent, and never will
            assert sim.journal == []  # nobody presented the refresh token
            grant = await store.grant_get("b1", 1)
            assert grant is not None
            # Healed at the same version: the refresh token is unspent.
            assert (grant.state, grant.token_version, grant.reason) == (
                GrantState.VALID, 1, None), (
                f"the owner never sent, yet the grant stays {grant.state.value}"
                f" ({grant.reason.code if grant.reason else None}) at version"
                f" {grant.token_version}")
            assert not await store.refresh_in_flight("b1", 1, clock.now_us())
            # The next owner refreshes, once, with the token nobody presented.
            token = await second.access_token(second_fence, "b1", 1, endpoint)
    assert isinstance(token, AccessToken) and token.token_version == 2
    assert refreshes_per_token(sim.journal) == {token_digest("refresh-SECRET-0"): 1}
    assert await store.refresh_count("b1", 1) == 1
    (ended,) = got
    assert getattr(ended, "reason", None) == (
        "refresh_transport" if where == "never_connected" else "refresh_lease_lost"), ended
    expected = "transport" if where == "never_connected" else "marker_unconfirmed"
    assert _failed_reasons(caplog) == [(expected, True)]
