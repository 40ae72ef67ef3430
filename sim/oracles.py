"""The oracles: what must hold all the time, and at the end.

Continuous (checked at the instant a request starts to leave a replica, through the
virtual network's ``on_exchange`` hook, against the database's committed rows read on an
observer connection that never waits):

* ``send_without_live_claim``: a request leaves a replica's handler for a provider or the
  Runtime while the database no longer holds the handler's claim (work id, ownership
  epoch, lease token, ``processing``);
* ``send_after_lease_expiry``: the claim is still the item's, but its lease ran out by the
  sender's own clock (another replica may take it at any moment); not a token refresh
  whose dispatch marker the claim committed: from the marker on, that call runs on its
  refresh lease alone (``refresh_calls_past_item_lease`` counts those);
* ``send_without_checkpoint``: a request carrying an idempotency key leaves with no
  committed dispatch checkpoint of this claim for that key;
* ``send_to_unpinned_record``: it goes to another record than the remote id its command
  pinned (``sends_after_link_moved`` counts sends whose link moved since the pin);
* ``lane_not_held``: the sender's item has a target lane (its remote record) that it does
  not hold while it runs;
* ``two_trusted_leases``: two replicas' worker pools each run a handler of one item on a
  lease they trust, at the same instant (a flight whose handler has returned only waits
  for its fenced finalization: it is not counted).

A send from a replica that was frozen while the request was on its way out is the one
interleaving no software can close (SIGSTOP between the check and ``write()``): it is
counted (``sends_after_thaw``), not judged; the end oracles judge what came of it.

At the end (``bench/torture.py``'s invariants over the simulators' journals, the Runtimes'
stores and the database): nothing lost or unfinished, no PATCH applied twice per
idempotency key, every Runtime receipt committed once, no quota window over its limit, no
refresh token presented twice, every webhook answered 200 with exactly one receipt and one
event; plus ``no_effect_without_proof`` (an effect attempt recorded as having had no effect
without the read-back evidence that proves it).
"""

from __future__ import annotations

import collections
import contextvars
import sqlite3
from typing import TYPE_CHECKING, Any

import attrs
import trio

from bench.torture import FINAL
from daemon.core.work import Fence, WorkItem
from daemon.services.clock import Clock
from daemon.services.operator_api import replay
from storage.port import StorageError

if TYPE_CHECKING:
    from daemon.services.assembly import Assembly
    from sim.net import VirtualSocket
    from sim.world import SimReplica, World
    from storage.work_store import WorkStore


@attrs.frozen
class Sender:
    replica: SimReplica
    fence: Fence
    clock: Clock
    family: str


CURRENT: contextvars.ContextVar[Sender | None] = contextvars.ContextVar("sim_sender",
                                                                       default=None)
BROKEN = ("duplicates", "lost", "receipts_not_once", "quota_violations", "double_refreshes",
          "grants_not_valid", "webhooks_lost", "webhook_receipts_not_once",
          "webhook_events_not_once", "webhooks_spooled_left", "inbound_not_succeeded",
          "no_effect_without_proof", "no_effect_but_applied", "finalized_twice",
          "executions_after_terminal", "diverged", "quota_slots_returned_after_send",
          "retired_but_proven_applied")
TERMINAL_OUTCOMES = ("succeeded", "skipped", "dead", "cancelled")


def watch_handlers(world: World, r: SimReplica, parts: Assembly) -> None:
    """Each family's handler runs with its claim in :data:`CURRENT` (the sim's own wrapper
    around the registered handler: the handler itself is production code, unchanged)."""
    families = parts.registry.families
    for name, family in list(families.items()):
        inner = family.handler

        def make(inner: Any = inner, name: str = name) -> Any:
            async def watched(ctx: Any) -> Any:
                token = CURRENT.set(Sender(r, ctx.fence, ctx.clock, name))
                try:
                    for hook in world.handler_hooks:
                        hook(name, ctx)
                    return await inner(ctx)
                finally:
                    CURRENT.reset(token)
            return watched

        families[name] = attrs.evolve(family, handler=make())


def dst_node(sock: VirtualSocket) -> str:
    return sock.peer.node if sock.peer is not None else "?"


