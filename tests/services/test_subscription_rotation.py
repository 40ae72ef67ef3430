"""A webhook secret rotation with no gap, every part real: a replica (the CLI's assembly)
runs the subscription reconciler and the ingress listener; the Outreach simulator's own
sender signs each delivery with its subscription's secret. Deliveries signed with the old
secret are accepted until the old subscriptions are retired, those signed with the new
one from the switch on; none is rejected, and the old subscriptions go only once a
delivery verified with the new secret was received. The epoch moves only when the test
moves it (ManualClock), so no step's outcome depends on the wall time the machine's load
lets pass (a create's answer, a retry's time, a run's "after the rotation")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from config.catalog import load_catalog
from config.load import parse_settings
from config.settings import Settings
from daemon.services.catalog_view import publish_current
from daemon.services.families import known_family_names
from daemon.services.subscription_items import SUBSCRIPTION_FAMILY
from daemon.services.subscription_operator import reconcile_now
from sandbox.outreach_sim import OutreachSimulator
from sandbox.ports import free_port
from storage.port import SqlTx
from storage.subscriptions import SubscriptionRow, read_subscriptions
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.webhooks import ManualClock, ingress_replica, settled
from tests.support.work import T0

RESPONSE_WINDOW_S = 300.0
TOKEN = "s2s-token-rotation"
OLD = "webhook-secret-old"
NEW = "webhook-secret-new"


def _settings(tmp_path: Path, sim_url: str, port: int, *, rotated: bool) -> Settings:
    route: dict[str, Any] = {"route": "outreach-main", "binding_id": "outreach-main",
                             "webhook": "outreach.prospect_events",
                             "public_url": f"http://127.0.0.1:{port}/hooks/outreach-main",
                             "secret_generation": 2 if rotated else 1}
    raw: dict[str, Any] = {
        "replica": {"heartbeat_interval": 1.0, "drain_timeout": 2.0},
        "work": {"poll_interval": 0.05},
        "ingress": {"listen": f"127.0.0.1:{port}", "spool_dir": str(tmp_path / "spool"),
                    "forward_interval": 0.1, "materialize_interval": 0.05},
        "bindings": [{
            "binding_id": "outreach-main", "provider": "outreach", "org_id": "org-1",
            "app_installation_id": "inst-1", "remote_account_id": "acct-1",
            "base_url": sim_url, "auth": "static_token"}],
        "webhook_routes": [route],
    }
    env = {"INTEGRATIOND_WEBHOOK_OUTREACH_MAIN_SECRET": NEW if rotated else OLD,
           "INTEGRATIOND_BINDING_OUTREACH_MAIN_TOKEN": TOKEN}
    if rotated:
        env["INTEGRATIOND_WEBHOOK_OUTREACH_MAIN_PREVIOUS_SECRET"] = OLD
    return parse_settings(raw, environ=env, known_families=known_family_names())


async def _rows(store: WorkStore) -> list[SubscriptionRow]:
    async def body(tx: SqlTx) -> list[SubscriptionRow]:
        return await read_subscriptions(tx)

    return await store.db.transact(body, name="t", write=False)


async def _all_at(store: WorkStore, generation: int, *, rotating: bool = False) -> bool:
    rows = await _rows(store)
    return len(rows) == 3 and all(r.generation == generation and r.rotating is rotating
                                  and (rotating or not r.retiring) for r in rows)


async def _reconcile(store: WorkStore, cfg: Settings, clock: ManualClock) -> None:
    await reconcile_now(store, load_catalog(cfg), cfg.webhook_routes, "outreach-main",
                        actor="test", role="operator", reason="rotation test",
                        now_us=clock.now_us(),
                        max_attempts=cfg.family(SUBSCRIPTION_FAMILY).max_attempts)


async def test_a_secret_rotation_overlaps_old_and_new_with_no_delivery_rejected(
        store: WorkStore, database: FreshDatabase, nursery: trio.Nursery,
        tmp_path: Path) -> None:
    clock = ManualClock()
    # The provider's sender gives up on a delivery after response_window seconds of its
    # real clock (Outreach: 5 s), then redelivers: under load an ingress answer took
    # longer, and a redelivered copy (or the cut request body) is not what this test is
    # about: a window no load reaches here.
    sim = OutreachSimulator(tokens={TOKEN}, response_window=RESPONSE_WINDOW_S)
    sim_url = f"http://127.0.0.1:{await nursery.start(sim.run)}"
    port = free_port()
    before = _settings(tmp_path, sim_url, port, rotated=False)
    after = _settings(tmp_path, sim_url, port, rotated=True)
    await publish_current(store, load_catalog(before), actor="test", role="admin",
                          reason="rotation", now_us=T0)
    prospect = sim.put_prospect({"firstName": "Ada", "emails": ["ada@example.test"]})

    def secrets() -> list[str]:
        return sorted(s.secret for s in sim.subscriptions())

    async def change(name: str) -> None:
        sim.update_prospect(prospect.id, {"firstName": name})
        await sim.wait_deliveries_settled()

    async with ingress_replica(await database.open_store(), before, clock=clock):
        await _reconcile(store, before, clock)
        await settled("three subscriptions with the old secret",
                      lambda: secrets() == [OLD] * 3)
        # Recorded before this replica goes (its drain waits 2 s at most: a step cut there
        # would hold its lease until an epoch this test never reaches).
        await settled("the rows", lambda: _all_at(store, 1))
        await change("Ada1")
    clock.jump(1)
    # The operator rotates: the new secret, the old one as previous, generation 2.
    async with ingress_replica(await database.open_store(), after, clock=clock):
        await _reconcile(store, after, clock)
        await settled("the new subscriptions beside the old ones",
                      lambda: secrets() == sorted([OLD] * 3 + [NEW] * 3))
        # ... and recorded (the provider shows each one before its step's row commits).
        await settled("the rows rotating", lambda: _all_at(store, 2, rotating=True))
        # Until a delivery verified with the new secret is seen, the old ones stay.
        clock.jump(1)
        await _reconcile(store, after, clock)

        async def rotating() -> bool:
            rows = await _rows(store)
            return bool(rows) and all(r.rotating for r in rows) and all(
                r.last_reconciled_at_us and r.last_reconciled_at_us > r.rotated_at_us  # type: ignore[operator]
                for r in rows)

        await settled("a run that found no new-secret delivery yet", rotating)
        assert secrets() == sorted([OLD] * 3 + [NEW] * 3)
        # Both subscriptions deliver this change: one signed with each secret.
        clock.jump(1)
        await change("Ada2")

        async def retired() -> bool:
            await _reconcile(store, after, clock)
            await trio.sleep(0.5)
            return secrets() == [NEW] * 3 and await _all_at(store, 2)

        # The old ones deleted at the provider, and the rows (each delete's finalization
        # commits after the provider shows it gone) no longer rotating nor retiring.
        await settled("the old subscriptions retired", retired)
        rows = await _rows(store)
        assert all(not r.rotating and not r.retiring for r in rows)
        await change("Ada3")
    statuses = [d.status for d in sim.deliveries]
    # Ada1: one (old); Ada2: two (old and new subscription); Ada3: one (new).
    assert len(sim.deliveries) == 4
    assert statuses == [200, 200, 200, 200], statuses
