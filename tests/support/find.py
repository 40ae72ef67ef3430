"""Rows for the "find anything" tests: commands with attempts of several outcomes."""

from __future__ import annotations

import json

import attrs

from daemon.core.exchange_excerpt import ExchangeExcerpt, excerpt_of
from daemon.core.work import WorkItem
from storage.effect_values import Settlement
from storage.effects import mark_receipt, record_outcome, settle
from storage.port import SqlTx
from storage.work_store import WorkStore
from tests.support.commands import accept_pinned, attempt, draft
from tests.support.work import SEC, claim

# (lead, outcome, HTTP status): one command and one attempt each, dispatched a second apart.
CALLS = (
    ("lead-a", "ACCEPTED", 200),
    ("lead-b", "REPLAY_SAFE_RETRY", 429),
    ("lead-c", "REJECTED", 400),
    ("lead-d", "REPLAY_SAFE_RETRY", 429),
    ("lead-e", "OUTCOME_UNKNOWN", None),
    ("lead-f", "REPLAY_SAFE_RETRY", 429),
)


# What a failed call of the seed sent and got back, before redaction: the stored
# excerpt must hold none of SECRETS.
SECRETS = ("ada@example.com", "tok-SECRET-77")


def failed_exchange(status: int | None) -> ExchangeExcerpt:
    return excerpt_of(
        json.dumps({"properties": {"jobtitle": "CTO", "email": SECRETS[0]}}).encode(),
        [("Content-Type", "application/json"), ("Authorization", f"Bearer {SECRETS[1]}"),
         ("X-RateLimit-Remaining", "0")],
        json.dumps({"status": "error", "message": f"answered {status}",
                    "token": SECRETS[1]}).encode())


@attrs.frozen
class Seeded:
    command_id: str
    attempt_id: str
    work_id: str
    lead: str
    outcome: str
    status: int | None


async def seed_calls(store: WorkStore, t0: int) -> list[Seeded]:
    """One command per row of :data:`CALLS`, each claimed, dispatched and answered."""
    seeded = []
    for i, (lead, outcome, status) in enumerate(CALLS):
        now = t0 + i * SEC
        result = await accept_pinned(store, draft(f"int-{lead}", lead=lead,
                                                  outbox=f"outbox-{lead}"), now)
        assert result.command_id is not None
        (item,) = (await claim(store, family="external_effect", now=now, limit=1)).claimed
        seeded.append(await _dispatch(store, item, result.command_id, lead, outcome, status,
                                      now))
    return seeded


async def _dispatch(store: WorkStore, item: WorkItem, command_id: str, lead: str,
                    outcome: str, status: int | None, now: int) -> Seeded:
    assert item.fence is not None
    attempt_id = await store.effect_checkpoint(item.fence, attempt(command_id, lead), lambda: now)
    await store.work_fenced(item.fence, lambda: now, lambda tx: record_outcome(
        tx, attempt_id, outcome=outcome, evidence="maybe_applied", response_status=status,
        provider_evidence={}, failure_class="", gave_up_at_us=now, now_us=now,
        exchange=None if status == 200 else failed_exchange(status).to_json()),
        name="test.record")
    return Seeded(command_id, attempt_id, item.work_id, lead, outcome, status)


async def settle_command(store: WorkStore, seeded: Seeded, now: int) -> None:
    """Settle ``seeded``'s command as succeeded (its Runtime receipt becomes pending)."""
    async def write(tx: SqlTx) -> None:
        await settle(tx, command_id=seeded.command_id, settlement=Settlement.SUCCEEDED,
                     result_format_version=1, remote_id=f"r-{seeded.lead}",
                     canonical_result="{}", result_digest="sha256:x", receipt_max_attempts=5,
                     now_us=now)

    await store.db.transact(write, name="test.settle")


async def confirm_receipt(store: WorkStore, seeded: Seeded, now: int) -> None:
    """The Runtime confirmed ``seeded``'s receipt at ``now``."""
    await store.db.transact(lambda tx: mark_receipt(tx, seeded.command_id, confirmed=True,
                                                    error=None, now_us=now),
                            name="test.confirm")


async def seed_receipts(store: WorkStore, t0: int) -> list[Seeded]:
    """:func:`seed_calls` at ``t0`` (six commands accepted in ``t0 + 0..5 s``), and two
    of them answered and confirmed: the first answered after 10 s and confirmed after
    70 s (after a refused delivery), the third answered after 2 s and confirmed after
    3 s (then confirmed again: a repeat)."""
    seeded = await seed_calls(store, t0)
    await settle_command(store, seeded[0], t0 + 10 * SEC)
    await settle_command(store, seeded[2], t0 + 4 * SEC)
    await store.db.transact(lambda tx: mark_receipt(tx, seeded[0].command_id, confirmed=False,
                                                    error="http_503:", now_us=t0 + 30 * SEC),
                            name="test.refused")
    await confirm_receipt(store, seeded[0], t0 + 70 * SEC)
    await confirm_receipt(store, seeded[2], t0 + 5 * SEC)
    await confirm_receipt(store, seeded[2], t0 + 9 * SEC)  # a repeat: already confirmed
    return seeded