def _refresh_marked(observer: sqlite3.Connection, fence: Any) -> bool:
    """Whether this claim holds a refresh lease whose dispatch marker is committed."""
    return observer.execute(
        "SELECT 1 FROM refresh_leases WHERE owner_work_id = ? AND owner_epoch = ?"
        " AND call_sent_at_us IS NOT NULL AND call_token = lease_token",
        (fence.work_id, fence.ownership_epoch)).fetchone() is not None


def _idempotency_key(data: bytes) -> str | None:
    head = data.split(b"\r\n\r\n", 1)[0]
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"idempotency-key":
            return value.strip().decode("latin-1")
    return None


def install(world: World) -> None:
    assert world.net is not None
    observer = sqlite3.connect(str(world.workdir / "sim.db"), isolation_level=None,
                               check_same_thread=False)
    world.observer = observer

    def on_exchange(sock: VirtualSocket, data: bytes) -> None:
        request = data.split(b"\r\n", 1)[0].decode("latin-1")[:80]
        world.ops["sends_all"] += 1
        world.trace("send", src=sock.node,
                    dst=sock.peer.node if sock.peer is not None else "?", request=request)
        if not sock.node.startswith("replica-"):
            return
        world.ops["sends"] += 1
        sender = CURRENT.get()
        if dst_node(sock) == "hubspot" and request.startswith("PATCH "):
            # The instant it left: the quota is judged here (a network delay past the
            # quota's jitter can still bunch arrivals at the provider).
            world.patch_sends.append((trio.current_time(), request.split(" ")[1]))
            if sender is not None:
                world.claims_sent.add((sender.fence.work_id, sender.fence.ownership_epoch))
        if sender is None:
            world.ops["sends_outside_handlers"] += 1
            return
        if sock.froze_at_send:
            world.ops["sends_after_thaw"] += 1
            return
        fence = sender.fence
        row = observer.execute(
            "SELECT state, ownership_epoch, lease_token, lease_until_us, target_lane,"
            " target_lane_hold FROM work_items WHERE work_id = ?", (fence.work_id,)).fetchone()
        dst = sock.peer.node if sock.peer is not None else "?"
        if row is None or row[0] != "processing" or int(row[1]) != fence.ownership_epoch \
                or row[2] != fence.lease_token:
            world.violation("send_without_live_claim", node=sock.node, to=dst,
                            request=request, work_id=fence.work_id,
                            epoch=fence.ownership_epoch,
                            row=None if row is None else [row[0], row[1]])
            return
        if row[4] is not None and row[5] != row[4]:
            # Its target lane (the remote record) must be held while it runs: nothing
            # else for that record may run beside it.
            world.violation("lane_not_held", node=sock.node, request=request,
                            work_id=fence.work_id, lane=row[4])
        key = _idempotency_key(data) if sender.family == "external_effect" else None
        if key is not None:
            checkpoint = observer.execute(
                "SELECT 1 FROM effect_attempts WHERE work_id = ? AND ownership_epoch = ?"
                " AND idempotency_key = ?",
                (fence.work_id, fence.ownership_epoch, key)).fetchone()
            if checkpoint is None:
                world.violation("send_without_checkpoint", node=sock.node, to=dst,
                                request=request, work_id=fence.work_id,
                                epoch=fence.ownership_epoch)
            pins = observer.execute(
                "SELECT c.remote_id, c.link_key, c.link_generation, a.attempt_id"
                " FROM effect_attempts a"
                " JOIN external_commands c ON c.command_id = a.command_id"
                " WHERE a.work_id = ? AND a.ownership_epoch = ? AND a.idempotency_key = ?",
                (fence.work_id, fence.ownership_epoch, key)).fetchone()
            target = request.split(" ")[1].split("?")[0] if " " in request else ""
            if pins is not None and pins[0] and not target.endswith(f"/{pins[0]}"):
                world.violation("send_to_unpinned_record", node=sock.node, request=request,
                                work_id=fence.work_id, pinned=pins[0])
            if pins is not None and pins[1]:
                link = observer.execute(
                    "SELECT generation FROM remote_links WHERE link_key = ?",
                    (pins[1],)).fetchone()
                if link is not None and int(link[0]) != int(pins[2] or 0):
                    world.ops["sends_after_link_moved"] += 1
                # The pins must still have been current when the checkpoint's transaction
                # began: a rebind that had committed before it must refuse the attempt
                # (one committed after it is the race no check closes: the request is
                # already checkpointed and in flight).
                began = world.checkpoint_began.get(str(pins[3]))
                moved = [g for order, g in world.link_moves.get(str(pins[1]), [])
                         if began is not None and order < began
                         and g > int(pins[2] or 0)]
                if moved:
                    world.violation("send_with_moved_pins", node=sock.node, request=request,
                                    work_id=fence.work_id, pinned_generation=pins[2],
                                    moved_to=max(moved))
        now_us = sender.clock.now_us()
        if row[3] is not None and int(row[3]) <= now_us and dst == "oauth" \
                and _refresh_marked(observer, fence):
            # A token refresh whose dispatch marker this claim committed (under its live
            # WorkItem fence) runs on its refresh lease alone from then on: a lease whose
            # call left is never taken over, and its answer is activated by the lease
            # token even if the claim has ended (storage/refresh_leases.py).
            world.ops["refresh_calls_past_item_lease"] += 1
        elif row[3] is not None and int(row[3]) <= now_us:
            world.violation("send_after_lease_expiry", node=sock.node, to=dst,
                            request=request, work_id=fence.work_id,
                            expired_by_us=now_us - int(row[3]))
        trusted = trusting_handlers(world, fence.work_id, trio.current_time())
        if len(trusted) > 1:
            world.violation("two_trusted_leases", work_id=fence.work_id, holders=trusted)

    world.net.on_exchange = on_exchange


