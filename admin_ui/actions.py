"""Operator actions shared by the console (pages and JSON API) and the admin CLI.

Authorization is checked at request time against the current settings, per
item. Every change is audited in the transaction that makes it: a replay by
:meth:`storage.work_store.WorkStore.work_replay`, a cancel by
:meth:`~storage.work_store.WorkStore.work_cancel_audited`. A bulk DLQ replay
is a sequence of single replays (each authorized and audited on its own,
conflicts reported per item) followed by one summary audit entry.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from admin_ui.filters import BulkReplayRequest
from config.settings import Settings
from daemon.core.work import WorkItem
from daemon.services import logs
from daemon.services.clock import Clock
from daemon.services.families import FamilyRegistry, UnknownFamily
from daemon.services.operator_api import NotAuthorized, authorize, replay
from storage.idgen import new_ulid
from storage.port import (
    AuditEntry,
    CancelParams,
    CancelResult,
    CommitOutcomeUnknown,
    DeadQuery,
    StorageError,
    WorkConflict,
)
from storage.work_store import WorkStore


@attrs.frozen
class BulkItemResult:
    """One item of a bulk replay: ``replayed``, ``conflict``, ``refused``, ``error``
    or ``not_attempted`` (after a database error stopped the run)."""

    work_id: str
    outcome: str
    new_work_id: str | None = None
    message: str = ""


@attrs.frozen
class BulkReplayReport:
    bulk_id: str
    family: str
    failure_class: str | None
    selected: int
    complete: bool
    items: tuple[BulkItemResult, ...]
    # The summary ``dlq.bulk_replay`` audit entry, when one was written (nothing is
    # written when nothing was selected, or when writing it failed).
    audit_id: str | None = None

    def count(self, outcome: str) -> int:
        return sum(1 for i in self.items if i.outcome == outcome)

    def to_json(self) -> dict[str, Any]:
        return {
            "bulk_id": self.bulk_id,
            "family": self.family,
            "failure_class": self.failure_class,
            "selected": self.selected,
            "complete": self.complete,
            "replayed": self.count("replayed"),
            "conflicts": self.count("conflict"),
            "audit_id": self.audit_id,
            "items": [attrs.asdict(i) for i in self.items],
        }


@attrs.frozen
class Operations:
    """What an operator action needs: the store, the current settings, families, a clock."""

    store: WorkStore
    settings: Settings
    registry: FamilyRegistry
    clock: Clock

    async def replay_item(self, *, work_id: str, actor: str, reason: str) -> WorkItem:
        """Replay one terminal item as a new one with lineage (409 if already replayed)."""
        return await replay(self.store, self.settings, self.registry, self.clock,
                            work_id=work_id, actor=actor, reason=reason)

    async def cancel_item(self, *, work_id: str, actor: str, reason: str) -> CancelResult:
        """Cancel pending/retry work, or ask a running claimant to stop, as the item's
        family declares (``FamilyRegistry.cancel_rules``); audited. Refusals (a
        terminal item, a receipt, an effect already dispatched) raise
        :class:`storage.work_admin.CancelRefused`, a ``WorkConflict``."""
        operator = authorize(self.settings, actor, "work.cancel")
        return await self.store.work_cancel_audited(
            CancelParams(work_id=work_id, actor=operator.name, role=operator.role,
                         reason=reason),
            self.clock.now_us(), self.registry.cancel_rules(),
        )

    async def bulk_replay(self, request: BulkReplayRequest, *, actor: str) -> BulkReplayReport:
        """Replay up to ``request.limit`` not-yet-replayed dead items of one family/class."""
        operator = authorize(self.settings, actor, "work.replay")
        self.registry.get(request.family)  # an unknown family is refused, not "0 selected"
        now = self.clock.now_us()
        bulk_id = new_ulid(now)
        selected = await self.store.work_dead_list(
            DeadQuery(family=request.family, failure_class=request.failure_class,
                      unreplayed_only=True, limit=request.limit)
        )
        results: list[BulkItemResult] = []
        complete = True
        reason = f"{request.reason} [bulk {bulk_id}]"
        for index, item in enumerate(selected):
            try:
                new = await self.replay_item(work_id=item.work_id, actor=operator.name,
                                             reason=reason)
            except WorkConflict as exc:
                results.append(BulkItemResult(item.work_id, "conflict", None, str(exc)))
            except (NotAuthorized, UnknownFamily) as exc:
                results.append(BulkItemResult(item.work_id, "refused", None, str(exc)))
            except StorageError as exc:
                logs.warn("admin_bulk_replay_storage_error", bulk=bulk_id, error=str(exc))
                outcome = "unknown" if isinstance(exc, CommitOutcomeUnknown) else "error"
                results.append(BulkItemResult(item.work_id, outcome, None,
                                              "database error; check this item"))
                results.extend(BulkItemResult(rest.work_id, "not_attempted")
                               for rest in selected[index + 1:])
                complete = False
                break
            else:
                results.append(BulkItemResult(item.work_id, "replayed", new.work_id))
        report = BulkReplayReport(bulk_id, request.family, request.failure_class,
                                  len(selected), complete, tuple(results))
        if selected:
            audit_id = await self._audit_bulk(report, operator.name, operator.role,
                                              request.reason)
            report = attrs.evolve(report, audit_id=audit_id)
        return report

    async def _audit_bulk(self, report: BulkReplayReport, actor: str, role: str,
                          reason: str) -> str | None:
        """Write the run's summary audit entry; its id, or ``None`` if it failed."""
        now = self.clock.now_us()
        replayed = {i.work_id: i.new_work_id for i in report.items if i.outcome == "replayed"}
        others = {i.work_id: i.outcome for i in report.items if i.outcome != "replayed"}
        entry = AuditEntry(
            # One millisecond past every replay of the run: the summary sorts after them.
            audit_id=new_ulid(now + 1000),
            at_us=now,
            actor=actor,
            role=role,
            action="dlq.bulk_replay",
            target_kind="dlq",
            target_id=f"{report.family}/{report.failure_class or '*'}",
            reason=reason,
            before=json.dumps({"selected": report.selected}),
            after=json.dumps({"bulk_id": report.bulk_id, "replayed": replayed,
                              "not_replayed": others, "complete": report.complete}),
        )
        try:
            await self.store.audit_append(entry)
        except StorageError as exc:
            # Each replay already has its own audit entry; only the summary is lost.
            logs.warn("admin_bulk_audit_failed", bulk=report.bulk_id, error=str(exc))
            return None
        return entry.audit_id
