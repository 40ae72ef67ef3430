"""An operator rotating the token-bundle key (``integrationd keys rotate``) while tokens
are refreshed (issue 22 item 2).

In the seeds that draw it (one in four, from its own generator: the other seeds'
schedules stay as they were), the deployment is half-way through a key change: every
replica loads the old key ``k1`` as ``[keys] active`` and the new key ``k2`` as
``[keys] previous`` (the rollout's first step: both keys loaded everywhere), and the
operator, with the new configuration (``k2`` active, ``k1`` previous), runs ``keys
rotate`` again and again during the chaos: :func:`daemon.services.key_rotation.rotate_keys`,
the call ``integrationd keys rotate`` makes, as ``sim-admin``. The replicas go on
refreshing grants under ``k1``, so each rotation finds bundles to rewrap. Half of the
rotations are *placed*: they run when a chosen replica next begins a refresh's dispatch
marker (``refresh.dispatch``) or its activation (``refresh.activate``), i.e. while a
refresh of some grant is in flight (``FaultyDatabase.interleave_at``).

Oracles: every bundle opens under the loaded keys at every use (no
``token_bundle_refused`` event: ``keys_bundles_refused``), no rotation reports a bundle it
could not open (``keys_rotation_refused``), and the torture run's invariants judge what
the rewraps did to the refreshes (``grants_not_valid``, ``double_refreshes``, ``lost``):
a rewrap is a new token version of the same secret, and must never make a refresh's
answer unusable.
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

import attrs
import trio

from bench import torture
from daemon.core.token_bundle import TokenKey
from daemon.services import logs
from daemon.services.key_rotation import rotate_keys
from storage.port import StorageError

if TYPE_CHECKING:
    from sim.world import SimReplica, World
    from storage.work_store import WorkStore

NEW_KEY = TokenKey("k2", bytes(range(100, 132)))
PLACES = ("refresh.dispatch", "refresh.activate")


class _Refusals(logging.Handler):
    """Counts the daemon's ``token_bundle_refused`` events (a bundle no loaded key opens)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == "token_bundle_refused":
            self.count += 1


@attrs.define(eq=False)
class KeyRotations:
    world: World
    rng: random.Random
    store: WorkStore | None = None
    refusals: _Refusals = attrs.field(factory=_Refusals)
    refused: int = 0

    @property
    def keys(self) -> dict[str, TokenKey]:
        return {torture.TOKEN_KEY.key_id: torture.TOKEN_KEY, NEW_KEY.key_id: NEW_KEY}

    def configure(self) -> None:
        """The replicas load both keys, the old one still active (the rollout's first
        step); the new key's file sits beside the old one."""
        workdir = self.world.workdir
        (workdir / f"{NEW_KEY.key_id}.key").write_text(NEW_KEY.material.hex())
        active = f'active = "{torture.TOKEN_KEY.key_id}"\n'
        for cfg in self.world.configs:
            text = cfg.read_text()
            assert text.count(active) == 1, "bench/torture.py's [keys] section changed"
            cfg.write_text(text.replace(active, active + f'previous = "{NEW_KEY.key_id}"\n'))

    def start(self, store: WorkStore, **parts: Any) -> None:
        self.store = store
        # Here, not in configure: the world sends the daemon's log to its trace after
        # the configurations are written, replacing the logger's handlers.
        logging.getLogger(logs.LOGGER_NAME).addHandler(self.refusals)

    async def rotate(self, place: str) -> None:
        """``integrationd keys rotate --actor sim-admin`` with the new configuration."""
        world = self.world
        assert world.op_clock is not None and self.store is not None
        try:
            report = await rotate_keys(self.store, self.keys, NEW_KEY.key_id,
                                       actor="sim-admin", reason="simulated key rotation",
                                       now_us=world.op_clock.now_us())
        except StorageError as exc:
            world.trace("operator_keys_rotate_failed", error=type(exc).__name__, at=place)
            return
        world.ops["operator_key_rotations"] += 1
        world.ops["operator_keys_rewrapped"] += report.rewrapped
        self.refused += len(report.refused)
        world.trace("operator_keys_rotated", rewrapped=report.rewrapped,
                    already=report.already_current, refused=len(report.refused), at=place)

    async def chaos(self) -> None:
        rng = self.rng
        while True:
            await trio.sleep(rng.uniform(1.0, 5.0))
            live = [r for r in self.world.replicas if r.alive and r.db is not None
                    and r.node not in self.world.frozen]
            if rng.random() < 0.5 and live:
                r = live[rng.randrange(len(live))]
                assert r.db is not None
                if r.db.interleave_at is not None:
                    continue  # another operator's placed action waits there

                async def during(name: str, r: SimReplica = r) -> None:
                    await self.rotate(f"{r.node}:{name}")

                r.db.on_interleave = during
                r.db.interleave_at = PLACES[rng.randrange(len(PLACES))]
            else:
                await self.rotate("")

    async def settle(self) -> None:
        return None

    async def final(self, result: dict[str, Any]) -> None:
        # Once more after the settle: whatever was refreshed under the old key since.
        await self.rotate("final")
        result["keys_bundles_refused"] = self.refusals.count
        result["keys_rotation_refused"] = self.refused
        logging.getLogger(logs.LOGGER_NAME).removeHandler(self.refusals)
        for name in ("keys_bundles_refused", "keys_rotation_refused"):
            if result[name]:
                self.world.violation(name, count=result[name])


def draw(world: World) -> KeyRotations | None:
    rng = random.Random(f"keys:{world.options.seed}")
    if not world.options.faults or rng.random() >= 0.25:
        return None
    return KeyRotations(world, rng)


def mutant_rewrap_during_refresh() -> Any:
    """The mutant ``rewrap_during_refresh`` (sim/mutants.py): a rotation's rewrap no longer
    leaves a grant whose refresh is in flight alone (``grant_rewrap`` without its refresh
    lease check, as before the fix of seed 7)."""
    from storage.grants import AuthorizationGrants, RewrapOutcome, replace_grant
    from storage.port import SqlTx
    from storage.work_admin import append_audit

    saved = AuthorizationGrants.grant_rewrap

    async def grant_rewrap(self: Any, *, binding_id: str, generation: int,
                           expected_version: int, sealed: Any, expires_at_us: int,
                           now_us: int, audit: Any) -> RewrapOutcome:
        async def body(tx: SqlTx) -> RewrapOutcome:
            if not await replace_grant(tx, binding_id=binding_id, generation=generation,
                                       expected_version=expected_version, sealed=sealed,
                                       expires_at_us=expires_at_us, now_us=now_us,
                                       refreshed=False, keep_state=True):
                return RewrapOutcome.MOVED
            await append_audit(tx, audit)
            return RewrapOutcome.REWRAPPED

        return await self.db.transact(body, name="grant.rewrap")  # type: ignore[no-any-return]

    AuthorizationGrants.grant_rewrap = grant_rewrap  # type: ignore[method-assign]

    def undo() -> None:
        AuthorizationGrants.grant_rewrap = saved  # type: ignore[method-assign]

    return undo
