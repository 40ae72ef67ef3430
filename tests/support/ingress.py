"""Receipts and materializations for storage tests (real rows, every backend)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from daemon.core.inbound_change import InboundChange
from storage.ingress.receipts import IngressReceipt, Materialization, NormalizedEvent


def receipt(n: int, *, key: str | None = None, body: bytes | None = None,
            at_us: int = 1_800_000_000_000_000, receipt_id: str | None = None
            ) -> IngressReceipt:
    raw = body if body is not None else b'{"n": %d, "bytes": "\xff"}' % n
    return IngressReceipt(
        receipt_id=receipt_id or f"R{n:025d}", dedup_key=key or f"wh:r:{n}", route="r",
        binding_id="b", webhook="p.events", subscription_generation=1,
        received_at_us=at_us + n, body=raw, body_sha256=hashlib.sha256(raw).hexdigest(),
        headers={"content-type": "application/json"}, replica_id="test")


def materialization(r: IngressReceipt, events: int = 1,
                    identities: Sequence[str | None] | None = None,
                    filler: str = "") -> Materialization:
    """``events`` events of ``r`` (one per identity key when ``identities`` is given: the
    events of a route that declares a per-event identity; None: an event without one).
    ``filler``: an attribute as large as the test needs (a large webhook body's field)."""
    keys = list(identities) if identities is not None else [None] * events
    evs, specs = [], []
    for i, identity_key in enumerate(keys):
        event_id = f"{r.receipt_id}:{i}"
        change = InboundChange(provider="p", binding="b", resource_type="thing",
                               resource_id=f"{r.receipt_id}-{i}", kind="updated",
                               attributes={"a": i, **({"f": filler} if filler else {})},
                               origin="webhook", origin_id=event_id)
        specs.append(change.work_spec(org_id="o", catalog_revision=1, catalog_digest="d"))
        evs.append(NormalizedEvent(
            event_id=event_id, receipt_id=r.receipt_id, event_index=i, provider="p",
            binding_id="b", event_name="thing.updated", kind="updated",
            resource_type="thing", resource_id=f"{r.receipt_id}-{i}", delivered_at="t",
            remote_updated_at=None, subscription_generation=1,
            attributes={"a": i, **({"f": filler} if filler else {})},
            identity_key=identity_key))
    return Materialization(receipt_id=r.receipt_id, events=tuple(evs), work=tuple(specs))
