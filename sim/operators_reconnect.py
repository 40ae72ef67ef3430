"""Reconnects and reinstalls of a HubSpot binding during the chaos (issue 22 item 2; seed
000 sections 8.1 and 13: "reconnect cannot retarget queued work", "binding
reinstall/reconnect fencing").

In the seeds that draw it (one in four, from its own generator: the other seeds'
schedules stay as they were), now and then the binding ``hubspot-r`` of one Runtime moves
to a new ``BindingGeneration`` with new credentials, by one of three paths, each the
production code's own:

* **the Runtime reconnects** (``POST /v1/bindings/hubspot-r/reconnect`` from Runtime r's
  node to its replica, with the new grant: an access and a refresh token the OAuth
  simulator knows, as an authorization-code exchange would answer them): the generation
  moves and the new grant is installed, the old one revoked, in one transaction;
* **the console reinstalls** (``storage.principals.binding_operator_flow`` with
  ``reinstall``, what ``/admin/bindings/{id}/reinstall`` calls): the generation moves with
  no grant; the Runtime then hands one over (``POST .../change_scopes`` with the grant and
  no identity change: the next token version of the new generation);
* **the CLI disconnects, then reconnects** (``binding_transition``, what ``integrationd
  binding disconnect|reconnect --generation G`` calls), a moment apart, then the Runtime
  hands the grant over as above.

Half of the console's and the CLI's moves are *placed*: they commit when a chosen replica
next begins a dispatch checkpoint (``effect.checkpoint``: after its claim read the
command's context) or a token refresh's dispatch marker (``refresh.dispatch``: after it
took the refresh lease of the generation being superseded). The Runtime's requests are
resent with the same bytes (its idempotency key) until integrationd answers definitively,
through the settle if need be.

Work queued under the old generation fails closed; a command with an attempt in doubt is
then dead for an operator (a read-back under moved pins is refused), so the world's
operator settles those as the console does: a disposition of each unresolved attempt from
the provider's own journal (``effect_operator_disposition``, what ``/admin/effects``
records), then ``command retire`` and, when that left no receipt, ``command repair``.

Oracles, at the instant a request leaves a replica's handler (chained behind
:func:`sim.oracles.install`'s hook):

* ``send_with_other_generation_token``: a request to HubSpot carries an access token of
  another binding or generation than its command pinned (the world knows every token's
  binding and generation: it opens every stored grant with the run's keys at the start
  and after each replica transaction that may install a token version; a token a
  handler sends that no grant ever held is counted, ``reconnect_tokens_unknown``);
* ``send_with_superseded_binding``: a PATCH leaves although a move of its command's binding
  to a newer generation had committed before its dispatch checkpoint's transaction began
  (ordered by the world's commit sequence, as ``send_with_moved_pins`` orders rebinds);
* ``refresh_of_superseded_generation``: a token refresh leaves for the OAuth server for a
  generation that a move had superseded before its dispatch marker's transaction began.

At the end the torture run's invariants judge the intents (every one with exactly one true
terminal receipt: ``lost``, ``receipts_not_once``); the Leads whose commands were pinned to
a superseded generation are not judged by ``diverged`` (their intents were rightly
refused, ``binding_generation``).
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
from typing import TYPE_CHECKING, Any

import attrs
import trio

from bench import torture
from config.catalog import load_catalog
from daemon.core.connect_flows import Flow
from daemon.core.effects import DEFAULT_MAX_IN_FLIGHT_S
from daemon.core.principals import BindingEvent
from daemon.core.token_bundle import BundleContext, BundleRefused, open_bundle
from sandbox.runtime.dispatcher import IntegrationClient
from sandbox.runtime.grants import FlowAnswer
from sandbox.runtime.model import RetryLater
from sim import oracles
from sim.net import NODE
from storage.effect_values import Disposition
from storage.port import StorageError, WorkConflict
from storage.principals import Actor

if TYPE_CHECKING:
    from sim.net import VirtualSocket
    from sim.world import SimReplica, World
    from storage.work_store import WorkStore

PLACES = ("effect.checkpoint", "refresh.dispatch")
ACTOR = Actor("sim-admin", "admin", "simulated reconnect")


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()[:24]


def _header(data: bytes, name: bytes) -> str | None:
    head = data.split(b"\r\n\r\n", 1)[0]
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return None


@attrs.define
class Handover:
    """One Runtime request to integrationd: the same bytes until a definitive answer."""

    runtime: int
    flow: str
    body: bytes


@attrs.define(eq=False)
class Reconnects:
    world: World
    rng: random.Random
    store: WorkStore | None = None
    oauth: Any = None
    hubspot: Any = None
    runtimes: list[Any] = attrs.field(factory=list)
    # Token digest -> (binding, generation) of the grant it belongs to.
    lineage: dict[str, tuple[str, int]] = attrs.field(factory=dict)
    # Binding -> (commit order, generation it moved to), recorded after each move returned.
    moves: dict[str, list[tuple[int, int]]] = attrs.field(factory=dict)
    marker_began: dict[tuple[str, int], int] = attrs.field(factory=dict)
    pending: list[Handover] = attrs.field(factory=list)
    busy: set[int] = attrs.field(factory=set)  # Runtimes with a move under way
    # Bindings the CLI path disconnected and has not reconnected yet (Runtime -> the
    # generation), finished in the settle if the move was cut short.
    disconnected: dict[int, int] = attrs.field(factory=dict)
    n: int = 0

    def configure(self) -> None:
        return None

    # ------------------------------------------------------------ set-up

    def start(self, store: WorkStore, **parts: Any) -> None:
        world = self.world
        self.store = store
        self.oauth, self.hubspot = parts["oauth"], parts["hubspot"]
        self.runtimes = list(parts["runtimes"])
        self._scan_grants()
        assert world.net is not None
        before = world.net.on_exchange

        def on_exchange(sock: VirtualSocket, data: bytes) -> None:
            before(sock, data)
            self.judge(sock, data)

        world.net.on_exchange = on_exchange
        world.commit_hooks.append(self.on_commit)

    def _scan_grants(self) -> None:
        """Every stored grant's tokens, opened with the run's keys: at the start (the
        set-up's generation 1) and after each replica transaction that may install a
        token version (a refresh's activation, a Runtime flow's grant). A refreshed token
        is used only once activated, so a token a handler sends is known here."""
        from sim.operators_keys import NEW_KEY

        keys = {torture.TOKEN_KEY.key_id: torture.TOKEN_KEY, NEW_KEY.key_id: NEW_KEY}
        from storage.grants import _COLUMNS, _from_row

        for row in self.world.observer.execute(f"SELECT {_COLUMNS} FROM authorization_grants"):
            grant = _from_row(row)
            try:
                bundle = open_bundle(grant.sealed, keys, BundleContext(
                    grant.binding_id, grant.generation, grant.token_version))
            except BundleRefused:
                continue
            lineage = (grant.binding_id, grant.generation)
            self.lineage[_digest(bundle.access_token.reveal())] = lineage
            if bundle.refresh_token is not None:
                self.lineage[_digest(bundle.refresh_token.reveal())] = lineage

    def on_commit(self, name: str, began: int, result: Any) -> None:
        if name.startswith(("refresh.activate", "binding.", "grant.")):
            self._scan_grants()
        if name.startswith("refresh.dispatch"):
            sender = oracles.CURRENT.get()
            if sender is not None:
                key = (sender.fence.work_id, sender.fence.ownership_epoch)
                self.marker_began[key] = began

    # ------------------------------------------------------------ oracles

    def _superseded(self, binding: str, pinned: int, began: int | None) -> list[int]:
        return [g for order, g in self.moves.get(binding, [])
                if began is not None and order < began and g > pinned]

    def judge(self, sock: VirtualSocket, data: bytes) -> None:
        world = self.world
        if not sock.node.startswith("replica-") or sock.froze_at_send:
            return
        sender = oracles.CURRENT.get()
        if sender is None:
            return
        dst = oracles.dst_node(sock)
        request = data.split(b"\r\n", 1)[0].decode("latin-1")[:80]
        fence = sender.fence
        observer = world.observer
        if dst == "hubspot" and sender.family == "external_effect":
            row = observer.execute(
                "SELECT c.binding_id, c.principal_generation FROM work_items w"
                " JOIN external_commands c ON c.command_id = w.subject_id"
                " WHERE w.work_id = ? AND w.subject_kind = 'command'",
                (fence.work_id,)).fetchone()
            if row is None:
                return
            binding, pinned = str(row[0]), int(row[1])
            auth = _header(data, b"authorization") or ""
            lineage = self.lineage.get(_digest(auth.partition(" ")[2]))
            if lineage is None:
                world.ops["reconnect_tokens_unknown"] += 1
            elif lineage != (binding, pinned):
                world.violation("send_with_other_generation_token", node=sock.node,
                                request=request, work_id=fence.work_id, binding=binding,
                                pinned_generation=pinned, token_of=list(lineage))
            if any(g > pinned for _, g in self.moves.get(binding, [])):
                world.ops["sends_after_reconnect"] += 1
            key = _header(data, b"idempotency-key")
            if key is None:
                return
            attempt = observer.execute(
                "SELECT attempt_id FROM effect_attempts WHERE work_id = ?"
                " AND ownership_epoch = ? AND idempotency_key = ?",
                (fence.work_id, fence.ownership_epoch, key)).fetchone()
            began = None if attempt is None else world.checkpoint_began.get(str(attempt[0]))
            moved = self._superseded(binding, pinned, began)
            if moved:
                world.violation("send_with_superseded_binding", node=sock.node,
                                request=request, work_id=fence.work_id, binding=binding,
                                pinned_generation=pinned, moved_to=max(moved))
        elif dst == "oauth" and request.startswith("POST "):
            began = self.marker_began.get((fence.work_id, fence.ownership_epoch))
            for binding, generation in observer.execute(
                    "SELECT binding_id, generation FROM refresh_leases WHERE owner_work_id = ?"
                    " AND owner_epoch = ? AND call_sent_at_us IS NOT NULL",
                    (fence.work_id, fence.ownership_epoch)).fetchall():
                moved = self._superseded(str(binding), int(generation), began)
                if moved:
                    world.violation("refresh_of_superseded_generation", node=sock.node,
                                    work_id=fence.work_id, binding=binding,
                                    generation=generation, moved_to=max(moved))

    # ------------------------------------------------------------ the operator

    def _moved(self, binding: str, generation: int) -> None:
        """Recorded after the move returned: it committed before any transaction that
        begins later."""
        self.moves.setdefault(binding, []).append((self.world.next_seq(), generation))
        self.world.ops["operator_binding_moves"] += 1

    def _grant(self, binding: str, generation: int) -> dict[str, Any]:
        """New credentials, as the authorization-code exchange would answer them."""
        access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        self.oauth.access_tokens.add(access)
        self.oauth.seed(refresh)
        self.lineage[_digest(access)] = self.lineage[_digest(refresh)] = (binding, generation)
        return {"type": "oauth_code_exchange", "access_token": access,
                "refresh_token": refresh, "expires_in": torture.TOKEN_LIFETIME_S}

    def _handover(self, r: int, flow: str, generation: int) -> None:
        """The Runtime hands the new authority's grant over (``flow`` on ``generation``)."""
        self.n += 1
        body = {"idempotency_key": f"sim-{flow}-{self.n}", "expected_generation": generation,
                "reason": f"simulated {flow}",
                "grant": self._grant(f"hubspot-{r}",
                                     generation + (1 if flow == "reconnect" else 0))}
        self.pending.append(Handover(r, flow, json.dumps(body, sort_keys=True).encode()))

    async def _console_or_cli(self, r: int, generation: int, how: str, place: str) -> None:
        assert self.store is not None and self.world.op_clock is not None
        binding = f"hubspot-{r}"
        clock = self.world.op_clock
        try:
            if how == "reinstall":
                await self.store.binding_operator_flow(
                    binding, Flow.REINSTALL, ACTOR, expected_generation=generation,
                    now_us=clock.now_us(), changes={})
            else:
                await self.store.binding_transition(binding, BindingEvent.DISCONNECT, ACTOR,
                                                    expected_generation=generation,
                                                    now_us=clock.now_us())
                self.world.trace("operator_binding_disconnected", binding=binding,
                                 generation=generation, at=place)
                self.disconnected[r] = generation
                await trio.sleep(self.rng.uniform(0.5, 3.0))
                await self.store.binding_transition(binding, BindingEvent.RECONNECT, ACTOR,
                                                    expected_generation=generation,
                                                    now_us=clock.now_us())
                self.disconnected.pop(r, None)
        except (StorageError, WorkConflict, Exception) as exc:  # refusals are answers
            self.world.trace("operator_binding_refused", binding=binding, how=how,
                             error=type(exc).__name__)
            self.busy.discard(r)
            return
        self._moved(binding, generation + 1)
        self.world.trace("operator_binding_moved", binding=binding, how=how,
                         generation=generation + 1, at=place)
        self._handover(r, "change_scopes", generation + 1)

    async def _reconnect_left(self, r: int, generation: int) -> None:
        assert self.store is not None and self.world.op_clock is not None
        binding = f"hubspot-{r}"
        for _ in range(20):
            try:
                await self.store.binding_transition(
                    binding, BindingEvent.RECONNECT, ACTOR, expected_generation=generation,
                    now_us=self.world.op_clock.now_us())
            except StorageError:
                await trio.sleep(1.0)
                continue
            except Exception as exc:  # a refusal (WorkConflict, ...) is an answer
                self.world.trace("operator_binding_refused", binding=binding,
                                 how="reconnect_left", error=type(exc).__name__)
                break
            self.disconnected.pop(r, None)
            self._moved(binding, generation + 1)
            self.world.trace("operator_binding_moved", binding=binding,
                             how="reconnect_left", generation=generation + 1, at="settle")
            self._handover(r, "change_scopes", generation + 1)
            break
        self.busy.discard(r)

    async def chaos(self) -> None:
        rng, world = self.rng, self.world
        assert self.store is not None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.courier)
            nursery.start_soon(self.resolver)
            while True:
                await trio.sleep(rng.uniform(4.0, 12.0))
                r = rng.randrange(len(self.runtimes))
                if r in self.busy:
                    continue
                try:
                    facts = await self.store.binding_get(f"hubspot-{r}")
                except StorageError:
                    continue
                if facts is None or facts.state.value != "connected":
                    continue
                self.busy.add(r)
                action = rng.random()
                if action < 0.4:
                    world.trace("operator_reconnect_requested", runtime=r,
                                generation=facts.generation)
                    self._handover(r, "reconnect", facts.generation)
                    continue
                how = "reinstall" if action < 0.75 else "disconnect_reconnect"
                live = [x for x in world.replicas if x.alive and x.db is not None
                        and x.node not in world.frozen and x.db.interleave_at is None]
                if rng.random() < 0.5 and live:
                    x = live[rng.randrange(len(live))]
                    assert x.db is not None

                    async def during(name: str, x: SimReplica = x, r: int = r,
                                     g: int = facts.generation, how: str = how) -> None:
                        await self._console_or_cli(r, g, how, f"{x.node}:{name}")

                    x.db.on_interleave = during
                    x.db.interleave_at = PLACES[rng.randrange(len(PLACES))]
                else:
                    nursery.start_soon(self._console_or_cli, r, facts.generation, how, "")

    async def settle(self) -> None:
        # An operator finishes the move it began: a disconnect whose reconnect was cut
        # short (a storage fault, or the replica whose transaction the move was placed in
        # crashed, or the chaos ended between the two) would leave the binding
        # disconnected, and its Runtime's intents waiting, for good.
        for r, generation in sorted(self.disconnected.items()):
            await self._reconnect_left(r, generation)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.courier)
            nursery.start_soon(self.resolver)

    # ------------------------------------------------------------ the Runtime's requests

    async def courier(self) -> None:
        """Sends the Runtime's flow requests in order, each until definitive."""
        delay = 0.2
        while True:
            if not self.pending:
                await trio.sleep(0.5)
                continue
            job = self.pending[0]
            answer = await self._send(job)
            if isinstance(answer, RetryLater):
                await trio.sleep(delay)
                delay = min(delay * 2, 3.0)
                continue
            delay = 0.2
            self.pending.pop(0)
            binding = f"hubspot-{job.runtime}"
            if isinstance(answer, FlowAnswer):
                if job.flow == "reconnect":
                    self._moved(binding, answer.generation)
                self.world.trace("operator_runtime_flow", binding=binding, flow=job.flow,
                                 generation=answer.generation, replayed=answer.replayed)
            else:
                self.world.trace("operator_runtime_flow_refused", binding=binding,
                                 flow=job.flow, error=getattr(answer, "error", "?"))
            self.busy.discard(job.runtime)

    async def _send(self, job: Handover) -> Any:
        """From Runtime r's node, with its credentials, as its connect flows send."""
        result: list[Any] = [RetryLater("not sent")]

        async def send() -> None:
            NODE.set(f"runtime-{job.runtime}")
            async with IntegrationClient.open(self.runtimes[job.runtime]) as client:
                result[0] = await client.binding_flow(f"hubspot-{job.runtime}", job.flow,
                                                      job.body)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
        return result[0]

    # ------------------------------------------------------------ blocked commands

    async def resolver(self) -> None:
        """Commands dead under a superseded generation with an attempt in doubt: the
        operator disposes of each attempt from the provider's journal, then retires (and
        repairs when no receipt was settled), as the console does."""
        from sim.world import operator_retire

        world = self.world
        while True:
            await trio.sleep(2.0)
            if not self.moves:
                continue
            live = [x for x in world.replicas if x.alive and x.replica is not None]
            if not live or world.op_clock is None:
                continue
            settings = live[0].replica.settings  # type: ignore[union-attr]
            rows = world.observer.execute(
                "SELECT c.command_id, c.operation, c.binding_id FROM work_items w"
                " JOIN external_commands c ON c.command_id = w.subject_id"
                " JOIN principal_bindings p ON p.binding_id = c.binding_id"
                " WHERE w.family = 'external_effect' AND w.subject_kind = 'command'"
                " AND w.state = 'dead' AND c.settlement = 'open'"
                " AND (c.principal_generation != p.generation OR p.state != 'connected')"
                " AND NOT EXISTS (SELECT 1 FROM work_items x WHERE x.subject_id ="
                "   c.command_id AND x.subject_kind = 'command'"
                "   AND x.state IN ('pending', 'processing', 'retry'))"
                " ORDER BY c.command_id").fetchall()
            for command_id, operation, binding_id in rows:
                if not await self._dispose(settings, str(command_id), str(operation),
                                           str(binding_id)):
                    continue
                assert self.store is not None
                await operator_retire(world, self.store, settings, str(command_id))

    async def _dispose(self, settings: Any, command_id: str, operation: str,
                       binding_id: str) -> bool:
        assert self.store is not None
        return await dispose_from_journal(self.world, self.store, self.hubspot, settings,
                                          command_id, operation, binding_id)

    # ------------------------------------------------------------ the end

    async def final(self, result: dict[str, Any]) -> None:
        """Leads with a command pinned to a superseded generation, or settled
        ``NO_EFFECT`` on a binding the operator moved, are not judged by ``diverged``:
        their intents were rightly refused (``binding_generation``, or ``no_grant``: a
        command admitted after the console's or the CLI's move and before the Runtime
        handed the grant over fails closed, seed 32), so the contact may keep an older
        title. (A quarantined intent has no command: it stays judged, seed 31.)"""
        moved = sorted(self.moves)
        marks = ",".join("?" for _ in moved)
        for binding_id, local_id in self.world.observer.execute(
                "SELECT c.binding_id, c.local_id FROM external_commands c"
                " JOIN principal_bindings p ON p.binding_id = c.binding_id"
                " WHERE c.principal_generation < p.generation"
                + (f" OR (c.binding_id IN ({marks}) AND c.settlement = 'no_effect')"
                   if moved else ""), moved).fetchall():
            if str(binding_id).startswith("hubspot-"):
                self.world.stopped.add((int(str(binding_id).rsplit("-", 1)[1]),
                                        str(local_id)))
        # The torture run counts every grant not valid; a superseded generation's grant
        # is rightly revoked (a Runtime reconnect) or left as it was (the console's and
        # the CLI's moves hand over none): only current generations' grants are judged.
        (superseded,) = self.world.observer.execute(
            "SELECT COUNT(*) FROM authorization_grants g JOIN principal_bindings p"
            " ON p.binding_id = g.binding_id WHERE g.generation < p.generation"
            " AND g.state != 'valid'").fetchone()
        result["grants_superseded_not_valid"] = int(superseded)
        result["grants_not_valid"] = max(0, int(result.get("grants_not_valid") or 0)
                                         - int(superseded))
        result["binding_moves"] = sum(len(m) for m in self.moves.values())
        result["handovers_unsent"] = len(self.pending)


