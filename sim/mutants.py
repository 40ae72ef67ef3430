"""Named mutants: small patches that reintroduce a real class of bug (``make
simulate-mutants``). Each is applied by replacing one named function or statement at run
time, here, never by a branch in production code; a mutant the simulation does not catch
is a hole in the simulation.

    python -m sim.mutants [--max-seeds 500] [--duration 30] [--only NAME,...]

One JSON line per mutant: ``mutant``, ``caught``, ``seeds_to_catch`` (the number of seeds
run until the first violation, or null), ``oracle`` (what caught it).
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import trio

Undo = Callable[[], None]


def _swap(owner: Any, name: str, value: Any) -> Undo:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    return lambda: setattr(owner, name, saved)


def _undo_all(undo: list[Undo]) -> None:
    for u in reversed(undo):
        u()


def finalize_without_fence() -> Undo:
    """The finalizing UPDATE matches the row by work id alone: no lease token, no epoch,
    no check that it is still processing."""
    from storage import work_claims

    async def update(tx: Any, key: tuple[Any, ...], fences: Sequence[Any], now_us: int) -> int:
        state, run_after, terminal, failure, summary, refund = key
        ids = [f.work_id for f in fences]
        return int(await tx.execute(
            "UPDATE work_items SET state = ?, lease_until_us = NULL,"
            " target_lane_hold = NULL, run_after_us = COALESCE(?, run_after_us),"
            " terminal_outcome = ?, failure_class = ?, operator_summary = ?,"
            " attempt = attempt - ?, row_version = row_version + 1, updated_at_us = ?"
            f" WHERE work_id IN ({','.join('?' for _ in ids)})",
            (state, run_after, terminal, failure, summary, refund, now_us, *ids)))

    async def applied(tx: Any, fences: Sequence[Any], state: str) -> set[str]:
        return {f.work_id for f in fences}

    undo = [_swap(work_claims, "_finalize_update", update),
            _swap(work_claims, "_applied", applied)]
    return lambda: _undo_all(undo)


_PREMINTED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "sim_preminted", default=None)


def send_before_checkpoint() -> Undo:
    """The dispatch checkpoint's transaction is started, and the handler told its attempt
    id, before it commits (the request leaves while the checkpoint may still be lost)."""
    from storage import effects
    from storage.work_store import WorkStore

    original = WorkStore.effect_checkpoint_many
    mint = effects.new_ulid  # type: ignore[attr-defined]

    def new_ulid(now_us: int) -> str:
        preminted = _PREMINTED.get()
        return preminted.pop(0) if preminted else mint(now_us)

    async def checkpoint_many(self: Any, requests: Sequence[Any],
                              now: Callable[[], int]) -> list[Any]:
        ids = [mint(now()) for _ in requests]

        async def commit_later() -> None:
            _PREMINTED.set(list(ids))
            await trio.sleep(0.05)
            with contextlib.suppress(Exception):  # the mutant's point: nobody waits
                await original(self, requests, now)

        trio.lowlevel.spawn_system_task(commit_later)
        await trio.lowlevel.checkpoint()
        return list(ids)

    undo = [_swap(WorkStore, "effect_checkpoint_many", checkpoint_many),
            _swap(effects, "new_ulid", new_ulid)]
    return lambda: _undo_all(undo)


def checkpoint_without_pin_checks() -> Undo:
    """The dispatch checkpoint no longer compares the request's pins (binding generation,
    link and its generation, remote record, Catalog revision) with the rows its own
    statement read (``daemon.core.effect_step.checkpoint_refusal``, called by
    ``storage.effects._dispatch_refusal``): a link rebound after the claim read its
    context no longer refuses the attempt; only the fence and the settlement guard it."""
    from storage import effects

    return _swap(effects, "checkpoint_refusal", lambda *args: None)


def stale_owner_refresh() -> Undo:
    """The token refresh's dispatch marker no longer takes the live WorkItem fence
    (``storage.refresh_leases.RefreshLeases.refresh_dispatch``'s ``fence_lock``): a
    claimant frozen past its WorkItem lease, whose refresh lease lives on, still marks
    and presents the refresh token after another replica reclaimed its item."""
    from storage import refresh_leases

    async def no_fence(tx: Any, fence: Any, now_us: int) -> None:
        return None

    return _swap(refresh_leases, "fence_lock", no_fence)


def quota_refund_after_timeout() -> Undo:
    """Quota slots come back after a timeout or a reset, when the request may have been
    applied (and counted by the provider)."""
    from daemon.core.effects import Phase
    from daemon.services import effect_quota

    original = effect_quota.give_back_unsent

    async def give_back(store: Any, reserved: list[Any], seen: Any, now_us: int) -> bool:
        if seen.phase is Phase.SENT and reserved:
            await effect_quota._give_back(
                store, [(r.key, r.slot_us, r.position_us) for r in reserved], now_us)
            return True
        return await original(store, reserved, seen, now_us)

    return _swap(effect_quota, "give_back_unsent", give_back)


def timeout_counted_as_no_effect() -> Undo:
    """A request that left but got no answer is classified as never sent."""
    from daemon.core import effects
    from daemon.services import effect_runner

    original = effects.classify

    def classify(contract: Any, seen: Any) -> Any:
        if seen.phase is effects.Phase.SENT:
            return effects.Classification(effects.OutcomeClass.RETRYABLE_PRE_DISPATCH,
                                          effects.Evidence.NOT_SENT, None, "connect")
        return original(contract, seen)

    return _swap(effect_runner, "classify", classify)


def receipt_200_before_durable() -> Undo:
    """Webhook ingress answers 200 as soon as the receipt is handed to the batcher, before
    it is durable (a failed insert is then lost)."""
    from daemon.services import assembly
    from storage.ingress.receipts import ReceiptInsert

    original = assembly.build_ingress

    def build(*args: Any, **kwargs: Any) -> Any:
        ingress = original(*args, **kwargs)
        if ingress is None:
            return None
        insert = ingress.app.insert

        async def early(receipt: Any, now_us: int) -> Any:
            async def later() -> None:
                with contextlib.suppress(Exception):  # the mutant's point: nobody waits
                    await insert(receipt, now_us)
            trio.lowlevel.spawn_system_task(later)
            await trio.lowlevel.checkpoint()
            return ReceiptInsert(stored=True, receipt_id=receipt.receipt_id)

        ingress.app.insert = early
        return ingress

    return _swap(assembly, "build_ingress", build)


def lane_head_released_while_running() -> Undo:
    """A claim no longer holds its target lane: the next item for the same remote record
    can run beside it."""
    from storage import work_claims

    undo = [
        _swap(work_claims, "_CLAIM_SET",
              work_claims._CLAIM_SET.replace("target_lane_hold = target_lane",
                                             "target_lane_hold = NULL")),
    ]
    return lambda: _undo_all(undo)


def terminal_row_reopened_by_replay() -> Undo:
    """A replay puts the terminal row itself back to ``pending`` instead of creating a new
    item with lineage."""
    from storage.work_rows import SELECT_WORK, from_row
    from storage.work_store import WorkStore

    async def work_replay(self: Any, params: Any, now_us: int) -> Any:
        async def body(tx: Any) -> Any:
            await tx.execute(
                "UPDATE work_items SET state = 'pending', terminal_outcome = NULL,"
                " lease_owner = NULL, lease_token = NULL, lease_until_us = NULL,"
                " run_after_us = ?, row_version = row_version + 1 WHERE work_id = ?",
                (now_us, params.work_id))
            rows = await tx.fetchall(f"{SELECT_WORK} WHERE work_id = ?", (params.work_id,))
            return from_row(rows[0])

        return await self.db.transact(body, name="work.replay")

    return _swap(WorkStore, "work_replay", work_replay)


def _creates_judged_alone() -> Undo:
    """Each create step of a subscription is judged by its own attempts only (issue 22's
    bug): the kin that makes one subscription's creates one effect names no item, so
    neither the step's claim nor its checkpoint's statement sees an earlier step's
    unresolved attempt, and no run counts a dead create in doubt."""
    from daemon.services import subscriptions
    from storage.effect_values import Kin

    def nobody(binding_id: str, name: str) -> Kin:
        return Kin(family="subscription_reconcile", subject_kind="subscription",
                   subject_id=name, lane=f"subscriptions:{binding_id}",
                   key_prefix="no-kin:")

    return _swap(subscriptions, "create_kin", nobody)


def subscription_recreated_in_flight() -> Undo:
    """A subscription step's claim answers ``Send()`` inside the in-flight window of an
    earlier attempt whose outcome is unknown (``decide_step``'s ``WaitWindow`` dropped), and
    the guard that makes one subscription's creates one effect is gone with it (each step
    judged alone, as before issue 22's fix; otherwise the checkpoint's statement refuses
    the create however the claim answers): a claimant that reclaims the step while the
    create may still land sends nothing (the statement still refuses a second attempt of
    the same step), the step dies, and the next run creates the subscription anew, inside
    the window."""
    from daemon.core.subscriptions import Send, WaitWindow, decide_step
    from daemon.services import subscriptions

    original = decide_step

    def send_inside_window(*args: Any, **kwargs: Any) -> Any:
        claim = original(*args, **kwargs)
        return Send() if isinstance(claim, WaitWindow) else claim

    undo = [_creates_judged_alone(), _swap(subscriptions, "decide_step", send_inside_window)]
    return lambda: _undo_all(undo)


def subscription_dead_create_forgotten() -> Undo:
    """Issue 22's bug alone: a create step that ended (dead, its attempts spent or its
    binding generation moved) with an unresolved attempt no longer counts as in flight;
    the next run's create step, a new WorkItem, sends at once."""
    return _creates_judged_alone()


