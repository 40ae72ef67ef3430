"""An operator retiring the RemoteLink of a Lead whose command is running, then binding
it again (issue 22 item 2, "link retire"; seed 000's RemoteLink lifecycle; issue 20's
"a retire that strands a proven-applied intent").

In the seeds that draw it (one in four, from its own generator: the other seeds'
schedules stay as they were), now and then the link of a Lead of Runtime r's HubSpot
binding whose command is running is retired through the storage call every retire of a
link makes (``RemoteLinks.link_retire``: ``storage.links.retire_link`` in its own
transaction, audited as ``sim-admin``; the inbound flow makes the same call inside a
handler's finalization when the remote record is destroyed; ``integrationd link`` has no
retire verb). Half the retires are *placed*: they commit when a chosen replica next
begins a dispatch checkpoint, after its claim read the command's context. A moment later
the operator binds the local record to its contact again
(``link_operations.bind_remote_record``, what ``integrationd link bind`` and the console
call: an adoption of a retired link, the next generation).

Commands pinned to the retired generation are refused at their next checkpoint
(``link_inactive``, then ``link_generation``) and settle ``NO_EFFECT`` on the proof that
nothing was sent; a command with an attempt in doubt is dead for an operator (a
read-back under moved pins is refused), so the operator settles it as the console does:
a disposition of each unresolved attempt from the provider's journal, then ``command
retire`` (and ``command repair`` when that left no receipt).

Oracles: the world's ``send_with_moved_pins`` (a retire is recorded as a move to the
next generation, so a PATCH whose checkpoint began after the retire committed is a
violation), and at the end every Runtime intent ends with exactly one true terminal
receipt (``lost``, ``receipts_not_once``), nothing settled ``NO_EFFECT`` without proof or
with the key applied (``no_effect_without_proof``, ``no_effect_but_applied``), and no
command the operator retired ends without the success receipt its proven-applied attempt
calls for (``retired_but_proven_applied``); plus ``link_retired_left_blocked``: a command
pinned to a retired generation still open at the end (neither a receipt nor an operator's
settlement). Leads whose link was retired are not judged by ``diverged``.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

import attrs
import trio

from daemon.services.link_operations import bind_remote_record
from sim.operators_reconnect import dispose_from_journal

if TYPE_CHECKING:
    from sim.world import SimReplica, World
    from storage.work_store import WorkStore


@attrs.define(eq=False)
class LinkRetires:
    world: World
    rng: random.Random
    store: WorkStore | None = None
    hubspot: Any = None
    retired: dict[str, tuple[str, str, str, str, str]] = attrs.field(factory=dict)
    n: int = 0

    def configure(self) -> None:
        return None

    def start(self, store: WorkStore, **parts: Any) -> None:
        self.store = store
        self.hubspot = parts["hubspot"]

    def _settings(self) -> Any:
        live = [x for x in self.world.replicas if x.alive and x.replica is not None]
        return live[0].replica.settings if live else None  # type: ignore[union-attr]

    async def retire_one(self, on: SimReplica | None, place: str) -> None:
        world = self.world
        assert self.store is not None and world.op_clock is not None
        sql = ("SELECT l.link_key, l.generation, c.binding_id, l.local_object, l.local_id,"
               " l.remote_object, l.remote_id FROM work_items w"
               " JOIN external_commands c ON c.command_id = w.subject_id"
               " JOIN remote_links l ON l.link_key = c.link_key"
               " WHERE w.state = 'processing' AND w.subject_kind = 'command'"
               " AND c.settlement = 'open' AND l.state = 'active'"
               " AND c.binding_id LIKE 'hubspot-%'")
        params: tuple[Any, ...] = ()
        if on is not None and on.replica is not None:
            sql += " AND w.lease_owner = ?"
            params = (on.replica.replica_id,)
        rows = world.observer.execute(sql + " ORDER BY w.work_id", params).fetchall()
        if not rows:
            return
        key, gen, binding, local_object, local_id, remote_object, remote_id = \
            rows[self.rng.randrange(len(rows))]
        try:
            await self.store.link_retire(str(key), expected_generation=int(gen),
                                         actor="sim-admin", role="admin",
                                         reason="simulated link retire",
                                         now_us=world.op_clock.now_us())
        except Exception as exc:  # moved meanwhile, a storage error: an answer
            world.trace("operator_link_retire_refused", local_id=local_id,
                        error=type(exc).__name__)
            return
        # Recorded after it returned: it committed before any transaction that begins
        # later. A retire is a move away from the pinned generation (the next adoption
        # takes generation + 1).
        world.link_moves.setdefault(str(key), []).append((world.next_seq(), int(gen) + 1))
        world.stopped.add((int(str(binding).rsplit("-", 1)[1]), str(local_id)))
        self.retired[str(key)] = (str(binding), str(local_object), str(local_id),
                                  str(remote_object), str(remote_id))
        world.ops["operator_link_retires"] += 1
        world.trace("operator_link_retired", local_id=local_id, generation=int(gen),
                    at=place)

    async def rebind(self, key: str) -> bool:
        """``integrationd link bind`` of the retired link's local record to its contact."""
        world = self.world
        settings = self._settings()
        if settings is None or world.op_clock is None or self.store is None:
            return False
        binding, local_object, local_id, remote_object, remote_id = self.retired[key]
        try:
            await bind_remote_record(self.store, settings, world.op_clock, actor="sim-admin",
                                     binding_id=binding, local_object=local_object,
                                     local_id=local_id, remote_object=remote_object,
                                     remote_id=remote_id, expected_generation=None,
                                     reason="simulated bind after retire")
        except Exception as exc:  # a refusal or a storage error: later
            world.trace("operator_link_rebind_refused", local_id=local_id,
                        error=type(exc).__name__)
            return False
        del self.retired[key]
        world.ops["operator_link_readopted"] += 1
        world.trace("operator_link_readopted", local_id=local_id)
        return True

    async def chaos(self) -> None:
        rng, world = self.rng, self.world
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.resolver)
            while True:
                await trio.sleep(rng.uniform(3.0, 8.0))
                for key in sorted(self.retired):
                    if rng.random() < 0.5:
                        await self.rebind(key)
                live = [x for x in world.replicas if x.alive and x.db is not None
                        and x.node not in world.frozen and x.db.interleave_at is None]
                if rng.random() < 0.5 and live:
                    x = live[rng.randrange(len(live))]
                    assert x.db is not None

                    async def during(name: str, x: SimReplica = x) -> None:
                        await self.retire_one(x, f"{x.node}:{name}")

                    x.db.on_interleave = during
                    x.db.interleave_at = "effect.checkpoint"
                else:
                    await self.retire_one(None, "")

    async def settle(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.resolver)
            for _ in range(30):
                for key in sorted(self.retired):
                    await self.rebind(key)
                if not self.retired:
                    break
                await trio.sleep(1.0)

    async def resolver(self) -> None:
        """Commands dead on a retired (or re-adopted) link with an attempt in doubt: the
        operator disposes of each attempt from the provider's journal, then retires (and
        repairs when no receipt was settled), as the console does."""
        from sim.world import operator_retire

        world = self.world
        assert self.store is not None
        while True:
            await trio.sleep(2.0)
            settings = self._settings()
            if settings is None or world.op_clock is None:
                continue
            rows = world.observer.execute(
                "SELECT c.command_id, c.operation, c.binding_id FROM work_items w"
                " JOIN external_commands c ON c.command_id = w.subject_id"
                " JOIN remote_links l ON l.link_key = c.link_key"
                " WHERE w.family = 'external_effect' AND w.subject_kind = 'command'"
                " AND w.state = 'dead' AND c.settlement = 'open'"
                " AND (l.state != 'active' OR l.generation != c.link_generation)"
                " AND NOT EXISTS (SELECT 1 FROM work_items x WHERE x.subject_id ="
                "   c.command_id AND x.subject_kind = 'command'"
                "   AND x.state IN ('pending', 'processing', 'retry'))"
                " ORDER BY c.command_id").fetchall()
            for command_id, operation, binding_id in rows:
                if not await dispose_from_journal(world, self.store, self.hubspot, settings,
                                                  str(command_id), str(operation),
                                                  str(binding_id)):
                    continue
                await operator_retire(world, self.store, settings, str(command_id))

    async def final(self, result: dict[str, Any]) -> None:
        (blocked,) = self.world.observer.execute(
            "SELECT COUNT(*) FROM external_commands c JOIN remote_links l"
            " ON l.link_key = c.link_key WHERE c.settlement = 'open'"
            " AND (l.state != 'active' OR l.generation != c.link_generation)").fetchone()
        result["link_retires"] = self.world.ops["operator_link_retires"]
        result["link_retired_left_blocked"] = int(blocked)
        if blocked:
            self.world.violation("link_retired_left_blocked", count=int(blocked))


def draw(world: World) -> LinkRetires | None:
    rng = random.Random(f"link-retire:{world.options.seed}")
    if not world.options.faults or rng.random() >= 0.25:
        return None
    return LinkRetires(world, rng)
