"""Conformance: the "find anything" lists (filters, keyset pages, time bounds) and the id
search, on every backend (storage/find_rows.py)."""

from __future__ import annotations

import attrs
import pytest

from daemon.core.ids import encode_ulid
from storage import find_rows
from storage.effects import mark_receipt
from storage.find_rows import (
    AttemptFilter,
    AuditFilter,
    CommandFilter,
    IngressFilter,
    Page,
    ReceiptFilter,
    attempt_exchange,
    attempts_find,
    attempts_page,
    audit_find,
    commands_find,
    ingress_find,
    next_after,
    receipts_find,
    search,
)
from storage.port import CancelParams
from storage.work_store import WorkStore
from tests.support.find import SECRETS, seed_calls, settle_command
from tests.support.ingress import receipt
from tests.support.work import SEC, T0, spec


async def test_attempts_filter_by_status_outcome_and_time_page_by_id(store: WorkStore) -> None:
    seeded = await seed_calls(store, T0)
    throttled = [s.attempt_id for s in reversed(seeded) if s.status == 429]
    assert len(throttled) == 3
    first = await attempts_find(store, AttemptFilter(status=429, page=Page(limit=2)))
    assert [f.attempt.attempt_id for f in first] == throttled[:2]
    token = next_after([f.attempt.attempt_id for f in first], Page(limit=2))
    assert token == throttled[1]
    rest = await attempts_find(store, AttemptFilter(status=429, page=Page(limit=2,
                                                                          after=token)))
    assert [f.attempt.attempt_id for f in rest] == throttled[2:]
    assert next_after([f.attempt.attempt_id for f in rest], Page(limit=2)) is None
    oldest = await attempts_find(store, AttemptFilter(
        outcome="REPLAY_SAFE_RETRY", page=Page(oldest_first=True, limit=10)))
    assert [f.attempt.attempt_id for f in oldest] == throttled[::-1]
    # Time bounds: the ids minted in [t0 + 1 s, t0 + 3 s).
    window = await attempts_find(store, AttemptFilter(page=Page(
        since_us=T0 + 1 * SEC, until_us=T0 + 3 * SEC)))
    assert [f.attempt.attempt_id for f in window] == [seeded[2].attempt_id,
                                                      seeded[1].attempt_id]
    (only,) = await attempts_find(store, AttemptFilter(outcome="OUTCOME_UNKNOWN"))
    assert (only.attempt.attempt_id, only.binding_id) == (seeded[4].attempt_id,
                                                          "hubspot-main")
    assert await attempts_find(store, AttemptFilter(outcome="none")) == []
    by_binding = await attempts_find(store, AttemptFilter(binding_id="hubspot-main",
                                                          operation=only.operation))
    assert len(by_binding) == len(seeded)
    assert await attempts_find(store, AttemptFilter(binding_id="other")) == []
    assert await attempts_find(store, AttemptFilter(status=500)) == []


async def test_commands_and_receipts_filter_and_page(store: WorkStore) -> None:
    seeded = await seed_calls(store, T0)
    newest = [s.command_id for s in reversed(seeded)]
    assert [c.command_id for c in await commands_find(store, CommandFilter())] == newest
    assert [c.command_id for c in await commands_find(store, CommandFilter(
        settlement="open", binding_id="hubspot-main", binding_generation=1,
        page=Page(limit=3)))] == newest[:3]
    (one,) = await commands_find(store, CommandFilter(local_object="lead", local_id="lead-c"))
    assert one.command_id == seeded[2].command_id
    assert await commands_find(store, CommandFilter(settlement="succeeded")) == []
    assert await commands_find(store, CommandFilter(catalog_revision=99999)) == []
    # No command was settled, so no receipt is owed yet.
    assert await receipts_find(store, ReceiptFilter(status="pending")) == []


async def test_audit_filters_by_actor_action_target_and_time(store: WorkStore) -> None:
    items = [r.work_id for r in await store.work_enqueue([spec() for _ in range(3)], T0)]
    for i, (work_id, actor) in enumerate(zip(items, ("ada", "otto", "ada"), strict=True)):
        await store.work_cancel_audited(CancelParams(work_id=work_id, actor=actor,
                                                     role="operator", reason="test"),
                                        T0 + i * SEC)
    by_ada = await audit_find(store, AuditFilter(actor="ada"))
    assert [e.target_id for e in by_ada] == [items[2], items[0]]
    assert {e.action for e in by_ada} == {"work.cancel"}
    (one,) = await audit_find(store, AuditFilter(target=items[1], action="work.cancel"))
    assert one.actor == "otto"
    assert await audit_find(store, AuditFilter(action="work.replay")) == []
    later = await audit_find(store, AuditFilter(page=Page(since_us=T0 + SEC)))
    assert [e.target_id for e in later] == [items[2], items[1]]
    first = await audit_find(store, AuditFilter(page=Page(limit=1, oldest_first=True)))
    assert [e.target_id for e in first] == [items[0]]
    after = await audit_find(store, AuditFilter(page=Page(limit=5, oldest_first=True,
                                                          after=first[0].audit_id)))
    assert [e.target_id for e in after] == items[1:]


