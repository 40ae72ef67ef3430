"""Webhooks in the torture run (issue 12 item 2): signed Outreach deliveries flowing into
every replica's ingress listener all the while, and what the end must show.

Theory of operation
-------------------
The Outreach simulator (``sandbox/outreach_sim``) is the sender: it signs each delivery
with the route's secret, answers for itself what Outreach's rule is (any HTTP status is
"delivered"; only a network failure -- refused, reset, no answer within its 5 s window --
is redelivered, 3 times, 1 s apart, each with a new ``Outreach-Webhook-ID``) and journals
every attempt and its outcome (``OutreachSimulator.deliveries``: status code or network
error, the body's SHA-256, never the body).

It holds one subscription per replica, each naming that replica's own ingress listener
(a fixed port, so a restarted replica serves the same URL); before each Prospect change
exactly one of them is active, in turn, so deliveries are spread over the replicas and
the kills and freezes hit requests in flight. ``PROSPECTS`` Prospects are linked to the
first Runtime's Leads (as an operator adopts links); each change sets one inbound-owned
attribute (first name, last name, company) to a value never used before, so every event
has its own body. Its receipt is materialized into one NormalizedEvent and one
``inbound_apply`` WorkItem, which applies the change to the Lead through the reference
Runtime's inbound mutations.

At the end (every replica running, the sender idle, every receipt settled), from the
sender's journal (by body SHA-256: a redelivery carries the same body, so the same dedup
key) and the database:

* ``webhooks_lost``: events answered 200 with no receipt in the database (one left in a
  replica's spool, never forwarded, counts here too);
* ``webhook_receipts_not_once``: events answered 200 with more than one receipt, plus
  receipts of a body the sender never sent;
* ``webhook_events_not_once``: receipts not materialized, or materialized into other than
  exactly one NormalizedEvent, plus events without their one ``inbound_apply`` WorkItem;
* ``webhooks_spooled_left``: records still in the replicas' spools (``.bad`` segments
  included);
* ``inbound_not_succeeded``: ``inbound_apply`` WorkItems that ended other than succeeded.

Events whose every attempt met a network failure are the provider's loss, not ours:
``webhooks_undelivered`` counts them apart, with those whose attempt the sender cut off by
stopping (``interrupted``: the simulation restarts the simulator; the request may have
arrived and been stored, a receipt of a body the journal shows as sent).
``webhook_receipts_not_once_first`` names the receipts (ids and body digests) behind
``webhook_receipts_not_once``.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from daemon.core.identity import integration_scope_digest
from daemon.core.inbound_change import INBOUND_APPLY_FAMILY
from daemon.services.ingress_spool import decode_records
from sandbox.outreach_sim import DeliveryRecord, OutreachSimulator
from storage.open import open_store
from storage.port import SqlTx
from storage.work_store import WorkStore

ROUTE = "outreach-torture"
BINDING = "outreach-0"
REMOTE_ACCOUNT = "outreach-acct-0"
WEBHOOK = "outreach.prospect_events"
SECRET = "torture-webhook-secret"  # a test value the run makes up
TOKEN = "torture-outreach-token"  # a test value the run makes up
# Prospects, each linked to one of the first Runtime's Leads (lead-0 ...).
PROSPECTS = 50
# Deliveries per second per backend. Each is a receipt write, a materialization and an
# inbound_apply item with its Runtime mutation, beside about 30 title changes a second: at
# 4 a second two 60 s runs on this shared 2-core machine held every other invariant and
# every backend drained (settle 22-44 s); at 8 too (settle 26-52 s). 4 keeps the 45 s
# test's settle well inside its bound; --webhook-rate moves it.
DEFAULT_RATE = 4.0
ATTRIBUTES = ("firstName", "lastName", "company")
# Keys that must be 0 (bench.torture's BROKEN takes them).
BROKEN = ("webhooks_lost", "webhook_receipts_not_once", "webhook_events_not_once",
          "webhooks_spooled_left", "inbound_not_succeeded")
CHECK = ("Outreach simulator's delivery journal vs the database: every event answered 200"
         " has exactly one IngressReceipt (redeliveries collapse to it), no receipt of a body"
         " never sent (webhook_receipts_not_once), none answered 200 missing, spools"
         " included (webhooks_lost), each receipt materialized into exactly one"
         " NormalizedEvent and its inbound_apply WorkItem (webhook_events_not_once), the"
         " spools empty at the end (webhooks_spooled_left), every inbound_apply item"
         " succeeded (inbound_not_succeeded); all network failures: the provider's loss,"
         " webhooks_undelivered")


def binding_toml(org_id: str, installation: str, sim_port: int, secret_file: Path) -> str:
    """The Outreach binding (in the first Runtime's org) and its webhook route."""
    return (
        f'\n[[bindings]]\nbinding_id = "{BINDING}"\nprovider = "outreach"\n'
        f'org_id = "{org_id}"\napp_installation_id = "{installation}"\n'
        f'remote_account_id = "{REMOTE_ACCOUNT}"\nbase_url = "http://127.0.0.1:{sim_port}"\n'
        'auth = "static_token"\n'
        f'\n[[webhook_routes]]\nroute = "{ROUTE}"\nbinding_id = "{BINDING}"\n'
        f'webhook = "{WEBHOOK}"\nsubscription_generation = 1\n'
        f'secret_file = "{secret_file}"\n')


def ingress_toml(port: int, spool_dir: Path) -> str:
    """Replica *i*'s ingress listener: a fixed port (a restart serves the same URL) and
    its own spool."""
    return (f'\n[ingress]\nlisten = "127.0.0.1:{port}"\nspool_dir = "{spool_dir}"\n'
            'forward_interval = 0.5\nmaterialize_interval = 0.2\n')


def env() -> dict[str, str]:
    """The Outreach binding's static token (the simulator accepts it; an update event
    with its updatedAt needs no read of the Prospect, but a Hydrate would)."""
    return {f"INTEGRATIOND_BINDING_{BINDING.upper().replace('-', '_')}_TOKEN": TOKEN}


@attrs.define(eq=False)
class Webhooks:
    """One backend's webhook traffic: the simulator, the replicas' ingress ports and
    spools."""

    ports: list[int]
    spools: list[Path]
    rate: float
    osim: OutreachSimulator = attrs.field(factory=lambda: OutreachSimulator(tokens={TOKEN}))
    subscriptions: list[int] = attrs.field(factory=list)
    changes: int = 0

    def seed(self) -> None:
        """The Prospects (silently, as they were before the run) and one inactive
        subscription per replica."""
        for p in range(1, PROSPECTS + 1):
            self.osim.put_prospect({"firstName": "First", "lastName": "Last",
                                    "company": "Company", "emails": [f"p{p}@example.com"]},
                                   prospect_id=p)
        for port in self.ports:
            sid = self.osim.subscribe_direct(
                resource="prospect", action="*", secret=SECRET,
                url=f"http://127.0.0.1:{port}/hooks/{ROUTE}")
            self.osim.set_subscription_active(sid, False)
            self.subscriptions.append(sid)

    async def traffic(self) -> None:
        """``rate`` Prospect changes per second until cancelled, each delivered to the
        next replica in turn. A Prospect's three attributes change one after the other, so
        changes of one record reach different replicas a moment apart (and, redelivered,
        out of order): the inbound Flow's per-field watermarks are exercised too."""
        if self.rate <= 0:
            await trio.sleep_forever()
        while True:
            n = self.changes
            for i, sid in enumerate(self.subscriptions):
                self.osim.set_subscription_active(sid, i == n % len(self.subscriptions))
            attribute = ATTRIBUTES[n % len(ATTRIBUTES)]
            self.osim.update_prospect(1 + (n // len(ATTRIBUTES)) % PROSPECTS,
                                      {attribute: f"V{n}"})
            self.changes += 1
            await trio.sleep(1 / self.rate)

    def spooled_left(self) -> int:
        """Records (and unreadable segments) still in the replicas' spools."""
        left = 0
        for spool in self.spools:
            for path in spool.glob("segment-*"):
                if path.suffix == ".bad":
                    left += 1
                    continue
                try:
                    records, _ = decode_records(path.read_bytes())
                except FileNotFoundError:  # forwarded and removed meanwhile
                    continue
                left += len(records)
        return left

    def journal(self) -> list[dict[str, Any]]:
        return [d.to_json() for d in self.osim.deliveries]


async def seed_links(url: str, org_id: str, installation: str) -> None:
    """Prospect *p* is linked to the first Runtime's ``lead-{p - 1}``."""
    store = await open_store(url, sqlite_synchronous="NORMAL")
    try:
        scope = integration_scope_digest(org_id, installation, "outreach", REMOTE_ACCOUNT)
        for p in range(1, PROSPECTS + 1):
            await store.link_adopt(scope, "lead", f"lead-{p - 1}", "prospect", str(p),
                                   actor="torture", role="admin", reason="torture seed",
                                   now_us=time.time_ns() // 1000)
    finally:
        await store.db.aclose()


async def unsettled(store: WorkStore) -> int:
    """Receipts still waiting to be materialized."""
    counts = await store.ingress_counts()
    return int(counts.by_state.get("received", 0))


@attrs.frozen
class ReceiptRow:
    receipt_id: str
    dedup_key: str
    body_sha256: str
    state: str
    via: str = "direct"  # or "spool": made durable in a replica's spool first
    duplicates: int = 0  # deliveries of its key after the first (redeliveries collapsed)


def judge(deliveries: Sequence[DeliveryRecord], receipts: Sequence[ReceiptRow],
          events: Sequence[tuple[str, str]], items: Mapping[str, str],
          spooled_left: int) -> dict[str, Any]:
    """The sender's journal against the database's rows (pure: see the module's docstring).
    ``events``: (receipt id, work id) per NormalizedEvent; ``items``: the ``inbound_apply``
    WorkItems' states by work id."""
    outcomes: dict[str, list[tuple[str, int | None]]] = collections.defaultdict(list)
    for d in deliveries:
        outcomes[d.body_sha256].append((d.outcome, d.status))
    answered_200 = {sha for sha, o in outcomes.items() if ("delivered", 200) in o}
    non_200 = {sha for sha, o in outcomes.items()
               if any(k == "delivered" and s != 200 for k, s in o)}
    # No attempt answered: each met a network failure, or the sender itself stopped with it
    # in flight ("interrupted": it may have arrived and been stored all the same).
    undelivered = {sha for sha, o in outcomes.items()
                   if all(k in ("network_error", "interrupted") for k, _ in o)}
    by_sha = collections.Counter(r.body_sha256 for r in receipts)
    by_key = collections.Counter(r.dedup_key for r in receipts)
    # Which receipts broke "exactly once", by id, with what the judge counted (ids, body
    # digests and delivery outcomes only, never a body): a body answered 200 with more than
    # one receipt, a receipt of a body the journal never shows sent, one dedup key with
    # more than one receipt.

    def named(why: str, of: Sequence[ReceiptRow], sha: str) -> dict[str, Any]:
        return {"why": why, "receipts": sorted(r.receipt_id for r in of),
                "count": len(of), "body_sha256": sha[:16],
                "deliveries": [[d.request_id, d.attempt, d.outcome, d.status]
                               for d in deliveries if d.body_sha256 == sha]}

    not_once = [named("answered_200_receipts",
                      [r for r in receipts if r.body_sha256 == sha], sha)
                for sha in sorted(answered_200) if by_sha[sha] > 1]
    not_once += [named("body_never_sent", [r for r in receipts if r.body_sha256 == sha], sha)
                 for sha in sorted(by_sha) if sha not in outcomes]
    for key in sorted(k for k, n in by_key.items() if n > 1):
        same = [r for r in receipts if r.dedup_key == key]
        not_once.append({**named("dedup_key_receipts", same, same[0].body_sha256),
                         "dedup_key": key})
    events_of = collections.Counter(receipt_id for receipt_id, _ in events)
    events_not_once = sum(1 for r in receipts
                          if r.state != "materialized" or events_of[r.receipt_id] != 1)
    events_not_once += sum(1 for _, work_id in events if work_id not in items)
    return {
        "webhooks_sent": len(outcomes),
        "webhook_attempts": len(deliveries),
        "webhooks_answered_200": len(answered_200),
        "webhooks_answered_non200": len(non_200),
        "webhook_statuses": dict(collections.Counter(
            str(d.status if d.outcome == "delivered" else d.outcome) for d in deliveries)),
        "webhooks_undelivered": len(undelivered),
        "webhook_receipts": len(receipts),
        "webhook_receipts_via_spool": sum(1 for r in receipts if r.via == "spool"),
        "webhook_duplicates_collapsed": sum(r.duplicates for r in receipts),
        "webhooks_lost": sum(1 for sha in answered_200 if by_sha[sha] == 0),
        "webhook_receipts_not_once": (
            sum(1 for sha in answered_200 if by_sha[sha] > 1)
            + sum(n for sha, n in by_sha.items() if sha not in outcomes)
            + sum(n - 1 for n in by_key.values() if n > 1)),
        "webhook_receipts_not_once_first": not_once[:3],
        "webhook_events_not_once": events_not_once,
        "webhooks_spooled_left": spooled_left,
        "inbound_items": len(items),
        "inbound_not_succeeded": sum(1 for state in items.values() if state != "succeeded"),
    }


async def invariants(store: WorkStore, hooks: Webhooks) -> dict[str, Any]:
    """:func:`judge` on the sender's journal and the database's rows."""

    async def rows(tx: SqlTx) -> tuple[list[Any], list[Any], list[Any]]:
        receipts = await tx.fetchall(
            "SELECT receipt_id, dedup_key, body_sha256, state, via, duplicates"
            " FROM ingress_receipts"
            " WHERE route = ?", (ROUTE,))
        events = await tx.fetchall("SELECT receipt_id, work_id FROM normalized_events")
        items = await tx.fetchall("SELECT work_id, state FROM work_items WHERE family = ?",
                                  (INBOUND_APPLY_FAMILY,))
        return list(receipts), list(events), list(items)

    receipts, events, items = await store.db.transact(rows, name="torture.webhooks",
                                                      write=False)
    return judge(hooks.osim.deliveries,
                 [ReceiptRow(str(r[0]), str(r[1]), str(r[2]), str(r[3]), str(r[4]),
                             int(r[5])) for r in receipts],
                 [(str(e[0]), str(e[1])) for e in events],
                 {str(i[0]): str(i[1]) for i in items}, hooks.spooled_left())
