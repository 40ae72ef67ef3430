"""One metrics model for every work family (Prometheus).

Names are in base units with ``_total`` counters; labels are low-cardinality
(family, state, outcome, backend): never an org, item or lease id. Queue depth
gauges come from the depth sampler (one bounded query per interval), never
from a query per scrape.

The client's ``*_created`` series (one per labelled counter and histogram,
holding the Unix time it was first touched) are switched off for the whole
process: they double the series count and no dashboard or alert reads them.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from importlib import metadata
from typing import TYPE_CHECKING

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from daemon.core.grant_reasons import REASONS
from daemon.core.ingress import QUARANTINE_REASONS, UNSETTLED_REASONS
from daemon.core.quota import ResetIgnored
from daemon.services.clock import wall_seconds
from storage.port import DbStats, QueueDepth
from storage.retention.rules import pruned_tables

if TYPE_CHECKING:
    from daemon.services.effect_quota import QuotaKey
    from daemon.services.quota_gauges import QuotaSample

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

disable_created_metrics()  # type: ignore[no-untyped-call]

# Result labels of integrationd_command_admissions_total, by (stored admission, whether
# this request created the fact).
_ADMISSION_RESULTS = {
    ("COMMAND_ACCEPTED", True): "accepted",
    ("COMMAND_ACCEPTED", False): "already_accepted",
    ("HANDOFF_REJECTED", True): "rejected",
    ("HANDOFF_REJECTED", False): "already_rejected",
    ("QUARANTINED", True): "quarantined",
    ("QUARANTINED", False): "quarantined",
}
ADMISSION_REQUESTS = ("command", "reject")
# Result labels of integrationd_receipt_deliveries_total (a fixed set).
RECEIPT_RESULTS = ("confirmed", "already_confirmed", "missing", "not_configured",
                   "unreachable", "unauthorized", "not_found", "conflict", "format_refused",
                   "http_error")

RETENTION_RESULTS = ("done", "busy", "failed", "lease_lost", "lease_untrusted")


# Pre-created label values (the alert rules read them before the first event).
CREDENTIAL_ALERT_REASONS = ("needs_reauthorization", "token_bundle_unauthentic")
# Label values of integrationd_grants_needing_reauthorization (a fixed set).
GRANT_REASON_LABELS = (*sorted(REASONS), "unrecorded")
QUOTA_EVENTS = ("reserved", "waited", "throttled", "given_back", "corrected", "exhausted",
                "lost_refunded", "lost_spent")
# Why a provider's reset header was not used (daemon/core/quota.py's ResetIgnored).
QUOTA_RESET_IGNORED = tuple(r.value for r in ResetIgnored)
# Result labels of integrationd_ingress_deliveries_total (answered 200) and reasons of
# integrationd_ingress_rejections_total (answered otherwise, before a durable receipt).
INGRESS_RESULTS = ("stored", "duplicate", "spooled")
# Labels of integrationd_db_batch_splits_total: the group-committed writes.
BATCHED_WRITES = ("ingress_receipt", "ingress_settle", "effect_checkpoint", "effect_context",
                  "receipt_fence")

INGRESS_REJECTIONS = ("unknown_route", "method", "content_type", "too_large", "deadline",
                      "missing_signature", "bad_signature", "missing_timestamp",
                      "bad_timestamp", "stale_timestamp", "no_secret", "retired_secret",
                      "spool_full", "disconnected", "too_large_to_store")


def admission_result(admission: str, created: bool) -> str:
    """The ``result`` label for one answered admission request."""
    return _ADMISSION_RESULTS[(admission, created)]


def receipt_result(status: int) -> str:
    """The ``result`` label for a receipt delivery the Runtime answered with ``status``."""
    if status == 200:
        return "confirmed"
    if status in (401, 403):
        return "unauthorized"
    return {404: "not_found", 409: "conflict", 422: "format_refused"}.get(status, "http_error")


def build_version() -> str:
    try:
        return metadata.version("integrationd")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


class _DbStatsCollector(Collector):
    def __init__(self, backend: str, stats: DbStats) -> None:
        self._backend = backend
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        count = CounterMetricFamily("integrationd_db_transactions",
                                    "Transactions run, by operation", labels=["backend", "name"])
        seconds = CounterMetricFamily("integrationd_db_transaction_seconds",
                                      "Time in transactions (with retries and pool waits),"
                                      " by operation", labels=["backend", "name"])
        for name, (n, total) in sorted(self._stats.durations.items()):
            count.add_metric([self._backend, name], n)
            seconds.add_metric([self._backend, name], total)
        yield count
        yield seconds
        wait = CounterMetricFamily("integrationd_db_connection_wait_seconds",
                                   "Time spent waiting for a database connection",
                                   labels=["backend"])
        wait.add_metric([self._backend], self._stats.wait_seconds)
        yield wait
        for name, doc, value in (
            ("integrationd_db_statements", "SQL statements sent", self._stats.statements),
            ("integrationd_db_commits", "Transactions committed", self._stats.commits),
            ("integrationd_db_rollbacks", "Transactions rolled back", self._stats.rollbacks),
            (
                "integrationd_db_transaction_retries",
                "Whole-transaction retries after deadlock/conflict/busy",
                self._stats.retries,
            ),
            (
                "integrationd_db_unknown_commits",
                "COMMITs whose outcome was unknown (reconciled by reading)",
                self._stats.unknown_commits,
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=["backend"])
            family.add_metric([self._backend], value)
            yield family


class Metrics:
    """The replica's metrics, in its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.claimed = Counter(
            "integrationd_work_claimed", "WorkItems claimed", ["family"], registry=r
        )
        self.claim_contention = Counter(
            "integrationd_work_claim_contention",
            "Candidates another replica claimed first",
            ["family"],
            registry=r,
        )
        self.finalized = Counter(
            "integrationd_work_finalized",
            "WorkItems finalized by this replica, by resulting state",
            ["family", "outcome"],
            registry=r,
        )
        self.lease_lost = Counter(
            "integrationd_work_lease_lost",
            "Claims that lost their lease (stale claimant stopped)",
            ["family"],
            registry=r,
        )
        self.reclaimed = Counter(
            "integrationd_work_reclaimed",
            "Expired leases this replica superseded (journaled as lease_lost executions)",
            ["family"],
            registry=r,
        )
        self.expired_dead = Counter(
            "integrationd_work_expired_dead",
            "Expired leases whose attempts were spent, moved to dead",
            ["family"],
            registry=r,
        )
        self.execution_seconds = Histogram(
            "integrationd_work_execution_seconds",
            "Handler run time",
            ["family"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 30, 120),
            registry=r,
        )
        self.in_flight = Gauge(
            "integrationd_work_in_flight", "Handlers running now", ["family"], registry=r
        )
        self.queue_depth = Gauge(
            "integrationd_work_queue_depth",
            "WorkItems per family and state (sampled)",
            ["family", "state"],
            registry=r,
        )
        self.oldest_age = Gauge(
            "integrationd_work_oldest_age_seconds",
            "Age of the oldest run_after per family and state (sampled)",
            ["family", "state"],
            registry=r,
        )
        self.depth_sampled_at = Gauge(
            "integrationd_work_depth_sample_timestamp_seconds",
            "When the depth gauges were last sampled",
            registry=r,
        )
        self.db_errors = Counter(
            "integrationd_db_errors",
            "Database operations that failed (unreachable, retries exhausted)",
            ["operation"],
            registry=r,
        )
        self.batch_splits = Counter(
            "integrationd_db_batch_splits",
            "Batched writes split after failing with an error of their own statements (a"
            " row larger than the database takes in one statement, a value it refuses):"
            " each half is written again, and the row at fault alone fails",
            ["write"],
            registry=r,
        )
        for write in BATCHED_WRITES:
            self.batch_splits.labels(write)
        self.effect_attempts = Counter(
            "integrationd_effect_attempts",
            "External calls made through DoOnce, by L1 operation and outcome class",
            ["operation", "outcome"],
            registry=r,
        )
        self.effect_unknown_backlog = Gauge(
            "integrationd_effect_outcome_unknown_backlog",
            "Effect attempts awaiting a disposition: OUTCOME_UNKNOWN, or left with no"
            " outcome after their dispatch checkpoint (sampled, cluster-wide; each kind"
            " counted up to 1,000)",
            registry=r,
        )
        self.build_info = Gauge(
            "integrationd_build_info",
            "Always 1; the labels say which build runs",
            ["version", "python"],
            registry=r,
        )
        self.build_info.labels(build_version(), platform.python_version()).set(1)
        self.command_admissions = Counter(
            "integrationd_command_admissions",
            "Runtime handoff requests answered by this replica, by request and result",
            ["request", "result"],
            registry=r,
        )
        for request in ADMISSION_REQUESTS:
            for result in sorted(set(_ADMISSION_RESULTS.values())):
                self.command_admissions.labels(request, result)
        self.receipt_deliveries = Counter(
            "integrationd_receipt_deliveries",
            "Result receipts this replica tried to deliver to the Runtime, by result",
            ["result"],
            registry=r,
        )
        for result in RECEIPT_RESULTS:
            self.receipt_deliveries.labels(result)
        self.inbound_changes = Counter(
            "integrationd_inbound_changes",
            "inbound_apply claims finished by this replica, by origin (webhook, reconcile,"
            " repair) and result (done, retry, or the fail-closed code)",
            ["origin", "result"],
            registry=r,
        )
        self.inbound_lost_webhooks = Counter(
            "integrationd_inbound_lost_webhooks",
            "Record versions reconciliation found that no webhook delivered",
            ["provider", "resource"],
            registry=r,
        )
        self.sync_lag = Gauge(
            "integrationd_sync_lag_seconds",
            "Seconds since the time a reconciliation stream is known complete through"
            " (its last incremental run here offered every change up to then)",
            ["stream"],
            registry=r,
        )
        self.subscriptions = Gauge(
            "integrationd_subscriptions",
            "Observed webhook subscriptions by binding and health (active, disabled,"
            " missing), as the last subscription reconciliation run here found them",
            ["binding", "health"],
            registry=r,
        )
        self.previous_secret_accepted = Gauge(
            "integrationd_webhook_previous_secret_accepted",
            "1 while a webhook route's configured previous secret is still accepted by the"
            " verifier, 0 once it retired itself (the database's state, as this replica"
            " last read it)",
            ["route"],
            registry=r,
        )
        self.subscription_reconcile_age = Gauge(
            "integrationd_subscription_reconcile_age_seconds",
            "Seconds since a binding's webhook subscriptions were last reconciled here",
            ["binding"],
            registry=r,
        )
        self.reconcile_offered = Counter(
            "integrationd_reconcile_offered",
            "Listed records cursor reconciliation offered to the inbound Flow (re-listed"
            " ones included: their dedupe key makes them no-ops)",
            ["stream"],
            registry=r,
        )
        self.draining = Gauge(
            "integrationd_replica_draining", "1 while this replica drains", registry=r
        )
        self.credential_failures = Counter(
            "integrationd_effect_credential_failures",
            "Effects that found no usable access token, by stable reason"
            " (needs_reauthorization, no_grant, refresh_timeout, ...)",
            ["reason"],
            registry=r,
        )
        for reason in CREDENTIAL_ALERT_REASONS:
            self.credential_failures.labels(reason)
        self.grants_needing_reauthorization = Gauge(
            "integrationd_grants_needing_reauthorization",
            "Bindings whose current grant needs re-authorization, by the stable reason the"
            " grant row records (daemon/core/grant_reasons.py; unrecorded: marked before"
            " reasons were kept)",
            ["reason"], registry=r)
        for reason in GRANT_REASON_LABELS:
            self.grants_needing_reauthorization.labels(reason).set(0)
        self.quota_events = Counter(
            "integrationd_quota_events",
            "Provider quota before dispatch, by event: reserved (slots bound to a claim),"
            " waited (work rescheduled until the budget allows), throttled (a provider 429"
            " moved the shared budget), given_back (slots that provably never left),"
            " corrected (a provider's remaining count moved the shared budget forward),"
            " exhausted (a 2xx said none remain: the key blocked until the provider's reset),"
            " lost_refunded / lost_spent (a lost claim's reserved slot, settled by the quota"
            " sweep once its window passed: released, or spent as its request may have left)",
            ["event"],
            registry=r,
        )
        for event in QUOTA_EVENTS:
            self.quota_events.labels(event)
        self.quota_reset_ignored = Counter(
            "integrationd_quota_reset_ignored",
            "Provider reset-header values not used, by reason: malformed, negative, past"
            " (an epoch time already gone), beyond_cap (further than the window could reset)",
            ["reason"],
            registry=r,
        )
        for reason in QUOTA_RESET_IGNORED:
            self.quota_reset_ignored.labels(reason)
        # Per quota key (sampled by the depth loop; daemon/services/quota_gauges.py).
        self.quota_budget = Gauge(
            "integrationd_quota_budget",
            "Send slots a grant could start now on each quota key (0: saturated or blocked)",
            ["quota_key"], registry=r)
        self.quota_limit = Gauge(
            "integrationd_quota_limit",
            "The provider limit of each quota key (requests per its window)",
            ["quota_key"], registry=r)
        self.quota_in_flight = Gauge(
            "integrationd_quota_reservations_in_flight",
            "Slots reserved for a claim and not yet sent, released or spent, per quota key",
            ["quota_key"], registry=r)
        self.quota_waiting = Gauge(
            "integrationd_quota_waiting_work",
            "Work items rescheduled until their quota key has a slot (quota_wait; counted"
            " up to 10,000)",
            ["quota_key"], registry=r)
        self.quota_last_throttled = Gauge(
            "integrationd_quota_last_throttled_timestamp_seconds",
            "When a provider last answered 429 on each quota key (0: never)",
            ["quota_key"], registry=r)
        self.quota_blocked_until = Gauge(
            "integrationd_quota_blocked_until_timestamp_seconds",
            "Until when a provider 429 (or a 2xx saying none remain) blocks each quota key for"
            " every replica (0: never)",
            ["quota_key"], registry=r)
        self.quota_sampled_at = Gauge(
            "integrationd_quota_sample_timestamp_seconds",
            "When the quota gauges were last sampled", registry=r)
        # The keys this replica's Catalog can count against (set when it is assembled).
        self.quota_declared: dict[str, QuotaKey] = {}
        self.retention_pruned = Counter(
            "integrationd_retention_pruned_rows",
            "Rows the retention pruner deleted in this replica, by table",
            ["table"],
            registry=r,
        )
        self.retention_lag = Gauge(
            "integrationd_retention_lag_seconds",
            "How far past its retention the oldest prunable row of each table was when this"
            " replica's last pass reached the table (0: caught up)",
            ["table"],
            registry=r,
        )
        self.retention_passes = Counter(
            "integrationd_retention_passes",
            "Retention passes this replica tried, by result (busy: another replica held the"
            " lease)",
            ["result"],
            registry=r,
        )
        for table in pruned_tables():
            self.retention_pruned.labels(table)
            self.retention_lag.labels(table)
        for result in RETENTION_RESULTS:
            self.retention_passes.labels(result)
        self._depth_keys: set[tuple[str, str]] = set()
        self._ingress(r)

    def claimed_total(self) -> int:
        """WorkItems this replica claimed since it started (every family)."""
        return int(sum(sample.value for metric in self.claimed.collect()
                       for sample in metric.samples if sample.name.endswith("_total")))

    def _ingress(self, r: CollectorRegistry) -> None:
        self.ingress_deliveries = Counter(
            "integrationd_ingress_deliveries",
            "Webhook deliveries this replica answered 200, by how the receipt became durable",
            ["result"],
            registry=r,
        )
        for result in INGRESS_RESULTS:
            self.ingress_deliveries.labels(result)
        self.ingress_rejections = Counter(
            "integrationd_ingress_rejections",
            "Webhook requests refused or timed out before a durable receipt, by reason",
            ["reason"],
            registry=r,
        )
        for reason in INGRESS_REJECTIONS:
            self.ingress_rejections.labels(reason)
        self.ingress_seconds = Histogram(
            "integrationd_ingress_seconds",
            "Time from a webhook request's start to its answer (seconds)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0),
            registry=r,
        )
        self.ingress_spool_depth = Gauge(
            "integrationd_ingress_spool_depth",
            "Receipts in this replica's local spool, not yet forwarded to the database",
            registry=r,
        )
        self.ingress_spool_oldest_received = Gauge(
            "integrationd_ingress_spool_oldest_received_seconds",
            "Unix time the oldest spooled receipt was received (0: the spool is empty)",
            registry=r,
        )
        self.ingress_spool_forwarded = Counter(
            "integrationd_ingress_spool_forwarded",
            "Spooled receipts this replica moved into the database",
            registry=r,
        )
        self.ingress_materialized = Counter(
            "integrationd_ingress_materialized",
            "Receipts this replica settled: materialized into events, or quarantined",
            ["outcome"],
            registry=r,
        )
        for outcome in ("materialized", "quarantined"):
            self.ingress_materialized.labels(outcome)
        self.ingress_quarantined = Counter(
            "integrationd_ingress_quarantined",
            "Receipts this replica quarantined, by stable reason",
            ["reason"],
            registry=r,
        )
        for reason in sorted(QUARANTINE_REASONS):
            self.ingress_quarantined.labels(reason)
        self.ingress_unsettled = Gauge(
            "integrationd_ingress_unsettled",
            "Receipts this replica's materializer tried and could not settle on its latest"
            " pass (they stay received and are tried again), by why",
            ["reason"],
            registry=r,
        )
        for reason in UNSETTLED_REASONS:
            self.ingress_unsettled.labels(reason)
        self.ingress_duplicate_events = Counter(
            "integrationd_ingress_duplicate_events",
            "Events of materialized receipts that an earlier receipt already held (same"
            " route, subscription generation and L1 event identity): not created again",
            registry=r,
        )

    def count_ingress(self, result: str) -> None:
        if result in INGRESS_RESULTS:
            self.ingress_deliveries.labels(result).inc()
        elif result in INGRESS_REJECTIONS:
            self.ingress_rejections.labels(result).inc()
        else:
            raise ValueError(f"unknown ingress result {result!r}")

    def set_spool(self, depth: int, oldest_us: int | None) -> None:
        self.ingress_spool_depth.set(depth)
        self.ingress_spool_oldest_received.set(0 if oldest_us is None else oldest_us / 1e6)

    def count_admission(self, request: str, admission: str, created: bool) -> None:
        """One answered ``/v1/`` admission request (``request``: command or reject)."""
        self.command_admissions.labels(request, admission_result(admission, created)).inc()

    def count_credential_failure(self, reason: str) -> None:
        self.credential_failures.labels(reason).inc()

    def count_quota(self, event: str) -> None:
        if event not in QUOTA_EVENTS:
            raise ValueError(f"unknown quota event {event!r}")
        self.quota_events.labels(event).inc()

    def count_quota_reset_ignored(self, reason: str) -> None:
        if reason not in QUOTA_RESET_IGNORED:
            raise ValueError(f"unknown reset-ignored reason {reason!r}")
        self.quota_reset_ignored.labels(reason).inc()

    def count_receipt(self, result: str) -> None:
        """One receipt delivery, by a :data:`RECEIPT_RESULTS` label."""
        if result not in RECEIPT_RESULTS:
            raise ValueError(f"unknown receipt result {result!r}")
        self.receipt_deliveries.labels(result).inc()

    def count_inbound(self, origin: str, result: str) -> None:
        self.inbound_changes.labels(origin, result).inc()

    def count_lost_webhook(self, provider: str, resource: str) -> None:
        self.inbound_lost_webhooks.labels(provider, resource).inc()

    def set_previous_secret(self, route: str, accepted: bool) -> None:
        self.previous_secret_accepted.labels(route).set(1 if accepted else 0)

    def set_subscriptions(self, binding: str, health: dict[str, int], at_s: float) -> None:
        """One subscription reconciliation run's finding; its age grows at scrape time."""
        for state in ("active", "disabled", "missing"):
            self.subscriptions.labels(binding, state).set(health.get(state, 0))
        self.subscription_reconcile_age.labels(binding).set_function(
            lambda: max(wall_seconds() - at_s, 0.0))

    def set_sync_complete(self, stream: str, through_s: float) -> None:
        """The stream is complete through ``through_s`` (epoch seconds): the lag grows at
        scrape time until the next run moves it, so a stream whose runs stop shows it."""
        self.sync_lag.labels(stream).set_function(
            lambda: max(wall_seconds() - through_s, 0.0))

    def count_reconcile_offered(self, stream: str, count: int) -> None:
        self.reconcile_offered.labels(stream).inc(count)

    def attach_db(self, backend: str, stats: DbStats) -> None:
        self.registry.register(_DbStatsCollector(backend, stats))

    def set_depths(self, depths: list[QueueDepth], now_us: int) -> None:
        seen: set[tuple[str, str]] = set()
        for d in depths:
            key = (d.family, d.state.value)
            seen.add(key)
            self.queue_depth.labels(*key).set(d.count)
            age = 0.0
            if d.oldest_run_after_us is not None:
                age = max(0.0, (now_us - d.oldest_run_after_us) / 1_000_000)
            self.oldest_age.labels(*key).set(age)
        for key in self._depth_keys - seen:
            self.queue_depth.labels(*key).set(0)
            self.oldest_age.labels(*key).set(0)
        self._depth_keys |= seen
        self.depth_sampled_at.set(now_us / 1_000_000)

    def set_grant_reasons(self, counts: dict[str, int]) -> None:
        """One sample of the grants needing re-authorization (every label set: 0 when
        none; a code this build does not know counts as unrecorded)."""
        known = {reason: 0 for reason in GRANT_REASON_LABELS}
        for reason, n in counts.items():
            known[reason if reason in known else "unrecorded"] += n
        for reason, n in known.items():
            self.grants_needing_reauthorization.labels(reason).set(n)

    def set_quota(self, samples: list[QuotaSample], now_us: int) -> None:
        for q in samples:
            self.quota_budget.labels(q.quota_key).set(q.budget)
            self.quota_limit.labels(q.quota_key).set(q.limit)
            self.quota_in_flight.labels(q.quota_key).set(q.in_flight)
            self.quota_waiting.labels(q.quota_key).set(q.waiting)
            self.quota_last_throttled.labels(q.quota_key).set(q.last_throttled_at_us / 1e6)
            self.quota_blocked_until.labels(q.quota_key).set(q.blocked_until_us / 1e6)
        self.quota_sampled_at.set(now_us / 1_000_000)

    def render(self) -> bytes:
        return generate_latest(self.registry)
