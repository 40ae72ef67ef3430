"""The operator side of ownership cutover: status documents and the audited steps.

Both ``integrationd cutover ...`` and the console's cutover pages call these, so
the two say the same thing. Each step is authorized (``cutover.step``: admin),
runs as one storage transaction that proves what it needs and audits itself,
and is refused with the exact blockers when the proof fails.

``rollback`` is two transactions: the first closes integrationd's claim and
reclaim admission (it stays closed when the second is blocked, so the drain
can proceed); the second is the atomic fence. ``re-cutover`` is ``begin`` (when
the legacy owner is active) followed by ``commit``.

The legacy owner is proven through the port
:class:`storage.cutover.values.LegacyClaimant`, with the adapter the
configuration declares for the family (``[[legacy_claimants]]``; the one kind
today is ``sql``, :class:`storage.cutover.legacy_sql.SqlLegacyClaimant`). Each
step first runs the adapter's statements once (rolled back), so a mistake in
them is one line naming its key. A family with no legacy claimant declared
cannot be committed (``legacy_unreported``): nothing proves its old owner drained.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from config.settings import Settings
from daemon.core.cutover import Blocker, Phase, blockers, next_step, next_verb
from daemon.services.operator_api import authorize
from storage.cutover.legacy_sql import SqlLegacyClaimant
from storage.cutover.snapshot import serves
from storage.cutover.values import (
    CutoverBlocked,
    CutoverReceipt,
    LegacyClaimant,
    LegacyClaimantError,
    OwnerGeneration,
    StepParams,
    StepResult,
)
from storage.port import RetriesExhausted
from storage.work_store import WorkStore

VERBS = ("status", "begin", "commit", "rollback", "re-cutover")


class UnknownProcess(Exception):
    """``--gone`` named a process no replica or legacy heartbeat row knows."""

    def __init__(self, process_id: str) -> None:
        super().__init__(f"no replica or legacy process {process_id!r} has ever reported"
                         " (see `integrationd cutover status`)")
        self.code = "unknown_process"


def legacy_claimant_for(settings: Settings, family: str) -> SqlLegacyClaimant | None:
    """The adapter the configuration declares for ``family`` (None: none is)."""
    for i, c in enumerate(settings.legacy_claimants):
        if c.family == family:
            return SqlLegacyClaimant(
                name=f"legacy_claimants[{i}]", family=c.family, lock_sql=c.lock_sql,
                processing_sql=c.processing_sql, uncovered_sql=c.uncovered_sql,
                processes_sql=c.processes_sql, open_claims_sql=c.open_claims_sql)
    return None


async def verified_claimant(store: WorkStore, settings: Settings,
                            family: str) -> LegacyClaimant | None:
    """The family's legacy claimant, its statements run once first (raises
    :class:`LegacyClaimantError` naming the key of one that fails)."""
    claimant = legacy_claimant_for(settings, family)
    if claimant is not None:
        await claimant.verify(store.db)
    return claimant


def generation_json(gen: OwnerGeneration | None) -> dict[str, Any] | None:
    if gen is None:
        return None
    return {"family": gen.family, "generation": gen.generation, "phase": gen.phase.value,
            "claimant": gen.claimant.value, "receipt_id": gen.receipt_id,
            "admission_closed_at_us": gen.admission_closed_at_us}


def receipt_json(r: CutoverReceipt) -> dict[str, Any]:
    doc = attrs.asdict(r)
    doc.pop("proof_json")
    return doc | {"proof": json.loads(r.proof_json)}


async def status(store: WorkStore, settings: Settings, family: str, now_us: int,
                 claim_tx_bound_us: int = 60_000_000) -> dict[str, Any]:
    """Owner generation, receipts, fences with projector progress, and what exactly
    blocks the next step (counted now; the step counts again itself)."""
    misconfigured: tuple[Blocker, ...] = ()
    try:
        claimant = await verified_claimant(store, settings, family)
    except LegacyClaimantError as exc:
        claimant, misconfigured = None, (Blocker(exc.code, str(exc)),)
    gen, snap = await store.cutover_snapshot(family, now_us, claimant)
    phase = gen.phase if gen is not None else None
    step = next_step(phase)
    snap = attrs.evolve(snap, claim_tx_bound_us=claim_tx_bound_us)
    found = misconfigured + blockers(step, snap)
    fences = await store.legacy_fence_progress(family)
    return {
        "family": family,
        "generation": generation_json(gen),
        "under_cutover": gen is not None,
        "next_step": step.value,
        "next_verb": next_verb(phase),
        "blockers": [{"code": b.code, "sentence": b.sentence} for b in found],
        "counts": attrs.asdict(snap),
        "receipts": [receipt_json(r) for r in await store.cutover_receipts(family)],
        "fences": [attrs.asdict(f) | {"confirmed": f.confirmed} for f in fences],
    }


async def step(store: WorkStore, settings: Settings, verb: str, params: StepParams,
               now_us: int, gone: tuple[str, ...] = ()) -> list[StepResult]:
    """Run one operator verb (not ``status``); raises ``CutoverBlocked`` with the
    blockers when a proof fails (earlier steps of the verb stay committed)."""
    operator = authorize(settings, params.actor, "cutover.step")
    params = attrs.evolve(params, role=operator.role)
    for process in gone:
        if not await store.process_mark_gone(process, params, now_us):
            raise UnknownProcess(process)
    try:
        return await _steps(store, settings, verb, params, now_us)
    except RetriesExhausted:
        # SQLite: another connection kept the one write lock past the statement
        # timeout. The database cannot say whose; the heartbeats can say who fell
        # silent (the MySQL family names open claims itself, storage/cutover/).
        if store.db.backend != "sqlite":
            raise
        raise CutoverBlocked(params.family, verb, (await write_lock_blocker(
            store, settings, params.family, now_us),)) from None


async def write_lock_blocker(store: WorkStore, settings: Settings, family: str,
                             now_us: int) -> Blocker:
    """``write_lock_held``: how long the step waited, and the replicas serving
    ``family`` whose heartbeats stopped (a process frozen inside a write
    transaction holds the whole SQLite database)."""
    silent_after_us = int(2 * settings.replica.heartbeat_interval * 1_000_000)
    silent = [f"{r.replica_id} (last heartbeat {(now_us - r.heartbeat_at_us) // 1_000_000} s"
              " ago)" for r in await store.replica_list(0)
              if r.state not in ("stopped", "gone") and serves(r.families, family)
              and now_us - r.heartbeat_at_us > silent_after_us]
    return Blocker("write_lock_held", (
        "another connection held the SQLite write lock for over"
        f" {settings.storage.statement_timeout:g} s (a process"
        " frozen inside a write transaction holds the whole database); "
        + ("claim-capable replicas that stopped heartbeating: " + ", ".join(silent)
           + "; stop the frozen one (SIGKILL releases the lock)" if silent else
           "no replica of the family stopped heartbeating: look for another process"
           " writing to the database file")))


async def _steps(store: WorkStore, settings: Settings, verb: str, params: StepParams,
                 now_us: int) -> list[StepResult]:
    done: list[StepResult] = []
    if verb == "begin":
        done.append(await store.cutover_begin(params, now_us))
    elif verb == "commit":
        done.append(await store.cutover_commit(
            params, now_us, await verified_claimant(store, settings, params.family)))
    elif verb == "rollback":
        gen = await store.owner_generation_get(params.family)
        if gen is None or gen.phase is not Phase.ROLLBACK_DRAINING:
            done.append(await store.cutover_rollback_begin(params, now_us))
        done.append(await store.cutover_rollback_commit(params, now_us))
    elif verb == "re-cutover":
        gen = await store.owner_generation_get(params.family)
        if gen is not None and gen.phase is Phase.LEGACY_ACTIVE:
            done.append(await store.cutover_begin(params, now_us))
        done.append(await store.cutover_commit(
            params, now_us, await verified_claimant(store, settings, params.family)))
    else:
        raise ValueError(f"not a cutover step: {verb}")
    return done

