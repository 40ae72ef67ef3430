"""Issue 21, item 1: a burst of large signed bodies never stalls inbound processing.

A real ``integrationd run`` process on MariaDB at the server's own ``max_allowed_packet``
(16 MiB by default; the burst is sized from the value the server reports, so it is twice
the packet in any case) receives thirty ~1 MB deliveries at once, then a small one. Each
is answered 200 and each becomes a materialized receipt with its event and WorkItem: no
batched write (the receipts' INSERT, the settlement's events and WorkItems) may exceed
the packet, and nothing received after the burst waits behind it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import attrs
import httpx
import pytest
import trio

from config.catalog import load_catalog
from daemon.core.inbound_change import INBOUND_APPLY_FAMILY
from daemon.services.clock import WallClock
from storage.ingress.receipts import ReceiptQuery
from storage.port import SqlTx, WorkQuery
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase, backend_params
from tests.support.ingress import receipt
from tests.support.processes import run_cli, start_replica, stop_all, write_config
from tests.support.webhooks import JSONAPI, OUTREACH_SECRET, ingress_settings, sign

OUTREACH = load_catalog(ingress_settings(Path("/nonexistent"))).webhooks[
    "outreach.prospect_events"]
MAX_BODY = 1024 * 1024   # [ingress] max_body_bytes, the shipped default


def _config(tmp_path: Path, url: str) -> Path:
    (tmp_path / "webhook.secret").write_text(OUTREACH_SECRET + "\n")
    # The shipped ingress sizes (max_body_bytes 1 MiB, materialize_batch 64): the burst
    # meets the batch sizes an operator runs with.
    extra = f"""
[ingress]
listen = "127.0.0.1:0"
spool_dir = "{tmp_path / 'spool'}"
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


def _large_body(pid: int, size: int) -> bytes:
    """An Outreach prospect event of ``size`` bytes (its title fills it)."""
    def body(title: str) -> bytes:
        return json.dumps({
            "data": {"type": "prospect", "id": pid,
                     "attributes": {"title": title, "updatedAt": "2026-12-01T10:00:00.000Z"},
                     "relationships": {"owner": {"data": {"type": "user", "id": 1}}}},
            "meta": {"eventName": "prospect.updated",
                     "deliveredAt": "2026-12-01T10:00:00.123Z"},
        }).encode()

    pad = size - len(body(""))
    out = body((f"t{pid}-" + "x" * pad)[:pad])
    assert len(out) == size
    return out


async def _max_allowed_packet(store: WorkStore) -> int:
    async def read(tx: SqlTx) -> int:
        rows = await tx.fetchall("SELECT @@max_allowed_packet")
        return int(str(rows[0][0]))

    return await store.db.transact(read, name="test.packet", write=False)


@pytest.mark.parametrize("backend", backend_params(("mysql",)))
# A post cut off by that reset leaves httpx's request stream (the test client's, not
# the replica's) unexhausted, and Python reports its collection; only that is ignored.
@pytest.mark.filterwarnings(
    r"ignore:Exception ignored in. <async_generator object ByteStream\.__aiter__"
    ":pytest.PytestUnraisableExceptionWarning")
