"""Rows for the history tests: quota slots reserved, given back and refunded; effect
items of several orgs, bindings and operations finished; the executions' rollup as every
reader sees it."""

from __future__ import annotations

import attrs

from daemon.core.lost_slots import SendGate
from daemon.core.outcomes import DeadLetter, Succeeded
from daemon.core.quota import QuotaPolicy
from daemon.core.work import Fence
from storage.history import EFFECT_FAMILY
from storage.port import SqlTx
from storage.quota import SlotRelease, SlotReserved
from storage.work_store import WorkStore
from tests.support.commands import OTHER_ORG, SCOPE, accept_pinned, draft
from tests.support.work import SEC, claim, enqueue, finalize

# A rollup row's key: level, bucket, family, outcome, org, binding, operation.
RollupKey = tuple[int, int, str, str, str, str, str]

POLICY = QuotaPolicy(limit=600, window_us=60 * SEC, jitter_us=0)  # ten a second


async def _fence(store: WorkStore, owner: str, now: int, ttl: int) -> Fence:
    (item,) = (await claim(store, owner=owner, now=now, ttl=ttl, limit=1)).claimed
    assert item.fence is not None
    return item.fence


async def _reserve(store: WorkStore, key: str, fence: Fence, now: int) -> SlotReserved:
    got = await store.quota_reserve(key, POLICY, fence=fence, gate=SendGate.CHECKPOINT,
                                    now=lambda: now)
    assert isinstance(got, SlotReserved)
    return got


async def use_quota(a: WorkStore, b: WorkStore, t0: int) -> None:
    """In ``t0``'s minute, A reserves two slots of ``k`` (at ``t0`` and a second later)
    and gives the second back, B one of ``other``; in the next minute, a claim of A's
    is lost with its slot of ``k``, refunded by B's quota sweep."""
    await enqueue(a, 4, now=t0)
    first = await _fence(a, "A", t0, ttl=600 * SEC)
    kept = await _reserve(a, "k", first, t0)
    second = await _fence(a, "A", t0, ttl=600 * SEC)
    given = await _reserve(a, "k", second, t0 + SEC)
    await a.quota_release(second, [SlotRelease(given.reservation_id, "k", POLICY,
                                               given.position_us)], now=lambda: t0 + SEC)
    third = await _fence(b, "B", t0, ttl=600 * SEC)
    await _reserve(b, "other", third, t0 + 2 * SEC)
    later = t0 - t0 % 60_000_000 + 60_000_000 + 5 * SEC
    lost = await _fence(a, "A", later, ttl=SEC)
    await _reserve(a, "k", lost, later)
    await _fence(b, "B", later + 2 * SEC, ttl=600 * SEC)  # reclaimed by B
    (refund,) = await b.quota_return_lost({"k": POLICY}, now_us=later + 3 * SEC,
                                          margin_us=0)
    assert refund.work_id == lost.work_id
    assert kept.slot_us == t0




# (lead, org scope, binding, operation, outcome) of :func:`finish_effects`' commands.
EFFECTS = (
    ("lead-a", "org-1", "hubspot-main", "hubspot.contact.update_jobtitle", "succeeded"),
    ("lead-b", "org-1", "hubspot-main", "hubspot.deal.create", "succeeded"),
    ("lead-c", "org-1", "hubspot-eu", "hubspot.contact.update_jobtitle", "dead"),
    ("lead-d", "org-2", "hubspot-eu", "hubspot.deal.create", "dead"),
    ("lead-e", "org-2", "hubspot-eu", "hubspot.deal.create", "succeeded"),
)


async def finish_effects(store: WorkStore, t0: int) -> dict[str, str]:
    """One effect item per row of :data:`EFFECTS`, admitted, claimed and finished (as
    the row says, at ``t0 + i`` seconds), and one ``noop`` item succeeded at ``t0``
    (it has no org, binding or operation in the rollup); the work id of each lead."""
    ids = {}
    for i, (lead, org, binding, operation, outcome) in enumerate(EFFECTS):
        now = t0 + i * SEC
        scope = SCOPE if org == "org-1" else OTHER_ORG
        d = attrs.evolve(draft(f"int-{lead}", scope=scope, lead=lead, outbox=f"o-{lead}"),
                         binding_id=binding, operation=operation)
        assert (await accept_pinned(store, d, now)).command_id is not None
        (item,) = (await claim(store, family=EFFECT_FAMILY, now=now, limit=1)).claimed
        result = Succeeded() if outcome == "succeeded" else DeadLetter("refused")
        assert (await finalize(store, item, result, now=now)).applied
        ids[lead] = item.work_id
    (noop,) = await enqueue(store, 1, now=t0)
    (item,) = (await claim(store, now=t0, limit=1)).claimed
    assert (await finalize(store, item, Succeeded(), now=t0)).applied
    ids["noop"] = noop
    return ids


async def rollup_rows(store: WorkStore) -> dict[RollupKey, int]:
    """Every level of ``history_rollup``, summed over shards (what every reader sees)."""

    async def body(tx: SqlTx) -> dict[RollupKey, int]:
        rows = await tx.fetchall(
            "SELECT level_us, bucket_us, family, outcome, org_id, binding_id, operation,"
            " SUM(executions) FROM history_rollup GROUP BY level_us, bucket_us, family,"
            " outcome, org_id, binding_id, operation")
        return {(int(lv), int(b), str(f), str(o), str(g), str(bi), str(p)): int(n)
                for lv, b, f, o, g, bi, p, n in rows}

    return await store.db.transact(body, name="test.rollup_rows", write=False)
