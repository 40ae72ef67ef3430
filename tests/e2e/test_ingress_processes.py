"""Webhook ingress in real ``integrationd run`` processes, killed with SIGKILL while
deliveries arrive and receipts are being materialized: every delivery answered 200 is
there after a restart, and each becomes exactly one event and one WorkItem."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import trio

from config.catalog import load_catalog
from daemon.core.inbound_change import INBOUND_APPLY_FAMILY
from storage.ingress.receipts import ReceiptQuery
from storage.port import WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase
from tests.support.processes import run_cli, start_replica, stop_all, write_config
from tests.support.webhooks import JSONAPI, OUTREACH_SECRET, ingress_settings, prospect_body, sign

OUTREACH = load_catalog(ingress_settings(Path("/nonexistent"))).webhooks[
    "outreach.prospect_events"]


def _config(tmp_path: Path, url: str) -> Path:
    (tmp_path / "webhook.secret").write_text(OUTREACH_SECRET + "\n")
    extra = f"""
[ingress]
listen = "127.0.0.1:0"
spool_dir = "{tmp_path / 'spool'}"
materialize_batch = 3
materialize_interval = 0.05
forward_interval = 0.2

[[bindings]]
binding_id = "outreach-main"
provider = "outreach"
org_id = "org-1"
app_installation_id = "inst-1"
remote_account_id = "acct-1"
base_url = "http://127.0.0.1:1"

[[webhook_routes]]
route = "outreach-main"
binding_id = "outreach-main"
webhook = "outreach.prospect_events"
subscription_generation = 2
secret_file = "{tmp_path / 'webhook.secret'}"

[[operators]]
name = "publisher"
role = "admin"
"""
    cfg = write_config(tmp_path / "ingress.toml", url, extra=extra)
    published = run_cli(cfg, "catalog", "publish", "--actor", "publisher", "--reason", "e2e")
    assert published.returncode == 0, published.stderr
    return cfg


async def _materialized_all(store: WorkStore, expected: int, within_s: float = 90) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        counts = await store.ingress_counts()
        if counts.by_state["received"] == 0 and counts.by_state["materialized"] == expected:
            return
        await trio.sleep(0.1)
    raise AssertionError(f"not materialized: {await store.ingress_counts()}")


async def test_sigkill_while_receiving_and_materializing_loses_and_doubles_nothing(
        database: FreshDatabase, tmp_path: Path) -> None:
    store = await database.open_store()
    cfg = _config(tmp_path, database.url)
    first = await start_replica(cfg, "first")
    replicas = [first]
    try:
        started = await first.wait_event("replica_started")
        url = f"{started['ingress']}/hooks/outreach-main"
        answered: list[bytes] = []

        async def deliver(client: httpx.AsyncClient, n: int) -> None:
            body = prospect_body(pid=n, title=f"title {n}")
            try:
                answer = await client.post(url, content=body, headers={
                    "content-type": JSONAPI, **sign(OUTREACH, OUTREACH_SECRET, body)})
            except httpx.HTTPError:
                return  # the process died under this request: never answered 200
            if answer.status_code == 200:
                answered.append(body)

        async with httpx.AsyncClient(timeout=10) as client:
            async with trio.open_nursery() as nursery:
                for n in range(60):
                    nursery.start_soon(deliver, client, n)
                    await trio.sleep(0.01)
                    if n == 40:
                        first.kill()  # mid-stream: some answered, some materialized
            await first.wait()
        assert answered, "some deliveries were answered before the kill"
        counts = await store.ingress_counts()
        # Killed mid-way: receipts were still waiting while others had been materialized.
        assert counts.by_state["materialized"] > 0

        second = await start_replica(cfg, "second")
        replicas.append(second)
        await second.wait_event("replica_started")
        # Every answered delivery is there (from the database or the spool), once.
        expected = len(answered)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            bodies = {r.body for r in await store.ingress_receipt_list(
                ReceiptQuery(limit=500))}
            if set(answered) <= bodies:
                break
            await trio.sleep(0.1)
        receipts = await store.ingress_receipt_list(ReceiptQuery(limit=500))
        assert set(answered) <= {r.body for r in receipts}
        await _materialized_all(store, len(receipts))
        assert len(receipts) >= expected
        items = await store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY, limit=1000))
        events = [e for r in receipts for e in await store.ingress_events_of(r.receipt_id)]
        assert len(events) == len(receipts) == len(items)
        assert sorted(e.work_id for e in events) == sorted(i.work_id for i in items)
        assert len({i.dedupe_key for i in items}) == len(items)
        assert len({i.source_lane for i in items}) == len(items)  # one Prospect each
    finally:
        await stop_all(replicas)
