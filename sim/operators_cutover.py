"""An operator moving the ``noop`` family between a legacy claimant and integrationd,
and back, while both run (issue 22 item 2: cutover begin and rollback; seed 11).

In the seeds that draw it (one in four, from its own generator: the other seeds'
schedules stay as they were), the family's work comes from a legacy owner's event
table, as it would in a migration: the world's noop traffic adds events to the
sandbox's reference legacy claimant (``sandbox/legacy/store.py``: its own table, its
own claim statement, a ``LegacyOutcomeReceipt`` with every terminal transition of a
fenced item), and the bridge gives each event a WorkItem (``materialize``, by the
event's dedupe key) whenever the legacy owner's admission is closed. The replicas
see the legacy owner as production sees any: through the ``[[legacy_claimants]]``
SQL adapter of their configuration (``config/example.toml``'s entry).

The operator acts through the call ``integrationd cutover begin|commit|rollback``
and the console make (:func:`daemon.services.cutover.step`, as ``sim-admin``, with
a claim-transaction bound drawn per seed): at the start ``begin`` then ``commit``
(integrationd owns the family), then round and round: ``rollback`` (integrationd's
claim admission closes; once drained and past the bound, every unstarted item is
fenced ``awaiting_legacy_outcome`` for the legacy owner), the legacy worker drains
(its receipts; the replicas' projector reconciles the fenced items), ``begin`` and
``commit`` again (the re-cutover rules). A blocked step is an answer: the operator
runs it again later. In the settle it finishes the family back with integrationd.

Oracles:

* ``cutover_claimed_by_both`` (at the instant): a replica's noop handler starts on a
  legacy event's WorkItem that the legacy owner has claimed or finished, or the
  legacy worker claims an event whose WorkItem a replica holds or finished;
* ``cutover_claim_while_closed``: a replica's claim transaction that took a noop item
  began after a ``begin`` or ``rollback`` closed integrationd's admission and before
  the next ``commit`` began (ordered by the world's commit sequence), or a legacy claim
  ran between a ``begin`` and the next ``rollback`` (the legacy owner's admission);
* at the end (``cutover_executed_twice``, ``cutover_lost``, ``cutover_unreconciled``):
  every event was executed by exactly one owner (the legacy worker finished it, or a
  replica journaled its WorkItem ``succeeded``, never both, never twice), and every
  item fenced for the legacy owner was reconciled with the legacy outcome (none left
  awaiting or ``legacy_outcome_unknown``).
"""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING, Any

import attrs
import trio

from config.load import load_settings
from daemon.core.cutover import Phase
from daemon.services import cutover as service
from daemon.services.families import known_family_names
from sandbox.legacy import store as legacy
from sim import oracles
from storage.cutover.values import CutoverBlocked, StepParams
from storage.port import StorageError

if TYPE_CHECKING:
    from config.settings import Settings
    from sim.world import World
    from storage.work_store import WorkStore

FAMILY = "noop"
WORKER = "legacy-sim"
LEGACY_LEASE_US = 600_000_000


