"""The torture run's webhook judgement (``bench.torture_webhooks.judge``), table-driven: the
sender's delivery journal against receipts, events and inbound items, so each broken
invariant is shown to count (a check that could never fail would prove nothing)."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from bench.torture_webhooks import BROKEN, ReceiptRow, judge
from sandbox.outreach_sim import DeliveryRecord

A, B = "a" * 64, "b" * 64  # two events' body digests


def tries(sha: str, *outcomes: int | str) -> list[DeliveryRecord]:
    """One event's tries: an int is an HTTP answer, "net" a network failure, "cut" an
    attempt in flight when the sender stopped (``interrupted``)."""
    kinds = {"net": "network_error", "cut": "interrupted"}
    return [DeliveryRecord(seq=0, subscription_id=1, event_name="prospect.updated",
                           prospect_id=1, attempt=n, request_id=f"{sha[:4]}-{n}",
                           body_sha256=sha, outcome=kinds.get(str(o), "delivered"),
                           status=None if o in kinds else int(o))
            for n, o in enumerate(outcomes, 1)]


def receipt(sha: str, n: int = 1, state: str = "materialized") -> ReceiptRow:
    return ReceiptRow(f"R{sha[:4]}{n}", f"wh:{sha[:8]}:{n}", sha, state)


def settled(*receipts: ReceiptRow) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """One event per receipt, each with its succeeded item."""
    return ([(r.receipt_id, f"W{r.receipt_id}") for r in receipts],
            {f"W{r.receipt_id}": "succeeded" for r in receipts})


ONE = receipt(A)
TWIN = attrs.evolve(receipt(A, 2), dedup_key=ONE.dedup_key)  # ONE's key, stored again
ROWS: list[tuple[str, list[DeliveryRecord], list[ReceiptRow], Any, Any, dict[str, int]]] = [
    ("answered 200, one receipt, one event, item done", tries(A, 200), [ONE], *settled(ONE),
     {}),
    ("redelivered after a reset: one event, one receipt", tries(A, "net", 200), [ONE],
     *settled(ONE), {"webhook_attempts": 2}),
    ("answered 200, no receipt", tries(A, 200), [], [], {},
     {"webhooks_lost": 1}),
    ("answered 200, two receipts of one body", tries(A, 200), [ONE, receipt(A, 2)],
     *settled(ONE, receipt(A, 2)), {"webhook_receipts_not_once": 1, "webhook_receipts": 2}),
    ("a receipt of a body never sent", tries(A, 200), [ONE, receipt(B)],
     *settled(ONE, receipt(B)), {"webhook_receipts_not_once": 1, "webhook_receipts": 2}),
    ("every try a network failure: the provider's loss, not ours",
     tries(A, "net", "net", "net", "net"), [], [], {},
     {"webhooks_undelivered": 1, "webhook_attempts": 4, "webhooks_answered_200": 0}),
    ("stored, but answered after the sender gave up", tries(A, "net", "net", "net", "net"),
     [ONE], *settled(ONE),
     {"webhooks_undelivered": 1, "webhook_attempts": 4, "webhooks_answered_200": 0}),
    # Seed 11 (--duration 30): the simulation restarted the sender while its request was
    # in flight; the replica had stored it. The journal now shows the attempt (before, it
    # showed none: "a receipt of a body never sent", the row above, which still counts).
    ("stored, the sender stopped before the answer", tries(A, "cut"), [ONE], *settled(ONE),
     {"webhooks_undelivered": 1, "webhooks_answered_200": 0}),
    ("the sender stopped in flight, nothing stored", tries(A, "cut"), [], [], {},
     {"webhooks_undelivered": 1, "webhooks_answered_200": 0}),
    ("the sender stopped in flight, stored twice under its one dedup key",
     tries(A, "cut"), [ONE, TWIN], *settled(ONE, TWIN),
     {"webhooks_undelivered": 1, "webhooks_answered_200": 0, "webhook_receipts": 2,
      "webhook_receipts_not_once": 1}),
    ("answered 503, nothing stored", tries(A, 503), [], [], {},
     {"webhooks_answered_non200": 1, "webhooks_answered_200": 0}),
    ("a receipt never materialized", tries(A, 200), [receipt(A, state="received")], [], {},
     {"webhook_events_not_once": 1}),
    ("a receipt materialized into two events", tries(A, 200), [ONE],
     [(ONE.receipt_id, "W1"), (ONE.receipt_id, "W2")], {"W1": "succeeded", "W2": "succeeded"},
     {"webhook_events_not_once": 1, "inbound_items": 2}),
    ("an event without its inbound item", tries(A, 200), [ONE], [(ONE.receipt_id, "W1")], {},
     {"webhook_events_not_once": 1, "inbound_items": 0}),
    ("its inbound item dead", tries(A, 200), [ONE], [(ONE.receipt_id, "W1")], {"W1": "dead"},
     {"inbound_not_succeeded": 1}),
]


@pytest.mark.parametrize(("name", "journal", "receipts", "events", "items", "expected"), ROWS,
                         ids=[r[0] for r in ROWS])
def test_judge(name: str, journal: list[DeliveryRecord], receipts: list[ReceiptRow],
               events: list[tuple[str, str]], items: dict[str, str],
               expected: dict[str, int]) -> None:
    got = judge(journal, receipts, events, items, spooled_left=0)
    defaults = {"webhooks_sent": 1, "webhook_attempts": 1, "webhooks_answered_200": 1,
                "webhooks_answered_non200": 0, "webhooks_undelivered": 0,
                "webhook_receipts": len(receipts), "inbound_items": len(items),
                **dict.fromkeys(BROKEN, 0)}
    want = {**defaults, **expected}
    assert {k: got[k] for k in want} == want


def test_spooled_receipts_and_collapsed_redeliveries_are_counted() -> None:
    stored = [ReceiptRow("R1", "k1", A, "materialized", via="spool", duplicates=2),
              ReceiptRow("R2", "k2", B, "materialized")]
    got = judge([*tries(A, 200), *tries(B, 200)], stored, *settled(*stored), spooled_left=0)
    assert (got["webhook_receipts_via_spool"], got["webhook_duplicates_collapsed"]) == (1, 2)
    assert {k: got[k] for k in BROKEN} == dict.fromkeys(BROKEN, 0)


def test_records_left_in_a_spool_count_as_broken() -> None:
    assert judge(tries(A, 200), [ONE], *settled(ONE), spooled_left=2)[
        "webhooks_spooled_left"] == 2
    assert "webhooks_spooled_left" in BROKEN


FIRST: list[tuple[str, list[DeliveryRecord], list[ReceiptRow], list[dict[str, Any]]]] = [
    ("exactly once: nothing named", tries(A, "net", 200), [ONE], []),
    ("two receipts of a body answered 200", tries(A, 200), [ONE, receipt(A, 2)],
     [{"why": "answered_200_receipts", "receipts": ["Raaaa1", "Raaaa2"], "count": 2,
       "body_sha256": A[:16], "deliveries": [["aaaa-1", 1, "delivered", 200]]}]),
    ("a receipt of a body never sent", tries(A, 200), [ONE, receipt(B)],
     [{"why": "body_never_sent", "receipts": ["Rbbbb1"], "count": 1, "body_sha256": B[:16],
       "deliveries": []}]),
    ("stored twice under one key after the sender stopped", tries(A, "cut"), [ONE, TWIN],
     [{"why": "dedup_key_receipts", "receipts": ["Raaaa1", "Raaaa2"], "count": 2,
       "body_sha256": A[:16], "deliveries": [["aaaa-1", 1, "interrupted", None]],
       "dedup_key": ONE.dedup_key}]),
    ("stored after the sender stopped: sent, nothing named", tries(A, "cut"), [ONE], []),
]


@pytest.mark.parametrize(("name", "journal", "receipts", "expected"), FIRST,
                         ids=[r[0] for r in FIRST])
def test_receipts_not_once_names_its_receipts(name: str, journal: list[DeliveryRecord],
                                              receipts: list[ReceiptRow],
                                              expected: list[dict[str, Any]]) -> None:
    got = judge(journal, receipts, *settled(*receipts), spooled_left=0)
    assert got["webhook_receipts_not_once_first"] == expected
    assert (got["webhook_receipts_not_once"] > 0) == bool(expected)


def test_one_dedup_key_stored_twice_is_named_with_its_key() -> None:
    twice = [ReceiptRow("R1", "k", A, "materialized"), ReceiptRow("R2", "k", B, "materialized")]
    got = judge([*tries(A, 200), *tries(B, 200)], twice, *settled(*twice), spooled_left=0)
    assert got["webhook_receipts_not_once"] == 1
    assert got["webhook_receipts_not_once_first"] == [
        {"why": "dedup_key_receipts", "receipts": ["R1", "R2"], "count": 2,
         "body_sha256": A[:16], "deliveries": [["aaaa-1", 1, "delivered", 200]],
         "dedup_key": "k"}]
