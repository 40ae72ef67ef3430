"""Signing webhook deliveries the way the providers do, and a replica with ingress.

``sign`` uses the shipped L1 signature contract and the pure digest functions the
verifier uses, so a test signs exactly what a provider would; ``ingress_settings`` builds
a configuration with one Outreach route (and optionally a HubSpot one) through the real
settings loader (secrets from the environment, as an operator would set them).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from config.definitions import WebhookDefinition
from config.load import parse_settings
from config.settings import Settings
from daemon.core.webhook_signature import digest, encode_digest, signed_bytes
from daemon.services.assembly import assemble
from daemon.services.clock import Clock, WallClock
from daemon.services.families import known_family_names
from daemon.services.metrics import Metrics
from daemon.services.principal_bootstrap import ensure_config_bindings
from daemon.services.replica import Replica
from storage.work_store import WorkStore
from tests.support.work import T0

OUTREACH_SECRET = "outreach-webhook-secret-1"
HUBSPOT_SECRET = "hubspot-app-secret-1"
JSONAPI = "application/vnd.api+json"


def ingress_settings(tmp_path: Path, **ingress: Any) -> Settings:
    raw: dict[str, Any] = {
        "replica": {"heartbeat_interval": 1.0, "drain_timeout": 2.0},
        "work": {"poll_interval": 0.1},
        "ingress": {"listen": "127.0.0.1:0", "spool_dir": str(tmp_path / "spool"),
                    "forward_interval": 0.1, "materialize_interval": 0.05, **ingress},
        "bindings": [
            {"binding_id": "outreach-main", "provider": "outreach", "org_id": "org-1",
             "app_installation_id": "inst-1", "remote_account_id": "acct-1",
             "base_url": "http://127.0.0.1:1"},
            {"binding_id": "hubspot-main", "provider": "hubspot", "org_id": "org-1",
             "app_installation_id": "inst-1", "remote_account_id": "portal-1",
             "base_url": "http://127.0.0.1:1"},
        ],
        "webhook_routes": [
            {"route": "outreach-main", "binding_id": "outreach-main",
             "webhook": "outreach.prospect_events", "subscription_generation": 3},
            {"route": "hubspot-main", "binding_id": "hubspot-main",
             "webhook": "hubspot.contact_events",
             "public_url": "https://hooks.example/hooks/hubspot-main"},
        ],
    }
    env = {"INTEGRATIOND_WEBHOOK_OUTREACH_MAIN_SECRET": OUTREACH_SECRET,
           "INTEGRATIOND_WEBHOOK_HUBSPOT_MAIN_SECRET": HUBSPOT_SECRET}
    return parse_settings(raw, environ=env, known_families=known_family_names())


def prospect_body(pid: int = 42, event: str = "prospect.updated", title: str = "CTO",
                  delivered: str = "2026-12-01T10:00:00.123Z") -> bytes:
    return json.dumps({
        "data": {"type": "prospect", "id": pid,
                 "attributes": {"title": title, "updatedAt": "2026-12-01T10:00:00.000Z"},
                 "relationships": {"owner": {"data": {"type": "user", "id": 1}}}},
        "meta": {"eventName": event, "deliveredAt": delivered},
    }).encode()


def hubspot_event(event_id: int, object_id: int, *, attempt: int = 0,
                  subscription_type: str = "contact.propertyChange") -> dict[str, Any]:
    """One HubSpot v3 webhook event (an element of a delivered batch), with every field
    the v3 payload carries; ``attempt`` is its attemptNumber (0 on the first attempt)."""
    return {"eventId": event_id, "subscriptionId": 4711, "portalId": 62515, "appId": 1160452,
            "occurredAt": 1764580000000 + event_id, "subscriptionType": subscription_type,
            "attemptNumber": attempt, "objectId": object_id, "changeSource": "CRM_UI",
            "propertyName": "jobtitle", "propertyValue": f"title {event_id}"}


def sign(webhook: WebhookDefinition, secret: str, body: bytes, *, uri: str = "",
         timestamp_ms: int = 0, method: str = "POST") -> dict[str, str]:
    spec = webhook.signature
    timestamp = str(timestamp_ms) if spec.timestamp_header else ""
    message = signed_bytes(spec, method=method, uri=uri, body=body, timestamp=timestamp)
    headers = {spec.header: encode_digest(spec, digest(spec, secret.encode(), message))}
    if spec.timestamp_header:
        headers[spec.timestamp_header] = timestamp
    return headers


class ManualClock:
    """Epoch time that moves only when the test moves it (:meth:`jump`), from ``T0``.

    What a real replica decides by the epoch (a lease, a retry's time, a provider's window,
    a watch's check, a receipt's time against a rotation's) then depends on the test's
    steps alone, not on how much wall time the machine's load lets pass between two of
    them (the wall clock plus an offset did: a check ran before a straggler under load).
    The replica's own timers (polls, heartbeats, HTTP timeouts) still wait in real time:
    trio's MockClock cannot drive a replica that talks to real sockets and a real database
    (its autojump fires a connection's deadlines while a statement is in flight). Nothing
    scheduled in the epoch's future runs until the test jumps past it."""

    def __init__(self, epoch_us: int = T0) -> None:
        self._now_us = epoch_us

    def jump(self, seconds: float) -> None:
        self._now_us += int(seconds * 1_000_000)

    def now_us(self) -> int:
        return self._now_us


@asynccontextmanager
async def ingress_replica(store: WorkStore, cfg: Settings,
                          replica_id: str = "ingress-1", clock: Clock | None = None
                          ) -> AsyncIterator[Replica]:
    """A real replica (the CLI's assembly) with its ingress listener on a loopback port;
    the configured bindings' durable rows bootstrapped first, as ``integrationd run`` does."""
    metrics = Metrics()
    clock = clock if clock is not None else WallClock()
    await ensure_config_bindings(store, cfg.bindings, clock.now_us())
    parts = assemble(cfg, store, clock, metrics)
    assert parts.ingress is not None
    replica = Replica(cfg, store, parts.registry, clock, metrics=metrics,
                      replica_id=replica_id, ingress_app=parts.ingress.app)
    parts.ingress.app.replica_id = replica_id
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(replica.run)
            yield replica
            replica.request_drain()
    finally:
        await parts.aclose()


def hooks_url(replica: Replica, route: str) -> str:
    return f"{replica.ingress_address}/hooks/{route}"


async def eventually(predicate: Callable[[], Awaitable[bool]], within_s: float = 30.0) -> None:
    """Wait until a real replica's background tasks made ``predicate`` true (they run in
    real time: see :class:`ManualClock`); an AssertionError after ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await trio.sleep(0.05)
    raise AssertionError("condition not reached")


# How long :func:`settled` waits for a replica before calling it stuck: a guard against a
# hang, not a timing the test asserts (nothing the test checks depends on when it settles:
# the epoch does not move while it waits, see :class:`ManualClock`).
STUCK_S = 300.0


async def settled(what: str, predicate: Callable[[], Awaitable[bool] | bool]) -> None:
    """Wait until a real replica's background tasks made ``predicate`` true, polling; an
    AssertionError naming ``what`` only when they seem stuck (:data:`STUCK_S`)."""
    with trio.move_on_after(STUCK_S):
        while True:
            got = predicate()
            if got if isinstance(got, bool) else await got:
                return
            await trio.sleep(0.05)
    raise AssertionError(f"not reached (stuck for {STUCK_S:g} s): {what}")


async def post(client: httpx.AsyncClient, replica: Replica, route: str, body: bytes,
               headers: dict[str, str], content_type: str = JSONAPI) -> httpx.Response:
    return await client.post(hooks_url(replica, route), content=body,
                             headers={"content-type": content_type, **headers})
