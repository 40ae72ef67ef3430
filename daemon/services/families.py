"""Work families: a name, a policy, and a handler. The kernel never branches on names.

A handler receives a :class:`WorkContext` and returns an
:class:`~daemon.core.outcomes.Outcome`. Anything it writes to the database
after the claim goes through :meth:`WorkContext.fenced`, which proves the live
fence in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import attrs
import trio

from config.settings import FamilySettings, Settings
from daemon.core.cancel import CancelRule
from daemon.core.capability import DEFAULT_PAYLOAD_SCHEMA_VERSION, hold_reason
from daemon.core.outcomes import CancelAcknowledged, DeadLetter, Outcome, RetryLater, Succeeded
from daemon.core.retry import BackoffPolicy
from daemon.core.states import TERMINAL
from daemon.core.work import Fence, WorkItem
from daemon.services.clock import Clock
from storage.port import SqlTx
from storage.work_admin import CancelRequested
from storage.work_store import WorkStore

T = TypeVar("T")


class UnknownFamily(Exception):
    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown work family {name!r} (known: {', '.join(known)})")
        self.name = name


@attrs.define(eq=False)
class WorkContext:
    """What a handler may use: its item, its fence, and fenced storage."""

    item: WorkItem
    fence: Fence
    store: WorkStore
    clock: Clock
    replica_id: str
    # Writes to commit atomically with this item's finalization (see on_finalize).
    side_writes: list[Callable[[SqlTx], Awaitable[None]]] = attrs.field(factory=list)
    # Families to wake in this replica once the finalization committed.
    wakes: set[str] = attrs.field(factory=set)

    def wake_after_finalize(self, family: str) -> None:
        """The finalization creates ``family`` work: let this replica claim it at once."""
        self.wakes.add(family)

    def on_finalize(self, write: Callable[[SqlTx], Awaitable[None]]) -> None:
        """Run ``write`` inside the transaction that finalizes this item, only if the
        fence still holds there. If ``write`` raises a storage error, the
        finalization is rolled back with it (the item stays claimed until its
        lease runs out, then is reclaimed)."""
        self.side_writes.append(write)

    async def fenced(self, body: Callable[[SqlTx], Awaitable[T]], *, name: str) -> T:
        """Run ``body`` in a transaction that first proves this claim is still live."""
        return await self.store.work_fenced(self.fence, self.clock.now_us, body, name=name)

    async def check_fence(self) -> None:
        """Raise :class:`storage.port.LostLease` unless this claim is still live."""

        async def nothing(tx: SqlTx) -> None:
            return None

        await self.fenced(nothing, name="work.fence_check")


Handler = Callable[[WorkContext], Awaitable[Outcome]]
# Why a terminal item of this family may not be replayed right now (or None).
ReplayGuard = Callable[[WorkStore, WorkItem], Awaitable[str | None]]


@attrs.frozen
class WorkFamily:
    name: str
    handler: Handler
    settings: FamilySettings
    replay_guard: ReplayGuard | None = None
    # The newest payload schema the handler reads: newer work is left for a
    # replica whose build can read it (see daemon/core/capability.py).
    payload_schema_version: int = DEFAULT_PAYLOAD_SCHEMA_VERSION
    # What an operator's cancel means for this family (daemon/core/cancel.py).
    cancel_rule: CancelRule = CancelRule.ANYTIME

    def hold_reason(self, item: WorkItem) -> str | None:
        """Why this build would leave ``item`` for another replica (or ``None``)."""
        return hold_reason(item_engine=item.engine_capability_version,
                           item_schema=item.payload_schema_version,
                           schema=self.payload_schema_version)

    @property
    def backoff(self) -> BackoffPolicy:
        floor = min(0.05, self.settings.backoff_base)
        return BackoffPolicy(
            base_s=self.settings.backoff_base, cap_s=self.settings.backoff_cap, floor_s=floor
        )

    @property
    def lease_ttl_us(self) -> int:
        return int(self.settings.lease_ttl * 1_000_000)


@attrs.define
class FamilyRegistry:
    families: dict[str, WorkFamily] = attrs.field(factory=dict)
    # Services the handlers rely on (a checkpoint batcher, say), started by the
    # replica before its worker pool and stopped after it.
    services: list[Callable[..., Awaitable[None]]] = attrs.field(factory=list)

    def add(self, family: WorkFamily) -> None:
        self.families[family.name] = family

    def get(self, name: str) -> WorkFamily:
        try:
            return self.families[name]
        except KeyError:
            raise UnknownFamily(name, sorted(self.families)) from None

    def names(self) -> list[str]:
        return sorted(self.families)

    def hold_reason(self, item: WorkItem) -> str | None:
        """Why this build leaves a not-yet-finished ``item`` for another replica: it was
        written for a newer engine or payload schema (``None`` if it may run it here)."""
        if item.state in TERMINAL:
            return None
        family = self.families.get(item.family)
        if family is not None:
            return family.hold_reason(item)
        return hold_reason(item_engine=item.engine_capability_version,
                           item_schema=item.payload_schema_version)

    def cancel_rules(self) -> dict[str, CancelRule]:
        """Each family's cancel rule, for the storage cancel to apply in its transaction.

        Every built-in family's declared rule is included even when this registry
        runs no handler for it (a CLI registry, say): a receipt stays uncancellable
        whoever asks."""
        return {**CANCEL_RULES,
                **{name: family.cancel_rule for name, family in self.families.items()}}


async def noop_handler(ctx: WorkContext) -> Outcome:
    """The built-in ``noop`` family, for demos and benchmarks.

    An empty payload does nothing. For demos and tests a payload may ask for
    ``sleep_ms`` (hold the claim a while), ``fail_attempts`` (ask for a retry
    on the first N attempts) or ``dead`` (dead-letter at once). Each finished
    execution is journaled by the kernel (work id, epoch) when it finalizes.
    """
    if ctx.item.payload in ("", "{}"):
        return Succeeded()
    try:
        doc: Any = json.loads(ctx.item.payload)
    except ValueError:
        return DeadLetter("bad_payload", "noop payload is not JSON")
    if not isinstance(doc, Mapping):
        return DeadLetter("bad_payload", "noop payload is not an object")
    sleep_ms = doc.get("sleep_ms", 0)
    if isinstance(sleep_ms, int | float) and sleep_ms > 0:
        await trio.sleep(sleep_ms / 1000)
    if doc.get("dead"):
        return DeadLetter("requested", "noop payload asked to dead-letter")
    fail_attempts = doc.get("fail_attempts", 0)
    if isinstance(fail_attempts, int) and ctx.item.attempt <= fail_attempts:
        return RetryLater("requested", f"noop payload asked to fail attempt {ctx.item.attempt}")
    return Succeeded()


BUILTIN_HANDLERS: dict[str, Handler] = {"noop": noop_handler}
# What cancel means per family. ``noop``: anything not yet finished stops.
# ``external_effect``: only before its dispatch checkpoint (a request at the
# provider cannot be called back; once dispatched the cancel is refused until
# the attempt is classified); the command then stays open, its Runtime intent
# blocking until an operator retires it (a no-effect receipt when proven) or
# repairs it. ``runtime_receipt``: never (it delivers a persisted result the
# Runtime must receive; cancelling it would end that duty).
CANCEL_RULES: dict[str, CancelRule] = {
    "noop": CancelRule.ANYTIME,
    "external_effect": CancelRule.BEFORE_DISPATCH,
    "runtime_receipt": CancelRule.NEVER,
    # ``inbound_apply``: anything not yet finished stops (its Runtime mutation is
    # replay-safe by its key, and a later change or reconciliation brings the record back).
    "inbound_apply": CancelRule.ANYTIME,
    # ``cursor_reconcile``: anything not yet finished stops (a run only reads and queues
    # inbound_apply items; a cancelled stream stops until an operator starts it again).
    "cursor_reconcile": CancelRule.ANYTIME,
    # ``subscription_reconcile``: a run only reads and queues; a step's provider call
    # cannot be called back once dispatched (as ``external_effect``).
    "subscription_reconcile": CancelRule.BEFORE_DISPATCH,
}
# Every family this build can run; the effect and receipt handlers need the
# catalog and an HTTP client, so daemon/services/assembly.py builds them.
FAMILY_NAMES = ("cursor_reconcile", "external_effect", "inbound_apply", "noop",
                "runtime_receipt", "subscription_reconcile")


def known_family_names() -> list[str]:
    return list(FAMILY_NAMES)


def require_known_family(name: str | None) -> None:
    """Refuse a family this build does not know (an operator's typo matches nothing and
    would look like an empty listing); ``None``: no family was asked for."""
    if name is not None and name not in FAMILY_NAMES:
        raise UnknownFamily(name, known_family_names())


def build_registry(
    settings: Settings,
    handlers: Mapping[str, Handler] | None = None,
    guards: Mapping[str, ReplayGuard] | None = None,
) -> FamilyRegistry:
    registry = FamilyRegistry()
    for name, handler in (handlers or BUILTIN_HANDLERS).items():
        registry.add(WorkFamily(name, acknowledging_cancel(handler), settings.family(name),
                                (guards or {}).get(name),
                                cancel_rule=CANCEL_RULES.get(name, CancelRule.ANYTIME)))
    return registry


def acknowledging_cancel(handler: Handler) -> Handler:
    """A step refused because an operator cancelled the item (the dispatch
    checkpoint, say) ends the handler with the fenced cancel acknowledgement."""

    async def handle(ctx: WorkContext) -> Outcome:
        try:
            return await handler(ctx)
        except CancelRequested:
            ctx.side_writes.clear()
            ctx.wakes.clear()
            return CancelAcknowledged()

    return handle
