"""One INFO line per interval that says what this replica did (issue 23: logs an operator
can read).

Routine successes (a command accepted, an effect attempted, a receipt confirmed, an
inbound change applied) are DEBUG lines: at INFO they came several a second and buried
the console address and every warning. Instead, every ``interval_s`` this service
writes one ``activity`` line with what this replica's counters moved by since the last
one (items finalized by family and state, admissions, effect attempts by outcome,
receipts, inbound changes). Nothing happened: no line. Failures are not summarized here:
each retry, dead item, refused call and credential failure is its own WARNING line.
"""

from __future__ import annotations

import trio

from daemon.services import logs
from daemon.services.metrics import Metrics

SUMMARY_INTERVAL_S = 60.0

# Metric family (as collected, without ``_total``) -> short name in the line.
SUMMARIZED = {
    "integrationd_work_finalized": "finalized",
    "integrationd_command_admissions": "admissions",
    "integrationd_effect_attempts": "effect_attempts",
    "integrationd_receipt_deliveries": "receipts",
    "integrationd_inbound_changes": "inbound",
    "integrationd_ingress_deliveries": "webhooks",
}


def snapshot(metrics: Metrics) -> dict[str, float]:
    """The summarized counters, one key per label set: ``finalized.noop.succeeded``."""
    out: dict[str, float] = {}
    for family in metrics.registry.collect():
        short = SUMMARIZED.get(family.name)
        if short is None:
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            key = ".".join([short, *(str(v) for v in sample.labels.values())])
            out[key] = out.get(key, 0.0) + sample.value
    return out


def movement(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """What moved between two snapshots (counters only grow; a key new in ``after``
    moved from 0)."""
    return {key: int(value - before.get(key, 0.0)) for key, value in sorted(after.items())
            if value - before.get(key, 0.0) > 0}


def summary_fields(moved: dict[str, int]) -> dict[str, int]:
    """The line's fields: each moved counter, and a total per kind for a quick read."""
    totals: dict[str, int] = {}
    for key, n in moved.items():
        kind = key.split(".", 1)[0]
        totals[f"{kind}_total"] = totals.get(f"{kind}_total", 0) + n
    return {**totals, **moved}


async def run_activity_summaries(metrics: Metrics, replica_id: str,
                                 interval_s: float = SUMMARY_INTERVAL_S, *,
                                 task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                                 ) -> None:
    """Every ``interval_s``, one ``activity`` INFO line, if anything moved."""
    before = snapshot(metrics)
    task_status.started()
    while True:
        await trio.sleep(interval_s)
        after = snapshot(metrics)
        moved = movement(before, after)
        before = after
        if moved:
            logs.event("activity", replica=replica_id, interval_s=interval_s,
                       **summary_fields(moved))