def claim_while_admission_closed() -> Undo:
    """The claim statements no longer read the family's owner generation: a replica
    claims (and reclaims) a family whose admission a cutover ``begin`` or a ``rollback``
    closed, beside the legacy owner (seed 11's admission rule)."""
    from storage import work_claims

    admitted, candidate = work_claims.CLAIM_ADMITTED, work_claims._CANDIDATE_ADMITTED
    open_ = " AND ? IS NOT NULL"  # the family's argument, consumed
    undo = [_swap(work_claims, "CLAIM_ADMITTED", open_)]
    for name in ("_CLAIM_WHERE", "_READY_SQL", "_READY_ORG_SQL"):
        text = getattr(work_claims, name)
        undo.append(_swap(work_claims, name, text.replace(admitted, open_)
                          .replace(candidate, "")))
    return lambda: _undo_all(undo)


MUTANTS: dict[str, Callable[[], Undo]] = {
    "finalize_without_fence": finalize_without_fence,
    "send_before_checkpoint": send_before_checkpoint,
    "checkpoint_without_pin_checks": checkpoint_without_pin_checks,
    "stale_owner_refresh": stale_owner_refresh,
    "quota_refund_after_timeout": quota_refund_after_timeout,
    "timeout_counted_as_no_effect": timeout_counted_as_no_effect,
    "receipt_200_before_durable": receipt_200_before_durable,
    "lane_head_released_while_running": lane_head_released_while_running,
    "terminal_row_reopened_by_replay": terminal_row_reopened_by_replay,
    "subscription_recreated_in_flight": subscription_recreated_in_flight,
    "subscription_dead_create_forgotten": subscription_dead_create_forgotten,
    "rewrap_during_refresh": lambda: _operators_keys().mutant_rewrap_during_refresh(),
    "claim_while_admission_closed": claim_while_admission_closed,
}