async def test_receipts_by_status(store: WorkStore) -> None:
    seeded = await seed_calls(store, T0)
    now = T0 + 60 * SEC
    for s in seeded[:3]:
        await settle_command(store, s, now)
    await store.db.transact(lambda tx: mark_receipt(tx, seeded[0].command_id, confirmed=True,
                                                    error=None, now_us=now), name="t")
    await store.db.transact(lambda tx: mark_receipt(tx, seeded[1].command_id,
                                                    confirmed=False, error="refused: 422",
                                                    now_us=now), name="t")
    statuses = {}
    for status in ("pending", "refused", "confirmed"):
        statuses[status] = [r.command_id for r in await receipts_find(
            store, ReceiptFilter(status=status))]
    assert statuses == {"confirmed": [seeded[0].command_id],
                        "refused": [seeded[1].command_id],
                        "pending": [seeded[2].command_id]}
    assert len(await receipts_find(store, ReceiptFilter())) == 3


async def test_search_finds_each_kind_by_its_ids(store: WorkStore) -> None:
    seeded = await seed_calls(store, T0)
    s = seeded[1]
    for needle, kind in ((s.attempt_id, "attempt"), (s.command_id, "command"),
                         (s.work_id, "work item"), (f"int-{s.lead}", "command")):
        hits = await search(store, needle)
        assert kind in {h.kind for h in hits}, (needle, hits)
        assert all(h.href.startswith("/admin/") for h in hits)
    (attempt_hit,) = [h for h in await search(store, s.attempt_id) if h.kind == "attempt"]
    assert attempt_hit.href == f"/admin/effects/attempts/{s.attempt_id}"
    assert {h.kind for h in await search(store, "hubspot-main")} == {"binding"}
    remote = await search(store, f"r-{s.lead}")
    assert "remote link" in {h.kind for h in remote}
    assert await search(store, "no-such-id") == []
    assert await search(store, "01ARZ3NDEKTSV4RRFFQ69G5FAV") == []


async def test_a_failed_attempt_keeps_its_redacted_exchange(store: WorkStore) -> None:
    seeded = await seed_calls(store, T0)
    assert await attempt_exchange(store, seeded[0].attempt_id) is None  # a success
    kept = await attempt_exchange(store, seeded[1].attempt_id)
    assert kept is not None
    assert '"jobtitle":"CTO"' in kept.request_body
    assert kept.response_headers == (("content-type", "application/json"),
                                     ("x-ratelimit-remaining", "0"))
    assert "answered 429" in kept.response_body
    assert not any(secret in repr(kept) for secret in SECRETS)
    assert await attempt_exchange(store, "01ARZ3NDEKTSV4RRFFQ69G5FAV") is None


async def test_ingress_receipts_beyond_the_newest(store: WorkStore) -> None:
    ids = [encode_ulid(T0 // 1000 + n * 1000, bytes(10)) for n in range(3)]
    for n, receipt_id in enumerate(ids):
        await store.ingress_receipt_insert(receipt(n, receipt_id=receipt_id), T0 + n * SEC)
    first = await ingress_find(store, IngressFilter(state="received", page=Page(limit=2)))
    assert [r.receipt_id for r in first] == ids[:0:-1]
    rest = await ingress_find(store, IngressFilter(page=Page(limit=2, after=ids[1])))
    assert [r.receipt_id for r in rest] == [ids[0]]
    assert await ingress_find(store, IngressFilter(state="quarantined")) == []
    assert len(await ingress_find(store, IngressFilter(route="r", binding_id="b"))) == 3
    assert [r.receipt_id for r in await ingress_find(store, IngressFilter(
        page=Page(since_us=T0 + SEC)))] == ids[:0:-1]


async def test_attempts_by_operation_or_binding_read_a_window_at_a_time(
        store: WorkStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A filter on the command's operation or binding examines at most SCAN_WINDOW attempts
    per page (issue 23: no scan of every attempt for a rare operation): a page the window
    ends before it fills says so and names where the next one starts; paging on reaches
    every match, newest or oldest first, and ends with no token."""
    seeded = await seed_calls(store, T0)
    newest = [s.attempt_id for s in reversed(seeded)]
    (one,) = await attempts_find(store, AttemptFilter(outcome="OUTCOME_UNKNOWN"))
    monkeypatch.setattr(find_rows, "SCAN_WINDOW", 2)

    async def walk(f: AttemptFilter) -> tuple[list[str], list[bool]]:
        ids: list[str] = []
        ended: list[bool] = []
        after = None
        for _ in range(10):
            got = await attempts_page(store, attrs.evolve(f, page=attrs.evolve(
                f.page, after=after)))
            ids += [a.attempt.attempt_id for a in got.items]
            ended.append(got.window_ended)
            if got.next_after is None:
                return ids, ended
            after = got.next_after
        raise AssertionError("paging did not end")

    everything = AttemptFilter(binding_id="hubspot-main", page=Page(limit=10))
    assert await walk(everything) == (newest, [True, True, True, False])
    oldest = attrs.evolve(everything, page=Page(limit=10, oldest_first=True))
    assert (await walk(oldest))[0] == newest[::-1]
    assert await walk(AttemptFilter(operation="no.such.operation")) == (
        [], [True, True, True, False])
    # A page that fills ends as always, at its last row (the window is not consulted).
    full = await attempts_page(store, AttemptFilter(operation=one.operation,
                                                    page=Page(limit=2)))
    assert ([a.attempt.attempt_id for a in full.items], full.next_after,
            full.window_ended) == (newest[:2], newest[1], False)
    # Filters on the attempt itself stay index-led, with no window.
    monkeypatch.setattr(find_rows, "SCAN_WINDOW", 1)
    rejected = await attempts_page(store, AttemptFilter(status=429, page=Page(limit=10)))
    assert (len(rejected.items), rejected.next_after, rejected.window_ended) == (3, None, False)
