"""A rotated-out webhook secret retires itself, every part real: a replica (the CLI's
assembly) runs the subscription reconciler and the ingress listener against the Outreach
simulator, whose own sender signs each delivery with its subscription's secret.

After the rotation completes (the old subscriptions deleted, every new one listed active),
a reconcile run starts watching the previous secret; it retires only once the L1
redelivery window (Outreach: 3 redeliveries 1 s apart after a 5 s response window, 23 s)
passed with no delivery verified with it. A straggler signed with the old secret inside
the window holds the retirement back for a window after it. Once retired (a durable row,
audited as a system action, a gauge), a delivery signed with the old secret is refused
before any receipt, like a bad signature, and counted as ``retired_secret``; a restart
whose configuration still names the previous secret does not bring it back. The epoch
moves only when the test moves it (ManualClock: the replica's real timers cannot run on
trio's MockClock against real sockets and a real database), so every time the test
asserts (the straggler inside the window, the check it pushes back, the quiet window
after it) is exact, whatever wall time the machine's load lets pass between two steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import trio

from config.catalog import load_catalog
from config.load import parse_settings
from config.settings import Settings
from daemon.services.catalog_view import publish_current
from daemon.services.families import known_family_names
from daemon.services.replica import Replica
from daemon.services.subscription_items import SUBSCRIPTION_FAMILY
from daemon.services.subscription_operator import reconcile_now
from sandbox.outreach_sim import OutreachSimulator
from sandbox.ports import free_port
from storage.port import SqlTx
from storage.secret_retirements import RetirementRow, read_retirements
from storage.subscriptions import SubscriptionRow, read_subscriptions
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.webhooks import (
    ManualClock,
    ingress_replica,
    post,
    prospect_body,
    settled,
    sign,
)
from tests.support.work import T0

RESPONSE_WINDOW_S = 300.0
TOKEN = "s2s-token-retire"
OLD = "webhook-secret-retire-old"
NEW = "webhook-secret-retire-new"
ROUTE = "outreach-main"
WINDOW_S = 23.0  # from config/providers/outreach.toml: 4 x 5 s + 3 x 1 s


def _settings(tmp_path: Path, sim_url: str, port: int, *, rotated: bool) -> Settings:
    raw: dict[str, Any] = {
        "replica": {"heartbeat_interval": 1.0, "drain_timeout": 2.0},
        "work": {"poll_interval": 0.05},
        "ingress": {"listen": f"127.0.0.1:{port}", "spool_dir": str(tmp_path / "spool"),
                    "forward_interval": 0.1, "materialize_interval": 0.05},
        "bindings": [{
            "binding_id": "outreach-main", "provider": "outreach", "org_id": "org-1",
            "app_installation_id": "inst-1", "remote_account_id": "acct-1",
            "base_url": sim_url, "auth": "static_token"}],
        "webhook_routes": [{"route": ROUTE, "binding_id": "outreach-main",
                            "webhook": "outreach.prospect_events",
                            "public_url": f"http://127.0.0.1:{port}/hooks/{ROUTE}",
                            "secret_generation": 2 if rotated else 1}],
    }
    env = {"INTEGRATIOND_WEBHOOK_OUTREACH_MAIN_SECRET": NEW if rotated else OLD,
           "INTEGRATIOND_BINDING_OUTREACH_MAIN_TOKEN": TOKEN}
    if rotated:
        # Left in the configuration on purpose: a retirement outlives it.
        env["INTEGRATIOND_WEBHOOK_OUTREACH_MAIN_PREVIOUS_SECRET"] = OLD
    return parse_settings(raw, environ=env, known_families=known_family_names())


async def _read(store: WorkStore) -> tuple[list[SubscriptionRow], list[RetirementRow]]:
    async def body(tx: SqlTx) -> tuple[list[SubscriptionRow], list[RetirementRow]]:
        return await read_subscriptions(tx), await read_retirements(tx)

    return await store.db.transact(body, name="t", write=False)


async def _state(store: WorkStore) -> RetirementRow | None:
    _, retirements = await _read(store)
    assert len(retirements) <= 1
    return retirements[0] if retirements else None


async def _receipts(store: WorkStore) -> list[tuple[str, str, int | None]]:
    async def body(tx: SqlTx) -> list[tuple[str, str, int | None]]:
        rows = await tx.fetchall("SELECT receipt_id, verification, previous_secret_at_us"
                                 " FROM ingress_receipts ORDER BY receipt_id", ())
        return [(str(r[0]), str(r[1]), None if r[2] is None else int(str(r[2])))
                for r in rows]

    return await store.db.transact(body, name="t", write=False)


def _rejected(replica: Replica, reason: str) -> float:
    return float(replica.metrics.ingress_rejections.labels(reason)._value.get())


def _accepted_gauge(replica: Replica) -> float | None:
    return replica.metrics.registry.get_sample_value(
        "integrationd_webhook_previous_secret_accepted", {"route": ROUTE})


async def test_the_previous_secret_retires_itself_after_a_quiet_redelivery_window(
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
    catalog = load_catalog(after)
    hook = catalog.webhooks["outreach.prospect_events"]
    assert hook.redelivery_window_s() == WINDOW_S
    await publish_current(store, load_catalog(before), actor="test", role="admin",
                          reason="retire", now_us=T0)
    prospect = sim.put_prospect({"firstName": "Ada", "emails": ["ada@example.test"]})

    def secrets() -> list[str]:
        return sorted(s.secret for s in sim.subscriptions())

    async def reconcile(cfg: Settings) -> None:
        await reconcile_now(store, load_catalog(cfg), cfg.webhook_routes, "outreach-main",
                            actor="test", role="operator", reason="retire test",
                            now_us=clock.now_us(),
                            max_attempts=cfg.family(SUBSCRIPTION_FAMILY).max_attempts)

    async def change(name: str) -> None:
        sim.update_prospect(prospect.id, {"firstName": name})
        await sim.wait_deliveries_settled()

    async def straggler(name: str) -> None:
        """One delivery the provider signs with the old secret (a subscription made
        outside our reconciler, gone again before any run lists it)."""
        sid = sim.subscribe_direct(resource="prospect", action="updated",
                                   url=after.webhook_routes[0].public_url, secret=OLD)
        await change(name)
        sim.delete_subscription_behind_back(sid)

    async with ingress_replica(await database.open_store(), before, clock=clock):
        await reconcile(before)
        await settled("three subscriptions with the old secret",
                      lambda: secrets() == [OLD] * 3)

        async def created() -> bool:  # recorded before this replica goes (2 s drain)
            rows, _ = await _read(store)
            return len(rows) == 3 and all(r.generation == 1 for r in rows)

        await settled("the rows", created)
    async with ingress_replica(await database.open_store(), after, clock=clock) as replica:
        await reconcile(after)
        await settled("the new subscriptions beside the old ones",
                      lambda: secrets() == sorted([OLD] * 3 + [NEW] * 3))

        async def recorded() -> bool:  # the provider shows each before its row commits
            rows, _ = await _read(store)
            return len(rows) == 3 and all(r.rotating and r.generation == 2 for r in rows)

        await settled("the rows rotating", recorded)
        await change("Ada1")  # one copy signed with each secret: proves the new one
        clock.jump(1)  # the rotation completes a second after that delivery

        async def rotated() -> bool:
            await reconcile(after)
            await trio.sleep(0.3)
            rows, _ = await _read(store)
            return secrets() == [NEW] * 3 and all(not r.retiring for r in rows)

        await settled("the old subscriptions deleted", rotated)
        # The rotation is over; a run now starts the watch (never a retirement at once).
        async def watching() -> bool:
            await reconcile(after)
            await trio.sleep(0.3)
            return await _watching(store)

        await settled("the watch", watching)
        watch = await _state(store)
        assert watch is not None and watch.secret_generation == 2
        assert watch.check_at_us == watch.watch_since_us + int(WINDOW_S * 1e6)
        assert _accepted_gauge(replica) == 1.0
        # Within the window the provider still redelivers a copy signed with the old
        # secret: accepted (a receipt verified with the previous secret) ...
        clock.jump(WINDOW_S - 3)
        await straggler("Ada2")
        assert sim.deliveries[-1].status == 200
        # (the two subscriptions' copies of the event are one receipt, verified with the
        # new secret whichever came first; the old copy left its trace on it)
        recent = [r for r in await _receipts(store)
                  if r[2] is not None and r[2] >= watch.watch_since_us + int(
                      (WINDOW_S - 3) * 1e6)]
        assert [v for _, v, _ in recent] == ["verified:0"], await _receipts(store)
        # ... and at the check the window is not quiet: a window after the straggler.
        clock.jump(4)
        await settled("the check that found the straggler",
                      lambda: _checked_later(store, watch.check_at_us))
        held = await _state(store)
        assert held is not None and held.state == "watching"
        assert held.evidence["waiting"] == "previous_secret_used"
        # Quiet for a window after the straggler's receipt (at the watch + 20 s exactly).
        assert held.check_at_us == watch.watch_since_us + int(
            (2 * WINDOW_S - 3) * 1e6) + 1
        assert held.check_at_us > clock.now_us() + int((WINDOW_S - 5) * 1e6)
        # A quiet window after it: retired, durably, audited, on the gauge.
        clock.jump(WINDOW_S)
        await settled("the retirement", lambda: _retired(store))
        retired = await _state(store)
        assert retired is not None and retired.retired_at_us is not None
        (entry,) = [e for e in await store.audit_list()
                    if e.action == "webhooks.previous_secret_retired"]
        assert (entry.actor, entry.role, entry.target_kind, entry.target_id) == (
            "subscription-reconciler", "system", "webhook_route", ROUTE)
        assert OLD not in entry.before + entry.after + entry.reason
        await settled("the gauge", lambda: _accepted_gauge(replica) == 0.0)
        # A delivery signed with the retired secret: 401 before any receipt, counted.
        receipts = await _receipts(store)
        await straggler("Ada3")
        old_copy, = [d for d in sim.deliveries[-2:] if d.status != 200]
        assert old_copy.status == 401
        assert [d.status for d in sim.deliveries[-2:]].count(200) == 1  # the new secret's
        assert _rejected(replica, "retired_secret") == 1.0
        assert _rejected(replica, "bad_signature") == 0.0
        assert len(await _receipts(store)) == len(receipts) + 1
    # A restart with previous_secret still configured does not resurrect it.
    async with ingress_replica(await database.open_store(), after, clock=clock,
                               replica_id="ingress-2") as again:
        body = prospect_body(pid=prospect.id, title="after restart")
        async with httpx.AsyncClient() as client:
            refused = await post(client, again, ROUTE, body, sign(hook, OLD, body))
            taken = await post(client, again, ROUTE, body, sign(hook, NEW, body))
        assert refused.status_code == 401
        assert refused.json()["code"] == "bad_signature"  # says nothing more to a caller
        assert OLD not in refused.text
        assert taken.status_code == 200
        assert _rejected(again, "retired_secret") == 1.0


async def _watching(store: WorkStore) -> bool:
    state = await _state(store)
    return state is not None and state.state == "watching"


async def _retired(store: WorkStore) -> bool:
    state = await _state(store)
    return state is not None and state.state == "retired"


async def _checked_later(store: WorkStore, first_check_us: int) -> bool:
    state = await _state(store)
    return state is not None and state.check_at_us > first_check_us