def _operators_keys() -> Any:
    from sim import operators_keys  # the key-rotation operator's own mutant

    return operators_keys


# Named in issue 22, not built yet (each a hole, said so in every report):
NOT_BUILT: tuple[str, ...] = ()


@contextmanager
def applied(name: str | None) -> Iterator[None]:
    if name is None:
        yield
        return
    undo = MUTANTS[name]()
    try:
        yield
    finally:
        undo()


def main(argv: list[str] | None = None) -> int:
    from sim.__main__ import _reexec_with_fixed_hash_seed, run_many

    parser = argparse.ArgumentParser(description="apply each named mutant in turn")
    parser.add_argument("--max-seeds", type=int, default=500)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--only", default="", help="comma-separated mutant names")
    parser.add_argument("--jobs", type=int, default=1,
                        help="seeds run side by side (each in its own interpreter)")
    args = parser.parse_args(argv)
    _reexec_with_fixed_hash_seed("sim.mutants")
    names = [n for n in args.only.split(",") if n] or [*MUTANTS, *NOT_BUILT]
    for name in names:
        if name not in MUTANTS:
            print(json.dumps({"mutant": name, "caught": False, "seeds_to_catch": None,
                              "note": "not built yet"}), flush=True)
            continue
        caught_at = None
        oracle = None
        error = None
        # Each seed in a fresh interpreter with the mutant applied there: the seed that
        # caught it replays with ``python -m sim --seed S --mutant NAME``.
        runs = run_many(list(range(1, args.max_seeds + 1)), args.duration, name, args.jobs)
        try:
            for got in runs:
                seed = got["seed"]
                if got["violations"]:
                    caught_at = seed
                    oracle = sorted({v["oracle"] for v in got["violations"]})
                    # A crash of the code under test is visible, but say what it was.
                    error = next((v["error"].strip().splitlines()[-1]
                                  for v in got["violations"] if v["oracle"] == "exception"),
                                 None)
                    break
        finally:
            runs.close()
        line = {"mutant": name, "caught": caught_at is not None,
                "seeds_to_catch": caught_at, "oracle": oracle}
        if error is not None:
            line["error"] = error
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