@attrs.define(eq=False)
class Cutovers:
    world: World
    rng: random.Random
    bound_us: int = 0
    store: WorkStore | None = None
    settings: Settings | None = None
    ready: trio.Event = attrs.field(factory=trio.Event)
    done: trio.Event = attrs.field(factory=trio.Event)  # settled back with integrationd
    lock: trio.Lock = attrs.field(factory=trio.Lock)
    # Commit-order intervals [start, end) in which each owner may not claim.
    closed_ours: list[list[int | None]] = attrs.field(factory=list)
    closed_legacy: list[list[int | None]] = attrs.field(factory=list)
    events: int = 0
    steps: int = 0

    def configure(self) -> None:
        """The replicas' configuration declares the legacy claimant of the family."""
        entry = "\n[[legacy_claimants]]\n" + f'family = "{FAMILY}"\nadapter = "sql"\n' + "".join(
            f"{key} = {json.dumps(sql)}\n" for key, sql in legacy.CLAIMANT_SQL.items())
        for cfg in self.world.configs:
            with cfg.open("a") as out:
                out.write(entry)

    def start(self, store: WorkStore, **parts: Any) -> None:
        self.store = store
        self.settings = load_settings(str(self.world.configs[0]),
                                      known_families=known_family_names())
        self.world.commit_hooks.append(self.on_commit)
        self.world.handler_hooks.append(self.on_handler)
        self.world.noop_source = self.produce

    # ------------------------------------------------------------ oracles

    @staticmethod
    def _inside(intervals: list[list[int | None]], seq: int) -> bool:
        return any(start is not None and start < seq and (end is None or seq < end)
                   for start, end in intervals)

    def on_commit(self, name: str, began: int, result: Any) -> None:
        if name != "work.claim":
            return
        ours = [i for i in getattr(result, "claimed", ()) if i.family == FAMILY
                and i.subject_kind == "legacy_event"]
        if ours and self._inside(self.closed_ours, began):
            self.world.violation("cutover_claim_while_closed", owner="integrationd",
                                 work_ids=[i.work_id for i in ours][:5], began=began)

    def on_handler(self, family: str, ctx: Any) -> None:
        item = ctx.item
        if family != FAMILY or item.subject_kind != "legacy_event":
            return
        sender = oracles.CURRENT.get()
        row = self.world.observer.execute(
            "SELECT state, claimed_by FROM legacy_events WHERE event_id = ?",
            (item.subject_id,)).fetchone()
        if row is not None and str(row[0]) != "pending":
            self.world.violation("cutover_claimed_by_both", work_id=item.work_id,
                                 event_id=item.subject_id, legacy_state=str(row[0]),
                                 node=sender.replica.node if sender is not None else "?")

    # ------------------------------------------------------------ the legacy owner

    async def produce(self, n: int) -> None:
        """The legacy owner's producer: three events; the bridge gives them WorkItems
        while the legacy owner's admission is closed."""
        if not self.ready.is_set():  # the family is still being cut over at the start
            return
        assert self.store is not None and self.world.op_clock is not None
        now = self.world.op_clock.now_us()
        await legacy.add_events(self.store, FAMILY, ["{}"] * 3, now)
        self.events += 3
        self.world.ops["cutover_events"] += 3
        async with self.lock:
            await self._materialize()

    async def _materialize(self) -> None:
        """Under the lock: no step moves the phase meanwhile."""
        assert self.store is not None and self.world.op_clock is not None
        gen = await self.store.owner_generation_get(FAMILY)
        if gen is None or gen.phase is Phase.LEGACY_ACTIVE:
            return
        made = await legacy.materialize(self.store, FAMILY, "org-sim",
                                        self.world.op_clock.now_us())
        self.world.ops["cutover_materialized"] += made

    async def legacy_worker(self) -> None:
        """The legacy claim loop (``sandbox.legacy.worker``'s steps), in node ``legacy``,
        under a supervisor: a storage error ends the process (as it ends
        ``sandbox.legacy.worker``), and its supervisor starts it again a little later. The
        new process first finishes what the old one held (the same worker id: its lease
        would outlive the run). A replica frozen inside a transaction holds SQLite's write
        lock for the whole freeze, and every writer meets ``RetriesExhausted`` meanwhile:
        the replicas log it and go on, and so must the legacy owner (seed 17)."""
        restarted = False
        while True:
            try:
                if restarted:
                    await self._finish_held()
                await self._legacy_claim_loop()
            except StorageError as exc:
                self.world.ops["cutover_legacy_restarts"] += 1
                self.world.trace("legacy_worker_restarted", error=type(exc).__name__)
                restarted = True
                await trio.sleep(self.rng.uniform(1.0, 3.0))

    async def _legacy_claim_loop(self) -> None:
        assert self.store is not None and self.world.op_clock is not None
        world, clock = self.world, self.world.op_clock
        while True:
            await trio.sleep(self.rng.uniform(0.2, 1.0))
            before = world.next_seq()
            event = await legacy.claim_one(self.store, FAMILY, WORKER, LEGACY_LEASE_US,
                                           clock.now_us())
            after = world.next_seq()
            if event is None:
                continue
            if any(start is not None and start < before and (end is None or after < end)
                   for start, end in self.closed_legacy):
                world.violation("cutover_claim_while_closed", owner="legacy",
                                event_id=event.event_id)
            row = world.observer.execute(
                "SELECT work_id, state FROM work_items WHERE dedupe_key = ?",
                (event.work_key,)).fetchone()
            if row is not None and str(row[1]) not in ("awaiting_legacy_outcome",):
                world.violation("cutover_claimed_by_both", event_id=event.event_id,
                                work_id=str(row[0]), work_state=str(row[1]), node="legacy")
            world.trace("legacy_claimed", event_id=event.event_id,
                        fenced=row is not None)
            await trio.sleep(self.rng.uniform(0.0, 2.0))  # "executes"
            done = await legacy.finish(self.store, event, WORKER, "succeeded",
                                       clock.now_us())
            world.ops["cutover_legacy_executed"] += 1
            world.trace("legacy_finished", event_id=event.event_id, ok=done)

    # ------------------------------------------------------------ the operator

    async def step(self, verb: str, gone: tuple[str, ...] = ()) -> bool:
        """``integrationd cutover VERB noop --actor sim-admin`` (True: done)."""
        assert self.store is not None and self.settings is not None
        world, clock = self.world, self.world.op_clock
        assert clock is not None
        params = StepParams(family=FAMILY, actor="sim-admin", reason="simulated cutover",
                            claim_tx_bound_us=self.bound_us)
        async with self.lock:
            if verb in ("commit", "re-cutover"):
                await self._materialize()
            # Admission may reopen from here on (ordered before the step's commits).
            opening = legacy_opening = world.next_seq()
            try:
                await service.step(self.store, self.settings, verb, params, clock.now_us(),
                                   gone=gone)
                ok, why = True, ""
            except CutoverBlocked as exc:
                ok, why = False, ",".join(b.code for b in exc.blockers)
            except Exception as exc:  # an illegal step or a storage error is an answer
                ok, why = False, type(exc).__name__
            gen = await self.store.owner_generation_get(FAMILY)
            phase = None if gen is None else gen.phase
            after = world.next_seq()
            # Admission closed by what committed (recorded after: conservative).
            if phase in (Phase.CUTOVER_DRAINING, Phase.ROLLBACK_DRAINING,
                         Phase.LEGACY_ACTIVE) and not self._open_end(self.closed_ours):
                self.closed_ours.append([after, None])
            if phase is Phase.INTEGRATIOND_ACTIVE and self._open_end(self.closed_ours):
                self.closed_ours[-1][1] = opening
            if phase in (Phase.CUTOVER_DRAINING, Phase.INTEGRATIOND_ACTIVE,
                         Phase.ROLLBACK_DRAINING) and not self._open_end(self.closed_legacy):
                self.closed_legacy.append([after, None])
            if phase is Phase.LEGACY_ACTIVE and self._open_end(self.closed_legacy):
                self.closed_legacy[-1][1] = legacy_opening
        self.steps += 1
        world.ops["operator_cutover_steps"] += 1
        world.ops[f"operator_cutover_{verb}_{'done' if ok else 'blocked'}"] += 1
        world.trace("operator_cutover", verb=verb, done=ok, blocked=why,
                    phase=None if phase is None else phase.value,
                    generation=None if gen is None else gen.generation)
        return ok

    @staticmethod
    def _open_end(intervals: list[list[int | None]]) -> bool:
        return bool(intervals) and intervals[-1][1] is None

    async def _gone(self) -> tuple[str, ...]:
        """The replicas ``replicas_live`` would name: the operator proves them gone
        (``--gone ID``) although they run on; their claim statements must refuse while
        admission is closed (what a replica only frozen relies on, docs/operations.md)."""
        assert self.store is not None
        return tuple(r.replica_id for r in await self.store.replica_list(0)
                     if r.state not in ("stopped", "gone"))

    async def _legacy_drained(self) -> bool:
        """``cutover status``: nothing fenced still awaits the legacy owner (after
        ``begin`` its claim statement refuses, so a fenced item left would wait for good)."""
        assert self.store is not None and self.settings is not None
        assert self.world.op_clock is not None
        doc = await service.status(self.store, self.settings, FAMILY,
                                   self.world.op_clock.now_us())
        counts = doc["counts"]
        return not (counts["awaiting"] or counts["unknown"] or counts["unprojected_receipts"])

    async def next_step(self, home: bool = False) -> None:
        """The next step round the cycle (``home``: towards integrationd only)."""
        assert self.store is not None
        gen = await self.store.owner_generation_get(FAMILY)
        phase = None if gen is None else gen.phase
        if phase is Phase.INTEGRATIOND_ACTIVE and not home:
            await self.step("rollback", gone=await self._gone())
        elif phase is Phase.ROLLBACK_DRAINING:
            # Blocked by expired leases (reclaim is stopped) it may stay blocked: a commit
            # reopens admission, as the blocker's sentence says.
            if home or self.rng.random() < 0.3:
                await self.step("commit")
            else:
                await self.step("rollback", gone=await self._gone())
        elif phase is Phase.CUTOVER_DRAINING:
            await self.step("commit")
        elif phase is None or await self._legacy_drained():
            await self.step("begin")

    async def _to_integrationd(self) -> None:
        """Until the family is integrationd's: the steps left, again while blocked."""
        assert self.store is not None
        while True:
            gen = await self.store.owner_generation_get(FAMILY)
            if gen is not None and gen.phase is Phase.INTEGRATIOND_ACTIVE:
                return
            await self.next_step(home=True)
            await trio.sleep(1.0)

    async def chaos(self) -> None:
        assert self.store is not None
        await legacy.install(self.store)
        await self._to_integrationd()
        self.ready.set()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.legacy_worker)
            while True:
                await trio.sleep(self.rng.uniform(2.0, 6.0))
                await self.next_step()

    async def _finish_held(self) -> None:
        """The legacy worker, cut off at the chaos's end (its task cancelled while it
        held an event), finishes what it holds when it runs again, as
        ``sandbox.legacy.worker`` does on SIGTERM (its lease would outlive the run)."""
        assert self.store is not None and self.world.op_clock is not None
        for event in await legacy.events(self.store, FAMILY):
            if event.state == "processing":
                done = await legacy.finish(self.store, event, WORKER, "succeeded",
                                           self.world.op_clock.now_us())
                self.world.ops["cutover_legacy_executed"] += 1
                self.world.trace("legacy_finished", event_id=event.event_id, ok=done,
                                 held=True)

    async def settled(self, limit_s: float) -> bool:
        """Waits (at most ``limit_s``) until the settle brought the family back to
        integrationd with every event covered (the legacy owner drains at its own pace,
        after the replicas may have looked settled). False: it never moved."""
        if not self.ready.is_set():
            return False
        with trio.move_on_after(limit_s):
            await self.done.wait()
        return True

    async def settle(self) -> None:
        if self.ready.is_set():
            await self._finish_held()
            async with self.lock:  # before the settle can find nothing open
                await self._materialize()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.legacy_worker)
            if self.ready.is_set():
                await self._to_integrationd()
                # The bridge runs on: events the traffic added as the chaos ended, before
                # it could cover them (its task cancelled), get their WorkItems.
                async with self.lock:
                    await self._materialize()
                self.world.trace("operator_cutover_settled")
                self.done.set()

    # ------------------------------------------------------------ the end

    async def final(self, result: dict[str, Any]) -> None:
        observer = self.world.observer
        twice = lost = unreconciled = 0
        first: list[str] = []
        rows = [] if not self.ready.is_set() else observer.execute(
            "SELECT e.event_id, e.state, w.work_id, w.state,"
            " (SELECT COUNT(*) FROM work_executions x WHERE x.work_id = w.work_id"
            "  AND x.outcome = 'succeeded')"
            " FROM legacy_events e LEFT JOIN work_items w ON w.dedupe_key = e.work_key"
            " WHERE e.family = ? ORDER BY e.event_id", (FAMILY,)).fetchall()
        for event_id, event_state, work_id, work_state, ours in rows:
            by_legacy = str(event_state) in ("succeeded", "dead")
            runs = int(ours or 0) + (1 if by_legacy else 0)
            if runs > 1:
                twice += 1
                first.append(f"twice:{event_id}:{work_id}")
            elif runs == 0:
                lost += 1
                first.append(f"lost:{event_id}:{event_state}:{work_state}")
            if work_state in ("awaiting_legacy_outcome", "legacy_outcome_unknown") or (
                    by_legacy and work_id is not None
                    and work_state != "reconciled_legacy_terminal"):
                unreconciled += 1
                first.append(f"unreconciled:{event_id}:{work_state}")
        result["cutover_events"] = len(rows)
        result["cutover_steps"] = self.steps
        result["cutover_executed_twice"] = twice
        result["cutover_lost"] = lost
        result["cutover_unreconciled"] = unreconciled
        # The legacy worker's restarts after a storage error (a frozen replica's lock).
        result["cutover_legacy_restarts"] = self.world.ops["cutover_legacy_restarts"]
        for name in ("cutover_executed_twice", "cutover_lost", "cutover_unreconciled"):
            if result[name]:
                self.world.violation(name, count=result[name], first=first[:5])


def draw(world: World) -> Cutovers | None:
    rng = random.Random(f"cutover:{world.options.seed}")
    if not world.options.faults or rng.random() >= 0.25:
        return None
    return Cutovers(world, rng, bound_us=int(rng.uniform(0.0, 5.0) * 1_000_000))
