"""An operator's ``[families.NAME] max_attempts`` reaches every WorkItem of that family,
whoever queues it (SQLite, MariaDB). The configuration is the TOML an operator writes; the
parts are the daemon's own assembly and operator commands:

- ``subscription_reconcile``: an operator's reconcile-now run, the steps that run queues
  and the next run of the chain (before the fix, every one had the built-in 5);
- ``cursor_reconcile``: ``integrationd reconcile start``'s run (the built-in 5 before);
- ``inbound_apply``: the materializer's items from a webhook receipt (8 before).
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path
from typing import Any

import attrs
import trio

from config.catalog import load_catalog
from config.load import parse_settings
from config.settings import Settings
from daemon.reconcile_cli import run_reconcile_command
from daemon.services.assembly import assemble
from daemon.services.catalog_view import publish_current
from daemon.services.families import WorkContext, known_family_names
from daemon.services.metrics import Metrics
from daemon.services.principal_bootstrap import ensure_config_bindings
from daemon.services.subscription_operator import reconcile_now, start_chains
from daemon.services.subscriptions import SUBSCRIPTION_FAMILY, SubscriptionPayload
from sandbox.outreach_sim import OutreachSimulator
from storage.ingress.receipts import Materialization
from storage.port import SqlTx, WorkQuery
from storage.work_store import WorkStore
from tests.support.ingress import receipt
from tests.support.webhooks import prospect_body
from tests.support.work import SEC, T0, claim, finalization

TOKEN = "s2s-token-max-attempts"

OPERATOR_TOML = """
[[operators]]
name = "ada"
role = "operator"

[families.subscription_reconcile]
max_attempts = 2

[families.cursor_reconcile]
max_attempts = 3

[families.inbound_apply]
max_attempts = 4

[ingress]
listen = "127.0.0.1:0"
spool_dir = "{spool}"

[[bindings]]
binding_id = "outreach-main"
provider = "outreach"
org_id = "org-1"
app_installation_id = "inst-1"
remote_account_id = "acct-1"
base_url = "{base_url}"
auth = "static_token"

[[webhook_routes]]
route = "outreach-main"
binding_id = "outreach-main"
webhook = "outreach.prospect_events"
public_url = "https://hooks.example.test/hooks/outreach-main"
"""


def _settings(tmp_path: Path, base_url: str) -> Settings:
    raw = tomllib.loads(OPERATOR_TOML.format(spool=tmp_path / "spool", base_url=base_url))
    return parse_settings(raw, environ={
        "INTEGRATIOND_BINDING_OUTREACH_MAIN_TOKEN": TOKEN,
        "INTEGRATIOND_WEBHOOK_OUTREACH_MAIN_SECRET": "webhook-secret"},
        known_families=known_family_names())


@attrs.define
class Clock:
    now: int = T0

    def now_us(self) -> int:
        return self.now


async def test_subscription_items_carry_the_familys_max_attempts(
        store: WorkStore, nursery: trio.Nursery, tmp_path: Path) -> None:
    sim = OutreachSimulator(tokens={TOKEN})
    settings = _settings(tmp_path, f"http://127.0.0.1:{await nursery.start(sim.run)}")
    catalog = load_catalog(settings)
    await ensure_config_bindings(store, settings.bindings, T0)
    clock = Clock()
    assembly = assemble(settings, store, clock)
    try:
        # A replica's start: each binding's run chain.
        assert await start_chains(store, catalog, settings.webhook_routes, clock.now,
                                  max_attempts=2) == 1
        family = assembly.registry.get(SUBSCRIPTION_FAMILY)
        kinds: list[tuple[str, int]] = []
        for _ in range(10):  # the chain's run, then its steps (one at a time: a lane)
            result = await claim(store, now=clock.now, family=SUBSCRIPTION_FAMILY)
            if not result.claimed:
                break
            for item in result.claimed:
                kinds.append((SubscriptionPayload.from_payload(item.payload).kind,
                              item.max_attempts))
                assert item.fence is not None
                ctx = WorkContext(item=item, fence=item.fence, store=store, clock=clock,
                                  replica_id="A")
                outcome = await family.handler(ctx)
                writes = list(ctx.side_writes)

                async def all_writes(tx: SqlTx, writes: list[Any] = writes) -> None:
                    for write in writes:
                        await write(tx)

                (done,) = await store.work_finalize_if_owner(
                    [finalization(item, outcome, clock.now)], "A", lambda: clock.now,
                    {item.work_id: all_writes} if writes else None)
                assert done.applied
            clock.now += SEC
        assert len(sim.subscriptions()) == 3  # the steps ran
        # ... and an operator's reconcile-now.
        await reconcile_now(store, catalog, settings.webhook_routes, "outreach-main",
                            actor="ada", role="operator", reason="max_attempts test",
                            now_us=clock.now, max_attempts=2)
        everything = await store.work_list(WorkQuery(family=SUBSCRIPTION_FAMILY, limit=100))
        assert sorted({SubscriptionPayload.from_payload(i.payload).kind
                       for i in everything}) == ["create", "run"]
        # The chain's run, three creates, the chain's next run, the operator's run.
        assert len(everything) == 6
        assert {(SubscriptionPayload.from_payload(i.payload).kind, i.max_attempts)
                for i in everything} == {("run", 2), ("create", 2)}, kinds
    finally:
        await assembly.aclose()


async def test_a_cursor_reconcile_run_carries_the_familys_max_attempts(
        store: WorkStore, tmp_path: Path) -> None:
    settings = _settings(tmp_path, "http://127.0.0.1:1")
    await publish_current(store, load_catalog(settings), actor="ada", role="admin",
                          reason="max_attempts test", now_us=T0)
    await run_reconcile_command(store, settings, argparse.Namespace(
        reconcile_command="start", binding="outreach-main", resource="prospect",
        actor="ada", reason="max_attempts test"))
    (run,) = await store.work_list(WorkQuery(family="cursor_reconcile", limit=10))
    assert run.max_attempts == 3


async def test_a_webhook_change_carries_the_inbound_familys_max_attempts(
        store: WorkStore, tmp_path: Path) -> None:
    settings = _settings(tmp_path, "http://127.0.0.1:1")
    assembly = assemble(settings, store, Clock(), Metrics())
    try:
        assert assembly.ingress is not None
        plan = assembly.ingress.materializer.plan(attrs.evolve(
            receipt(1, body=prospect_body()), route="outreach-main",
            binding_id="outreach-main", webhook="outreach.prospect_events"))
        assert isinstance(plan, Materialization)
        assert [s.max_attempts for s in plan.work] == [4]
    finally:
        await assembly.aclose()