async def test_a_burst_of_large_bodies_over_the_packet_never_stalls_inbound(
        database: FreshDatabase, tmp_path: Path) -> None:
    assert database.backend == "mysql"
    store = await database.open_store()
    packet = await _max_allowed_packet(store)
    size = MAX_BODY - 4096
    # Base64 in the receipt row: 4/3 of the body. Enough bodies for twice the packet.
    burst = max(30, (2 * packet) // (size * 4 // 3) + 1)
    cfg = _config(tmp_path, database.url)
    replica = await start_replica(cfg, "burst")
    try:
        started = await replica.wait_event("replica_started")
        url = f"{started['ingress']}/hooks/outreach-main"
        statuses: list[int | None] = []
        overloaded: list[int | str] = []

        async def deliver(client: httpx.AsyncClient, body: bytes) -> None:
            status: int | None = None
            for _ in range(5):
                try:
                    answer = await client.post(url, content=body, headers={
                        "content-type": JSONAPI, **sign(OUTREACH, OUTREACH_SECRET, body)})
                except (httpx.RemoteProtocolError, httpx.WriteError, httpx.ReadError) as exc:
                    # The 408 below, seen through TCP: the replica answers before it has
                    # read the whole body and closes, and the unread bytes make the
                    # connection reset, which can take the answer with it (CI, under
                    # load: "Server disconnected without sending a response"). Nothing
                    # was answered 200; a provider redelivers after it, as after a 408.
                    overloaded.append(type(exc).__name__)
                    await trio.sleep(1)
                    continue
                status = answer.status_code
                if status not in (408, 503):
                    break
                # Neither the database nor the spool made the receipt durable within the
                # route's 5 s window (31 MB at once on a shared, loaded 2-core machine:
                # the spool's fsync alone took 3.6 s at load 15), or the body did not
                # arrive in time: refused before any receipt, as documented. Delivered
                # again, as a provider that redelivers after an HTTP error does: what is
                # tested is what happens after the 200s.
                overloaded.append(answer.status_code)
                await trio.sleep(1)
            statuses.append(status)

        bodies = [_large_body(n, size) for n in range(burst)]
        async with httpx.AsyncClient(timeout=30) as client:
            ready = trio.Event()

            async def at_once(client: httpx.AsyncClient, body: bytes) -> None:
                await ready.wait()
                await deliver(client, body)

            async with trio.open_nursery() as nursery:
                for body in bodies:
                    nursery.start_soon(at_once, client, body)
                await trio.sleep(0.2)
                ready.set()
            # After the burst: a small delivery must not wait behind it.
            small = _large_body(10_000, 300)
            await deliver(client, small)
        assert statuses == [200] * (burst + 1), overloaded

        deadline = time.monotonic() + 90
        counts = await store.ingress_counts()
        while time.monotonic() < deadline:
            counts = await store.ingress_counts()
            if counts.by_state["materialized"] == burst + 1:
                break
            await trio.sleep(0.2)
        failures = [e for e in replica.events()
                    if e.get("event") == "ingress_materialize_failed"]
        assert counts.by_state == {**counts.by_state, "received": 0, "quarantined": 0,
                                   "materialized": burst + 1}, (counts, failures[:3])
        receipts = await store.ingress_receipt_list(ReceiptQuery(limit=500))
        assert {r.body for r in receipts} == {*bodies, small}
        items = await store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY, limit=500))
        assert len(items) == burst + 1
        events = [e for r in receipts for e in await store.ingress_events_of(r.receipt_id)]
        assert sorted(e.work_id for e in events) == sorted(i.work_id for i in items)
    finally:
        await stop_all([replica])


@pytest.mark.parametrize("backend", backend_params(("mysql",)))
async def test_large_receipts_left_received_are_all_materialized_by_a_replica(
        database: FreshDatabase, tmp_path: Path) -> None:
    """The state a burst leaves behind, deterministically (how much of a burst one pass
    of the materializer meets depends on timing): thirty ~1 MB receipts still
    ``received``, then a replica starts. Before, its materializer read them in one pass and
    settled them in one transaction whose INSERT exceeded the packet, "connection lost
    (2006)" on every pass, forever: a restart did not help, and the small receipt after
    them waited too."""
    store = await database.open_store()
    packet = await _max_allowed_packet(store)
    size = MAX_BODY - 4096
    burst = max(30, (2 * packet) // size + 1)   # their events: twice the packet
    receipts = [attrs.evolve(
        receipt(n, body=_large_body(n, size), at_us=WallClock().now_us()),
        route="outreach-main", binding_id="outreach-main",
        webhook="outreach.prospect_events", subscription_generation=2)
        for n in range(burst)]
    small = attrs.evolve(receipt(burst, body=_large_body(burst, 300),
                                 at_us=WallClock().now_us() + 10**6),
                         route="outreach-main", binding_id="outreach-main",
                         webhook="outreach.prospect_events", subscription_generation=2)
    for start in range(0, burst, 5):   # stored a few at a time, as a spool forwards them
        await store.ingress_receipts_insert(receipts[start:start + 5], WallClock().now_us())
    await store.ingress_receipt_insert(small, WallClock().now_us())
    cfg = _config(tmp_path, database.url)
    replica = await start_replica(cfg, "restarted")
    try:
        deadline = time.monotonic() + 90
        counts = await store.ingress_counts()
        while time.monotonic() < deadline and counts.by_state["received"]:
            await trio.sleep(0.2)
            counts = await store.ingress_counts()
        failures = [e for e in replica.events()
                    if e.get("event") == "ingress_materialize_failed"]
        assert counts.by_state == {"received": 0, "materialized": burst + 1,
                                   "quarantined": 0}, (counts, failures[:2])
        items = await store.work_list(WorkQuery(family=INBOUND_APPLY_FAMILY, limit=500))
        assert len(items) == burst + 1
    finally:
        await stop_all([replica])
