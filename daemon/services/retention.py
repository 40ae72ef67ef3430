"""The pruner: every replica runs it; the database lease lets one prune at a time.

Theory of operation
-------------------
Every ``retention.interval`` the pruner tries to take the ``retention`` lease
(:meth:`WorkStore.retention_lease_acquire`). The winner runs a *pass*: for each declared
rule (:data:`storage.retention.rules.RULES`) and each of its partitions, fenced batches
(:meth:`WorkStore.retention_prune_batch`, one transaction each, each renewing the lease)
until the scan is exhausted; then it releases the lease with the pass's figures, which
the console shows. A batch that finds the lease gone (another replica took it after this
one paused past it) deletes nothing and ends the pass. Losers wait for the next interval.

The pass stops early, too, when the lease can no longer be trusted locally: a batch must
start before ``renewed + lease_ttl / 2`` (trio's clock), so a pruner stalled between
batches never relies on a lease the database may already have given away; the fence is
what makes it safe, this only keeps it polite.

Visible: ``integrationd_retention_pruned_rows_total{table}`` per deleted row,
``integrationd_retention_lag_seconds{table}`` (how far past its horizon the oldest
prunable row was when the pass reached that table), ``integrationd_retention_passes_total
{result}``, and the last pass in ``retention_leases`` for the console.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio

from config.settings import RetentionSettings
from daemon.core import retention as core
from daemon.services import logs
from daemon.services.clock import Clock
from daemon.services.metrics import Metrics
from storage.idgen import new_lease_token
from storage.port import StorageError
from storage.retention.prune import (
    BatchParams,
    LeaseGranted,
    LeaseParams,
    RetentionLeaseLost,
)
from storage.retention.rules import RULES
from storage.work_store import WorkStore

US = 1_000_000


@attrs.define(eq=False)
class Pruner:
    store: WorkStore
    settings: RetentionSettings
    clock: Clock
    metrics: Metrics
    holder: str
    # Webhook receipts' horizon (ingress.retention_days: how long dedup stays exact).
    ingress_days: float = 14.0

    @property
    def policy(self) -> core.RetentionPolicy:
        s = self.settings
        return core.RetentionPolicy(work_days=s.work_days, facts_days=s.facts_days,
                                    commands_days=s.commands_days,
                                    quarantine_days=s.quarantine_days,
                                    batch_rows=s.batch_rows, batch_bytes=s.batch_bytes,
                                    ingress_days=self.ingress_days).validate()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.settings.interval)
            await self.pass_once()

    async def pass_once(self) -> dict[str, Any] | None:
        """Take the lease and prune until caught up; None when another pruner holds it."""
        s = self.settings
        token = new_lease_token()
        ttl_us = int(s.lease_ttl * US)
        try:
            grant = await self.store.retention_lease_acquire(
                LeaseParams(holder=self.holder, token=token, ttl_us=ttl_us,
                            sweep_interval_us=int(s.sweep_interval * US)),
                self.clock.now_us())
        except StorageError as exc:
            self.metrics.retention_passes.labels("failed").inc()
            logs.warn("retention_lease_failed", error=str(exc))
            return None
        if not isinstance(grant, LeaseGranted):
            self.metrics.retention_passes.labels("busy").inc()
            return None
        summary, result = await self._prune(grant, ttl_us)
        self.metrics.retention_passes.labels(result).inc()
        if result != "lease_lost":
            try:
                await self.store.retention_lease_release(
                    token=token, summary=summary, now_us=self.clock.now_us())
            except StorageError as exc:
                logs.warn("retention_release_failed", error=str(exc))
        logs.event("retention_pass", result=result, holder=self.holder,
                   pruned=sum(t["pruned"] for t in summary["tables"].values()),
                   sweep_restarted=grant.sweep_restarted)
        return summary

    async def _prune(self, grant: LeaseGranted, ttl_us: int) -> tuple[dict[str, Any], str]:
        policy = self.policy
        started_us = self.clock.now_us()
        cut = core.cutoffs(policy, started_us)
        tables: dict[str, dict[str, int]] = {}
        renewed = trio.current_time()
        result = "done"
        try:
            for rule in RULES:
                entry = tables.setdefault(rule.table, {"pruned": 0, "lag_s": 0})
                for partition in rule.scans():
                    cursor = grant.cursors.get(rule.cursor_key(partition))
                    first = True
                    while True:
                        if trio.current_time() - renewed > self.settings.lease_ttl / 2:
                            raise _Untrusted
                        batch = await self.store.retention_prune_batch(BatchParams(
                            rule=rule, partition=partition, cursor=cursor, token=grant.token,
                            cutoffs=cut, batch_rows=policy.batch_rows,
                            batch_bytes=policy.batch_bytes, ttl_us=ttl_us,
                        ), self.clock.now_us)
                        renewed = trio.current_time()
                        if first:
                            lag = core.overdue_us(batch.oldest_prunable_age_us,
                                                  cut.of(rule.horizon)) // US
                            entry["lag_s"] = max(entry["lag_s"], lag)
                            first = False
                        entry["pruned"] += batch.deleted
                        self.metrics.retention_pruned.labels(rule.table).inc(batch.deleted)
                        cursor = batch.cursor
                        if batch.exhausted:
                            break
                self.metrics.retention_lag.labels(rule.table).set(entry["lag_s"])
        except RetentionLeaseLost:
            result = "lease_lost"
            logs.warn("retention_lease_lost", holder=self.holder)
        except _Untrusted:
            result = "lease_untrusted"
        except StorageError as exc:
            result = "failed"
            logs.warn("retention_batch_failed", error=str(exc))
        summary = {"started_at_us": started_us, "finished_at_us": self.clock.now_us(),
                   "holder": self.holder, "result": result,
                   "work_cutoff_us": cut.work_us, "facts_cutoff_us": cut.facts_us,
                   "tables": tables}
        return summary, result


class _Untrusted(Exception):
    """The lease is older than we trust without a renewal: end the pass politely."""