def trusting_handlers(world: World, work_id: str, now: float) -> list[tuple[str, int]]:
    """The live replicas whose handler of ``work_id`` runs on a lease it still trusts
    (node, ownership epoch). A flight whose handler has returned is not one: what is left
    of it is its fenced finalization, which nothing lets act on a lease another replica
    took (seed 78 of a claims branch: replica-1's finalization of a retry committed, its
    answer was lost, and while its read-back was slow replica-2 claimed the retried item;
    replica-1 sent nothing more, and its read-back found the fence gone)."""
    trusted = []
    for other in world.replicas:
        pool = other.replica.pool if other.replica is not None else None
        if not other.alive or pool is None or other.node in world.frozen:
            continue
        flight = pool.flights.get(work_id)
        if flight is not None and not flight.handled and flight.trusted_until > now:
            trusted.append((other.node, flight.fence.ownership_epoch))
    return trusted


def on_committed(world: World, name: str) -> None:
    """``quota_returned_after_send``, at the instant a handler's transaction commits: a
    claim whose PATCH left (bytes reached the network) gives its quota slots back
    (``quota.return``: only for a request that provably never left). A new reservation
    (``quota.reserve``) starts the claim's next attempt."""
    sender = CURRENT.get()
    if sender is None:
        return
    claim = (sender.fence.work_id, sender.fence.ownership_epoch)
    if name == "quota.reserve":
        world.claims_sent.discard(claim)
    elif name == "quota.return" and claim in world.claims_sent:
        world.violation("quota_returned_after_send", work_id=claim[0], epoch=claim[1])


async def operator_replay(world: World, store: WorkStore, item: WorkItem) -> None:
    """``integrationd work replay``'s call, with a live replica's registry (its families'
    replay guards included), as the operator ``sim-admin``."""
    live = [r for r in world.replicas if r.alive and r.parts is not None
            and r.replica is not None]
    if not live:
        return
    r = live[0]
    assert r.parts is not None and r.replica is not None
    try:
        new = await replay(store, r.replica.settings, r.parts.registry, r.replica.clock,
                           work_id=item.work_id, actor="sim-admin",
                           reason="simulated operator replay")
        world.trace("operator_replayed", work_id=item.work_id, new=new.work_id)
        world.replayed.append(new.work_id)
    except (StorageError, Exception) as exc:  # refusals are answers, not failures
        world.trace("operator_replay_refused", work_id=item.work_id,
                    error=type(exc).__name__)


