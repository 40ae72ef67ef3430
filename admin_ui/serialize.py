"""JSON shapes the console API returns (and the pages render).

Payloads, lease tokens, password hashes and session secrets are never part of
any shape: a work item is :func:`daemon.services.operator_api.item_json`
(which drops the payload and the lease token and keeps the payload's size).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from daemon.core.work import WorkItem
from daemon.services.operator_api import item_json
from storage.port import AuditEntry, CancelResult, DeadClassCount, Execution, ReplicaInfo

STALE_HEARTBEATS = 3  # a replica that missed this many heartbeats is shown as stale


def work_json(item: WorkItem, *, replayed_as: str | None = None) -> dict[str, Any]:
    doc = item_json(item)
    if replayed_as is not None:
        doc["replayed_as"] = replayed_as
    return doc


def execution_json(execution: Execution) -> dict[str, Any]:
    return attrs.asdict(execution)


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def audit_json(entry: AuditEntry) -> dict[str, Any]:
    doc = attrs.asdict(entry)
    doc["before"] = _json_or_text(entry.before)
    doc["after"] = _json_or_text(entry.after)
    doc["origin"] = _json_or_text(entry.origin) if entry.origin is not None else None
    return doc


def audit_subject_ids(entry: AuditEntry) -> tuple[str | None, str | None]:
    """(before id, after id) an audit entry names, for links."""
    ids: list[str | None] = []
    for text in (entry.before, entry.after):
        doc = _json_or_text(text)
        value = doc.get("work_id") if isinstance(doc, dict) else None
        ids.append(value if isinstance(value, str) else None)
    return ids[0], ids[1]


def replica_json(info: ReplicaInfo, now_us: int, heartbeat_interval_s: float) -> dict[str, Any]:
    doc = attrs.asdict(info)
    doc["families"] = _json_or_text(info.families)
    age_s = max(0.0, (now_us - info.heartbeat_at_us) / 1_000_000)
    doc["heartbeat_age_s"] = round(age_s, 1)
    doc["stale"] = info.state != "stopped" and age_s > STALE_HEARTBEATS * heartbeat_interval_s
    return doc


def cancel_json(result: CancelResult) -> dict[str, Any]:
    return {"work_id": result.work_id, "disposition": result.disposition,
            "state": result.state.value}


def dead_class_json(count: DeadClassCount) -> dict[str, Any]:
    return attrs.asdict(count)
