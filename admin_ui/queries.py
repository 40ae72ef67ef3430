"""Read models for the work, DLQ and audit views: one shape for the API and the pages.

Every query is bounded (a page of at most 200 rows, keyset-paginated by work
id, newest first; the DLQ's failure-class breakdown samples the newest
:data:`DLQ_CLASS_SAMPLE` dead items). Shapes come from
:mod:`admin_ui.serialize`, so payloads and lease tokens never appear.
"""

from __future__ import annotations

from typing import Any

from admin_ui.extensions import LineageProvider, lineage_sections, section_json
from admin_ui.filters import DLQ_CLASS_SAMPLE
from admin_ui.serialize import audit_json, dead_class_json, execution_json, work_json
from admin_ui.view import ReplicaView
from daemon.core.capability import newer_build_version
from daemon.core.states import TERMINAL, WorkState
from daemon.core.work import WorkItem
from storage.find_rows import last_attempts
from storage.port import DeadQuery, WorkNotFound, WorkQuery
from storage.work_admin import REPLAYABLE

CANCELLABLE = frozenset({WorkState.PENDING, WorkState.RETRY, WorkState.PROCESSING})


def families(view: ReplicaView) -> list[str]:
    """Families this build runs plus any the latest depth sample has seen."""
    names = set(view.registry.names())
    if view.history:
        names.update(d.family for d in view.history[-1].depths)
    return sorted(names)


def _next_after(items: list[WorkItem], limit: int) -> str | None:
    return items[-1].work_id if len(items) >= limit else None


async def work_page(view: ReplicaView, query: WorkQuery) -> dict[str, Any]:
    items = await view.store.work_list(query)
    attempted = await last_attempts(view.store, [i.work_id for i in items])
    now_us = view.clock.now_us()
    return {"items": [{**work_json(i), **timeline_json(i, attempted.get(i.work_id), now_us)}
                      for i in items],
            "next_after": _next_after(items, query.limit)}


def timeline_json(item: WorkItem, last_attempted_us: int | None, now_us: int
                  ) -> dict[str, Any]:
    """When an item was created, last attempted and finished, its age, how long it took
    (created to finished) and its last error (failure class and summary)."""
    finished = item.updated_at_us if item.state in TERMINAL else None
    error = " ".join(p for p in (item.failure_class, item.operator_summary) if p) or None
    return {"last_attempted_at_us": last_attempted_us, "finished_at_us": finished,
            "age_s": max(0.0, (now_us - item.created_at_us) / 1e6),
            "duration_s": None if finished is None
            else max(0.0, (finished - item.created_at_us) / 1e6),
            "last_error": error}


def _summary(item: WorkItem) -> dict[str, Any]:
    return {"work_id": item.work_id, "state": item.state.value, "family": item.family,
            "created_at_us": item.created_at_us}


async def work_detail(view: ReplicaView, work_id: str,
                      providers: list[LineageProvider]) -> dict[str, Any]:
    store = view.store
    item = await store.work_get(work_id)
    if item is None:
        raise WorkNotFound(work_id)
    executions = await store.work_executions(work_id)
    replays = await store.work_replays_of(work_id)
    audit = await store.audit_list(limit=200, target_id=work_id)
    original = None
    created_by = []
    if item.replay_of is not None:
        found = await store.work_get(item.replay_of)
        original = _summary(found) if found else {"work_id": item.replay_of, "state": None}
        created_by = [
            audit_json(e) for e in await store.audit_list(limit=200, target_id=item.replay_of)
            if e.action == "work.replay" and work_id in e.after
        ]
    sections = await lineage_sections(view, item, providers)
    return {
        "item": work_json(item),
        "hold": view.registry.hold_reason(item),
        "newer_build": newer_build_version(item.engine_capability_version),
        "executions": [execution_json(e) for e in executions],
        "lineage": {"replay_of": original, "replays": [_summary(r) for r in replays],
                    "created_by": created_by},
        "audit": [audit_json(e) for e in audit],
        "sections": [section_json(s) for s in sections],
        "can": {"replay": item.state in REPLAYABLE and not replays,
                "cancel": item.state in CANCELLABLE},
    }


async def dlq_page(view: ReplicaView, query: DeadQuery) -> dict[str, Any]:
    store = view.store
    items = await store.work_dead_list(query)
    replayed = await store.work_replay_map([i.work_id for i in items])
    classes = await store.work_dead_classes(DLQ_CLASS_SAMPLE)
    return {
        "items": [work_json(i, replayed_as=replayed.get(i.work_id)) for i in items],
        "next_after": _next_after(items, query.limit),
        "classes": [dead_class_json(c) for c in classes],
        "classes_sample": DLQ_CLASS_SAMPLE,
    }


async def audit_page(view: ReplicaView, target: str | None, limit: int) -> dict[str, Any]:
    entries = await view.store.audit_list(limit=limit, target_id=target)
    return {"entries": [audit_json(e) for e in entries]}