async def final(world: World, store: WorkStore, result: dict[str, Any],
                hubspot: Any, runtimes: list[Any]) -> None:
    """The end oracles beyond the torture run's.

    * ``no_effect_without_proof``: a command settled ``NO_EFFECT`` with an attempt whose
      evidence says its bytes may have been applied;
    * ``no_effect_but_applied``: ... or whose idempotency key the provider's own journal
      shows applied;
    * ``finalized_twice``: one WorkItem with more than one terminal execution;
    * ``executions_after_terminal``: an execution at a later epoch than the item's
      terminal one (a terminal row reopened);
    * ``diverged``: a Lead whose title the Runtime committed everywhere, but whose HubSpot
      contact ends with another value (an older intent landed after a newer one).
    """
    from storage.port import SqlTx

    applied_keys = {rec.idempotency_key for rec in hubspot.requests
                    if rec.method == "PATCH" and rec.applied and rec.idempotency_key}

    async def body(tx: SqlTx) -> tuple[list[Any], list[Any]]:
        no_effect = list(await tx.fetchall(
            "SELECT w.work_id, a.evidence, a.disposition, a.idempotency_key"
            " FROM work_items w"
            " JOIN effect_attempts a ON a.work_id = w.work_id"
            " WHERE w.terminal_outcome = 'no_effect'"))
        executions = list(await tx.fetchall(
            "SELECT work_id, ownership_epoch, outcome FROM work_executions"))
        return no_effect, executions

    async def ledger(tx: SqlTx) -> list[Any]:
        return list(await tx.fetchall(
            "SELECT granted_total - returned_total FROM quota_keys"))

    async def in_doubt(tx: SqlTx) -> tuple[set[str], int]:
        """Grants left ``refresh_in_doubt`` whose refresh lease shows the call dispatched
        (its marker committed, no answer activated): the fail-closed end the design gives a
        refresh whose answer was lost (docs/quota-and-credentials.md: re-authorize), and
        the open WorkItems of those bindings' commands."""
        doubtful = {str(r[0]) for r in await tx.fetchall(
            "SELECT g.binding_id FROM authorization_grants g JOIN refresh_leases l"
            " ON l.binding_id = g.binding_id AND l.generation = g.generation"
            " WHERE g.state != 'valid' AND g.reason_code = 'refresh_in_doubt'"
            " AND l.call_sent_at_us IS NOT NULL")}
        if not doubtful:
            return doubtful, 0
        marks = ",".join("?" for _ in doubtful)
        rows = await tx.fetchall(
            "SELECT COUNT(*) FROM work_items w JOIN external_commands c"
            " ON w.subject_kind = 'command' AND c.command_id = w.subject_id"
            f" WHERE c.binding_id IN ({marks})"
            " AND w.state IN ('pending', 'processing', 'retry')", sorted(doubtful))
        return doubtful, int(rows[0][0])

    doubtful, open_blocked = await store.db.transact(in_doubt, name="sim.in_doubt",
                                                     write=False)
    if doubtful:
        # Visibly blocked with a reason, not lost: the Runtimes of those bindings wait
        # for a re-authorization the world's operator does not perform.
        blocked = open_blocked
        for r, rt in enumerate(runtimes):
            if f"hubspot-{r}" in doubtful:
                stats = rt.store.stats()["intents_by_status"]
                blocked += sum(n for status, n in stats.items()
                               if status not in FINAL)
        result["blocked_refresh_in_doubt"] = blocked
        result["grants_in_doubt"] = sorted(doubtful)
        result["lost"] = max(0, int(result.get("lost") or 0) - blocked)
        result["grants_not_valid"] = max(0, int(result.get("grants_not_valid") or 0)
                                         - len(doubtful))
        world.trace("grants_in_doubt", bindings=sorted(doubtful), blocked=blocked)
    async def retired(tx: SqlTx) -> list[Any]:
        """Commands an operator retired that ended ``retired`` (no receipt) although an
        attempt of theirs is proven applied (accepted, or disposed applied): a retire must
        settle the exact success receipt then, never strand the intent."""
        marks = ",".join("?" for _ in world.retired)
        return list(await tx.fetchall(
            "SELECT c.command_id, a.outcome, a.disposition FROM external_commands c"
            " JOIN effect_attempts a ON a.command_id = c.command_id"
            f" WHERE c.command_id IN ({marks}) AND c.settlement = 'retired'"
            " AND (a.outcome = 'ACCEPTED'"
            " OR a.disposition IN ('proven_applied', 'operator_applied'))",
            sorted(world.retired)))

    # Only when the operator retired something: a transaction more would move every
    # other seed's schedule.
    stranded = (await store.db.transact(retired, name="sim.retired", write=False)
                if world.retired else [])
    result["operator_retired"] = dict(collections.Counter(world.retired.values()))
    result["retired_but_proven_applied"] = len({r[0] for r in stranded})
    result["retired_but_proven_applied_first"] = [list(r) for r in stranded[:3]]
    rows, executions = await store.db.transact(body, name="sim.final", write=False)
    # Every PATCH that reached the provider went out on a slot that never came back:
    # the ledger's kept slots (granted minus returned) cover the provider's arrivals.
    kept = sum(int(r[0]) for r in await store.db.transact(ledger, name="sim.ledger",
                                                          write=False))
    arrived = sum(1 for rec in hubspot.requests if rec.method == "PATCH")
    result["quota_slots_kept"] = kept
    result["quota_slots_returned_after_send"] = max(0, arrived - kept)
    # An attempt's own evidence, or (unknown at the time, whatever its evidence said)
    # its later disposition: a read-back that proved it absent, or an operator's, is
    # proof too, as daemon/core/no_effect.py reads it (seed 14: a rebind refused the
    # next checkpoint, and the history's proof was a proven_absent disposition).
    unproven_rows = [r for r in rows if r[1] not in ("not_sent", "not_applied")
                     and r[2] not in ("proven_absent", "operator_absent")]
    unproven = {r[0] for r in unproven_rows}
    applied = {r[0] for r in rows if r[3] in applied_keys}
    result["no_effect_items"] = len({r[0] for r in rows})
    result["no_effect_without_proof"] = len(unproven)
    result["no_effect_without_proof_first"] = [
        {"work_id": r[0], "evidence": r[1], "disposition": r[2]} for r in unproven_rows[:3]]
    result["no_effect_but_applied"] = len(applied)
    terminal: dict[str, list[int]] = {}
    latest: dict[str, int] = {}
    for work_id, epoch, outcome in executions:
        latest[work_id] = max(latest.get(work_id, 0), int(epoch))
        if outcome in TERMINAL_OUTCOMES:
            terminal.setdefault(work_id, []).append(int(epoch))
    twice = sorted(w for w, e in terminal.items() if len(e) > 1)
    result["finalized_twice"] = len(twice)
    result["finalized_twice_first"] = [
        {"work_id": w, "executions": sorted([int(e), o] for x, e, o in executions if x == w)}
        for w in twice[:2]]
    result["executions_after_terminal"] = sum(
        1 for w, e in terminal.items() if latest[w] > max(e))
    diverged = []
    if result.get("drained") and not result.get("lost"):
        for r, rt in enumerate(runtimes):
            for lead in rt.store.leads.values():
                # Runtime r's Lead k is linked to contact r * 100000 + k (bench.effects).
                if (r, lead.lead_id) in world.rebound | world.stopped:
                    # An operator moved its link (its last intent may have been refused,
                    # link_generation, and its contact is another one), or cancelled and
                    # retired one of its commands (settled no_effect or retired, as its
                    # history proves, and not applied): not judged.
                    continue
                contact = hubspot.contact(f"{r * 100000 + int(lead.lead_id.split('-')[1])}")
                title = None if contact is None else contact["properties"].get("jobtitle")
                if title != lead.title:
                    diverged.append((r, lead.lead_id, lead.title, title))
    result["diverged"] = len(diverged)
    result["diverged_first"] = diverged[:3]
    for name in BROKEN:
        if result.get(name):
            world.violation(name, count=result[name],
                            first=result.get(f"{name}_first", []))
