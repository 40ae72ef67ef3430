"""Issue 21, item 1: one receipt the database cannot store whole never stalls the others.

The materializer settled a pass's receipts in one transaction, and a settlement that
failed left every one of them ``received``; the next pass read the same oldest receipts
and failed the same way, forever (every later delivery waited behind them). Now a pass
writes in transactions bounded by bytes, a settlement failing with an error of its own
statements is split down to the receipt at fault, and that receipt is quarantined with
its stable reason and a sentence; the others are materialized in the same pass.

Real stores on every backend, with the statement limit lowered to 200,000 bytes (MariaDB:
below the server's ``max_allowed_packet``; SQLite: ``SQLITE_LIMIT_LENGTH``) so that a
receipt whose body fits (as base64) but whose events do not (non-ASCII text is escaped
six bytes a character in the stored JSON) is a few hundred KB rather than 16 MiB.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import attrs

from config.catalog import load_catalog
from daemon.services.clock import WallClock
from daemon.services.materializer import Materializer
from daemon.services.metrics import Metrics
from storage.ingress.receipts import IngressReceipt, ReceiptQuery
from storage.port import WorkQuery
from tests.support.backends import FreshDatabase
from tests.support.ingress import receipt
from tests.support.webhooks import ingress_settings, prospect_body
from tests.support.work import T0

LIMIT = 200_000


def _outreach(n: int, body: bytes) -> IngressReceipt:
    return attrs.evolve(receipt(n, body=body), route="outreach-main",
                        binding_id="outreach-main", webhook="outreach.prospect_events",
                        subscription_generation=3,
                        body_sha256=hashlib.sha256(body).hexdigest())


async def test_a_receipt_too_large_to_store_is_quarantined_and_the_others_materialize(
        database: FreshDatabase, tmp_path: Path) -> None:
    store = await database.open_store(max_statement_bytes=LIMIT)
    cfg = ingress_settings(tmp_path)
    metrics = Metrics()
    materializer = Materializer(max_attempts=8, store=store, catalog=load_catalog(cfg),
                                routes={r.route: r for r in cfg.webhook_routes},
                                clock=WallClock(), metrics=metrics)
    # As a provider sends it: UTF-8, not \u escapes (2 bytes a character).
    large_body = json.dumps(json.loads(prospect_body(pid=99, title="\u00e9" * 60_000)),
                            ensure_ascii=False).encode()
    assert len(large_body) * 4 // 3 < LIMIT < 6 * 60_000   # stored, but not its event
    receipts = [_outreach(n, prospect_body(pid=n)) for n in range(5)]
    receipts.insert(2, _outreach(5, large_body))
    answers = await store.ingress_receipts_insert(receipts, T0)
    assert [getattr(a, "stored", a) for a in answers] == [True] * 6

    settled = await materializer.run_once()

    assert settled == 6   # one pass: the five materialized and the one quarantined
    by_id = {r.receipt_id: r for r in await store.ingress_receipt_list(ReceiptQuery())}
    large = by_id[receipts[2].receipt_id]
    assert (large.state, large.quarantine_reason) == ("quarantined", "too_large_to_store")
    assert large.quarantine_detail == (
        "one of its rows (its events and WorkItems) is larger than the database takes in"
        f" one statement ({LIMIT} bytes: the server's max_allowed_packet)")
    assert large.body == large_body   # the raw body stays, for a replay
    assert sorted(r.state for r in by_id.values()) == ["materialized"] * 5 + ["quarantined"]
    assert await store.ingress_events_of(large.receipt_id) == []
    items = await store.work_list(WorkQuery(limit=50))
    assert len(items) == 5
    text = metrics.render().decode()
    assert 'integrationd_ingress_quarantined_total{reason="too_large_to_store"} 1.0' in text
    assert 'integrationd_db_batch_splits_total{write="ingress_settle"}' in text
    assert 'integrationd_db_batch_splits_total{write="ingress_settle"} 0.0' not in text
    assert 'integrationd_ingress_unsettled{reason="storage_error"} 0.0' in text