async def dispose_from_journal(world: World, store: WorkStore, hubspot: Any, settings: Any,
                               command_id: str, operation: str, binding_id: str) -> bool:
    """The console's disposition of each unresolved attempt of a command from the
    provider's own journal (``effect_operator_disposition``, what ``/admin/effects``
    records): applied when the journal shows its idempotency key applied, absent when
    not. False: a disposition was refused (fenced: later)."""
    assert world.op_clock is not None
    catalog = load_catalog(settings)
    op, binding = catalog.operation(operation), catalog.binding(binding_id)
    window_s = max(op.contract.max_in_flight_s if op is not None
                   else DEFAULT_MAX_IN_FLIGHT_S,
                   binding.max_in_flight if binding is not None else 0.0)
    applied = {rec.idempotency_key for rec in hubspot.requests
               if rec.method == "PATCH" and rec.applied and rec.idempotency_key}
    for attempt_id, key in world.observer.execute(
            "SELECT attempt_id, idempotency_key FROM effect_attempts"
            " WHERE command_id = ? AND disposition IS NULL"
            " AND (outcome IS NULL OR outcome = 'OUTCOME_UNKNOWN')"
            " ORDER BY attempt_id", (command_id,)).fetchall():
        seen = key in applied
        try:
            await store.effect_operator_disposition(
                attempt_id=str(attempt_id),
                disposition=(Disposition.OPERATOR_APPLIED if seen
                             else Disposition.OPERATOR_ABSENT),
                note="simulated: the provider's journal " + (
                    "shows the key applied" if seen else "has no applied request"),
                actor="sim-admin", role="admin",
                in_flight_window_us=int(window_s * 1_000_000),
                now_us=world.op_clock.now_us())
        except (StorageError, WorkConflict) as exc:  # fenced: later
            world.trace("operator_dispose_refused", command_id=command_id,
                        error=type(exc).__name__)
            return False
        world.ops["operator_dispositions"] += 1
        world.trace("operator_disposed", command_id=command_id, applied=seen)
    return True


def draw(world: World) -> Reconnects | None:
    rng = random.Random(f"reconnect:{world.options.seed}")
    if not world.options.faults or rng.random() >= 0.25:
        return None
    return Reconnects(world, rng)
