"""One replica: the supervisor of every service in the process.

Theory of operation
-------------------
The service tree, each started with ``nursery.start`` so that "started" means
ready::

    Replica.run
    |- admin HTTP server (the console, /metrics, /healthz, /readyz)
    |- service API (/v1/, when [[runtimes]] are configured)
    |- webhook ingress (POST /hooks/{route}, when [[webhook_routes]] are configured;
    |  its spool forwarder and materializer run with the family services)
    |  (all bound first: a port in use fails at once; /readyz says "not ready"
    |  while the start-up waits for the database, checks the schema and claims
    |  the replica id, see daemon/core/replica_identity.py)
    |- heartbeat (replicas table: seen, running/draining)
    |- depth sampler (one bounded query per interval feeds the depth gauges)
    |- pruner (retention; one replica at a time by a database lease)
    '- work
       |- completer (batched fenced finalization)
       |- family services (the effect checkpoint batcher)
       |- lease keeper (renewals; stops work whose lease is lost or untrusted)
       '- worker pool (handler tasks)
          '- schedulers, one per family (claim loops)

Drain (SIGTERM/SIGINT, or :meth:`Replica.request_drain`): cancel the
schedulers' scope so that nothing new is claimed; let in-flight handlers
finish until ``replica.drain_timeout``; then stop the rest, which release
their items (fenced) back to ``retry``; flush the completer; report
``stopped``; return. Shutdown is cancel scopes and deadlines, not flags.

The drain is bounded whatever the database does: from the signal on, the
database adapter gives up on shielded COMMITs at ``drain_timeout +
DRAIN_MARGIN_S`` and a watchdog cancels everything at that moment. Items whose
release or finalization had not been committed by then are logged
(``replica_drain_abandoned``) and left to lease expiry, which is safe: the
fence refuses any late write and another replica reclaims them. That, or a
second signal (:meth:`Replica.force_stop`), is a *forced stop*, which the CLI
reports with its own exit code.
"""

from __future__ import annotations

import collections.abc
import functools
import json
import os
import socket
from collections.abc import Callable
from typing import Any

import attrs
import trio
from quart_trio import QuartTrio

from config.settings import Settings
from daemon.core.replica_identity import Holder, Judgement, Verdict, judge, rejudge
from daemon.services import legacy_projector, logs, sdnotify
from daemon.services.activity_log import run_activity_summaries
from daemon.services.claim_peers import ClaimPeers
from daemon.services.clock import Clock
from daemon.services.completer import Completer
from daemon.services.effect_quota import LOST_SLOT_EVENTS, return_lost_slots
from daemon.services.families import FamilyRegistry
from daemon.services.http_guard import EarlyRefusalGuard
from daemon.services.http_server import serve_app
from daemon.services.lease_keeper import LeaseKeeper
from daemon.services.metrics import Metrics
from daemon.services.pressure_history import run_pressure_sampler
from daemon.services.quota_gauges import sample_quota
from daemon.services.retention import Pruner
from daemon.services.scheduler import Scheduler
from daemon.services.worker_pool import WorkerPool
from storage.flow import FlowSample
from storage.migrate import check_schema
from storage.open import wait_until_reachable
from storage.port import OutcomeCount, QueueDepth, ReplicaInfo, StorageError
from storage.work_store import WorkStore

VERSION = "0.1.0"
# After drain_timeout, this long to commit releases and finalizations; then stop
# regardless (what is left goes to lease expiry). Documented in docs/operations.md.
DRAIN_MARGIN_S = 2.0
# A previous holder of our replica id is gone once it missed this many heartbeats.
IDENTITY_LAPSE_HEARTBEATS = 3
# The live claimants are read this many times a heartbeat interval (1 s at the default
# 5 s): a replica that joins is counted before the next burst of work, usually.
CLAIM_PEER_READS_PER_HEARTBEAT = 5


class ReplicaIdInUse(Exception):
    """Another live process holds this replica id (one line; exit 2)."""


def default_replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@attrs.frozen
class HistoryPoint:
    """One depth sample, and what finished (cluster-wide) since the previous one."""

    at_us: int
    interval_s: float
    depths: tuple[QueueDepth, ...]
    finished: tuple[OutcomeCount, ...]
    flow: FlowSample = attrs.field(factory=FlowSample)  # the effect path, same interval
    # WorkItems this replica claimed over the same interval (its own counter's increase):
    # the console's "Claims / s" reads it over the throughput window.
    claims: int = 0


HISTORY_POINTS = 720  # one hour at the default 5 s sample interval


@attrs.frozen
class MetricSample:
    """One sample of this replica's metrics: name, labels, value."""

    name: str
    labels: dict[str, str]
    value: float


@attrs.define(eq=False)
class Replica:
    settings: Settings
    store: WorkStore
    registry: FamilyRegistry
    clock: Clock
    metrics: Metrics = attrs.field(factory=Metrics)
    replica_id: str = attrs.field(factory=default_replica_id)
    admin_address: str | None = None
    # Builds the admin listener's app (console, /metrics, /healthz, /readyz) for this
    # replica; the CLI passes the console's. None: no admin listener (work-loop tests).
    admin_app: Callable[[Replica], QuartTrio] | None = None
    # The service API (/v1/) for the Runtime, served on [api] listen when set.
    api_app: QuartTrio | None = None
    api_address: str | None = None
    # The webhook ingress app (POST /hooks/{route}), served on [ingress] listen when set.
    # Bound before the database is awaited: a delivery is spooled while it is down.
    ingress_app: Any = None
    ingress_address: str | None = None
    schedulers: dict[str, Scheduler] = attrs.field(factory=dict)
    pool: WorkerPool | None = None
    pruner: Pruner | None = None
    history: collections.deque[HistoryPoint] = attrs.field(
        factory=lambda: collections.deque(maxlen=HISTORY_POINTS)
    )
    # Run once the database answers and the schema is checked, before the replica id is
    # claimed (e.g. the CLI's check that the configured Catalog revision is published).
    startup_checks: tuple[collections.abc.Callable[[], collections.abc.Awaitable[None]], ...] = ()
    # Told the hard deadline of a drain or a forced stop (trio time), beside the database:
    # work shielded from cancellation (an unfinished token refresh) must not outlive it.
    abandon_hooks: tuple[collections.abc.Callable[[float], None], ...] = ()
    # Why the process stopped without a clean drain (None: it did not).
    forced_stop: str | None = None
    _drain: trio.Event = attrs.field(factory=trio.Event)
    _state: str = "starting"
    _services: trio.CancelScope | None = None
    _startup: trio.CancelScope | None = None
    # False while a claim may still be waiting for its COMMIT during a drain.
    _claims_settled: bool = True
    # COMMITs of unknown outcome before the drain began (more after it: leases may be held).
    _unknown_before_drain: int = 0
    _last_db_ok: float = 0.0
    _started_at_us: int = 0
    # The live claimants of each family (advice for where claims start).
    claim_peers: ClaimPeers = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        interval = self.settings.replica.heartbeat_interval
        self.claim_peers = ClaimPeers(
            self.store, self.clock, lambda: self.replica_id, live_for_s=2 * interval,
            interval_s=max(0.2, interval / CLAIM_PEER_READS_PER_HEARTBEAT))

    # --------------------------------------------------------------- public

    def request_drain(self) -> None:
        """Stop claiming and drain; ``run`` returns when done.

        While still starting (waiting for the database) there is nothing to
        drain: the start-up is abandoned and ``run`` returns."""
        self._drain.set()
        if self._state == "starting" and self._startup is not None:
            self._startup.cancel()

    def force_stop(self, reason: str) -> None:
        """Stop at once (second signal): nothing more is waited for, not even the
        database; unfinished leases are left to expire."""
        self.forced_stop = reason
        self._abandon_database(trio.current_time())
        pool = self.pool
        logs.warn("replica_forced_stop", replica=self.replica_id, reason=reason,
                  abandoned=len(pool.flights) if pool is not None else 0)
        if self._services is not None:
            self._services.cancel()

    @property
    def state(self) -> str:
        return self._state

    def metrics_text(self) -> bytes:
        return self.metrics.render()

    def readiness(self) -> tuple[bool, dict[str, object]]:
        db_fresh = trio.current_time() - self._last_db_ok < max(
            15.0, 3 * self.settings.replica.heartbeat_interval
        )
        claims_ok = all(s.db_ok for s in self.schedulers.values())
        ready = self._state == "running" and db_fresh and claims_ok
        return ready, {
            "state": self._state,
            "database": "ok" if db_fresh and claims_ok else "unreachable",
            "replica": self.replica_id,
        }

    def wake(self, family: str) -> None:
        """Local wake-up: new work of ``family`` was enqueued in this process."""
        scheduler = self.schedulers.get(family)
        if scheduler is not None:
            scheduler.wake()

    # ----------------------------------------------------------------- run

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        self._started_at_us = self.clock.now_us()
        self.metrics.attach_db(self.store.db.backend, self.store.db.stats)
        async with trio.open_nursery() as services:
            if self.admin_app is not None:
                self.admin_address = await services.start(
                    functools.partial(serve_app,
                                      keep_alive_timeout_s=self.settings.admin.keep_alive),
                    self.admin_app(self), self.settings.admin.listen
                )
            if self.api_app is not None:
                self.api_address = await services.start(
                    functools.partial(serve_app,
                                      keep_alive_timeout_s=self.settings.api.keep_alive),
                    self.api_app, self.settings.api.listen
                )
            if self.ingress_app is not None:
                ingress = self.settings.ingress
                self.ingress_address = await services.start(
                    functools.partial(serve_app, name="ingress",
                                      max_header_bytes=ingress.max_header_bytes,
                                      keep_alive_timeout_s=ingress.request_deadline),
                    # An early refusal (404/405/415/413 before the body is read) never
                    # stalls a kept-alive connection (daemon/services/http_guard.py).
                    EarlyRefusalGuard(self.ingress_app, ingress.max_body_bytes),
                    ingress.listen,
                )

            # Start-up: listeners are bound (a port in use has failed by now) and
            # /readyz answers "not ready" while we wait for the database.
            self._services = services.cancel_scope
            with trio.CancelScope() as self._startup:
                await self._wait_for_database()
                await check_schema(self.store.db, self.store.dialect)
                for check in self.startup_checks:
                    await check()
                await self._claim_identity()
            if self._startup.cancelled_caught:
                logs.event("replica_stopped_before_start", replica=self.replica_id)
                self._state = "stopped"
                services.cancel_scope.cancel()
                return
            await services.start(self._heartbeat_loop)
            await services.start(self.claim_peers.run)
            await services.start(self._depth_loop)
            await services.start(run_pressure_sampler, self.store, self.clock, self.metrics,
                                 self.replica_id)
            await services.start(run_activity_summaries, self.metrics, self.replica_id)
            await services.start(legacy_projector.run, self.store, self.clock)
            if self.settings.retention.enabled:
                self.pruner = Pruner(self.store, self.settings.retention, self.clock,
                                     self.metrics, self.replica_id,
                                     ingress_days=self.settings.ingress.retention_days)
                await services.start(self.pruner.run)
            logs.event(
                "replica_started",
                replica=self.replica_id,
                admin=self.admin_address,
                api=self.api_address,
                ingress=self.ingress_address,
                backend=self.store.db.backend,
                families=",".join(self.registry.names()),
            )
            await self._run_work(task_status, services)
            if self._unknown_during_drain():
                self._report_abandoned("unknown_commit", [])
            self._state = "stopped"
            self.metrics.draining.set(0)
            await self._heartbeat_once()
            services.cancel_scope.cancel()
        self._state = "stopped"
        logs.event("replica_stopped", replica=self.replica_id, forced=self.forced_stop or "no")

    # ------------------------------------------------------------ start-up

    async def _wait_for_database(self) -> None:
        timeout = self.settings.storage.startup_timeout

        def retry(tries: int, delay_s: float, error: str) -> None:
            logs.warn("database_waiting", replica=self.replica_id, attempt=tries,
                      retry_in_s=round(delay_s, 2), within_s=timeout, error=error)

        tries = await wait_until_reachable(self.store, timeout_s=timeout, on_retry=retry)
        self._last_db_ok = trio.current_time()
        if tries > 1:
            logs.event("database_reachable", replica=self.replica_id, attempts=tries)

    async def _read_holder(self) -> Holder | None:
        for info in await self.store.replica_list(0):
            if info.replica_id == self.replica_id:
                return Holder(info.hostname, info.pid, info.state, info.started_at_us,
                              info.heartbeat_at_us)
        return None

    async def _claim_identity(self) -> None:
        """Refuse to run beside a live process with our replica id; take over from a
        crashed one (at once when provably gone, else once its heartbeat lapsed)."""
        interval = self.settings.replica.heartbeat_interval
        hostname = socket.gethostname()
        holder = await self._read_holder()
        alive = _pid_alive(holder.pid) if holder is not None and holder.hostname == hostname \
            else None
        now_us = self.clock.now_us()
        verdict = judge(holder, hostname=hostname, pid=os.getpid(), now_us=now_us,
                        lapse_us=int(IDENTITY_LAPSE_HEARTBEATS * interval * 1e6),
                        pid_alive=alive)
        if verdict.verdict is Verdict.WATCH and holder is not None:
            # Watch for at least two of its heartbeats whatever the clocks say.
            lapse_at = max(verdict.lapse_at_us, now_us + int(2 * interval * 1e6))
            logs.warn("replica_id_watch", replica=self.replica_id, holder_host=holder.hostname,
                      holder_pid=holder.pid, until_s=round((lapse_at - now_us) / 1e6, 1))
            verdict = Judgement(Verdict.WATCH, verdict.reason, lapse_at)
            while verdict.verdict is Verdict.WATCH:
                await trio.sleep(min(0.5, interval / 2))
                verdict = rejudge(holder, await self._read_holder(), now_us=self.clock.now_us(),
                                  lapse_at_us=verdict.lapse_at_us)
        if verdict.verdict is Verdict.REFUSE:
            assert holder is not None
            raise ReplicaIdInUse(
                f"replica id {self.replica_id!r} is in use by a live process"
                f" ({holder.hostname} pid {holder.pid}): give each replica its own replica.id"
            )
        if holder is not None:
            logs.event("replica_id_taken_over", replica=self.replica_id, reason=verdict.reason,
                       previous_host=holder.hostname, previous_pid=holder.pid)
        await self._heartbeat_once()  # mark the id ours before starting work

    # --------------------------------------------------------------- drain

    def _abandon_database(self, deadline: float) -> None:
        abandon = getattr(self.store.db, "abandon_at", None)
        if abandon is not None:
            abandon(deadline)
        for hook in self.abandon_hooks:
            hook(deadline)

    async def _drain_watchdog(self, deadline: float) -> None:
        """At the drain's hard deadline: log what is left to lease expiry and stop."""
        await trio.sleep_until(deadline)
        pool = self.pool
        unfinished = sorted(pool.flights) if pool is not None else []
        if unfinished or not self._claims_settled or self._unknown_during_drain():
            self._report_abandoned("drain_deadline", unfinished)
        else:
            logs.warn("replica_stop_unrecorded", replica=self.replica_id,
                      reason="database did not answer before the drain deadline")
        if self._services is not None:
            self._services.cancel()

    def _unknown_during_drain(self) -> int:
        return self.store.db.stats.unknown_commits - self._unknown_before_drain

    def _report_abandoned(self, reason: str, unfinished: list[str]) -> None:
        """Leases we hold, or may hold (a claim or release whose COMMIT went unanswered),
        are left to expire: a forced stop."""
        self.forced_stop = reason
        logs.warn("replica_drain_abandoned", replica=self.replica_id,
                  leases=len(unfinished), work_ids=",".join(unfinished[:20]),
                  claim_unsettled=not self._claims_settled,
                  unknown_commits=self._unknown_during_drain(), left_to="lease expiry")

    async def _run_work(self, task_status: trio.TaskStatus[str], services: trio.Nursery) -> None:
        s = self.settings
        completer = Completer(self.store, self.clock, self.metrics, self.replica_id,
                              backoff_cap_s=s.work.db_backoff_cap,
                              linger_s=s.work.finalize_linger)
        pool = WorkerPool(
            store=self.store,
            registry=self.registry,
            clock=self.clock,
            metrics=self.metrics,
            completer=completer,
            replica_id=self.replica_id,
            lease_margin_s=s.work.lease_margin,
            global_limit=s.work.concurrency,
            wake=self.wake,
        )
        self.pool = pool
        completer.handlers_running = lambda: len(pool.flights)
        min_ttl = min((f.settings.lease_ttl for f in self.registry.families.values()), default=30)
        keeper = LeaseKeeper(
            self.store, pool, self.clock, self.metrics, s.work.lease_margin,
            tick_s=max(0.05, min_ttl / 6),
        )
        async with trio.open_nursery() as work:
            await work.start(completer.run)
            for service in self.registry.services:
                await work.start(service)
            await work.start(keeper.run)
            await work.start(pool.run)
            async with trio.open_nursery() as claiming:
                for family in self.registry.families.values():
                    scheduler = Scheduler(
                        family=family,
                        store=self.store,
                        pool=pool,
                        clock=self.clock,
                        metrics=self.metrics,
                        owner=self.replica_id,
                        poll_interval_s=s.work.poll_interval,
                        reclaim_interval_s=s.work.reclaim_interval,
                        db_backoff_cap_s=s.work.db_backoff_cap,
                        peers=self.claim_peers,
                    )
                    self.schedulers[family.name] = scheduler
                    await claiming.start(scheduler.run)
                self._state = "running"
                await self._heartbeat_once()
                sdnotify.notify("READY=1\nSTATUS=running")
                task_status.started(self.admin_address or "")
                await self._drain.wait()
                self._claims_settled = False
                self._unknown_before_drain = self.store.db.stats.unknown_commits
                soft = trio.current_time() + s.replica.drain_timeout
                hard = soft + DRAIN_MARGIN_S
                self._abandon_database(hard)
                services.start_soon(self._drain_watchdog, hard)
                self._state = "draining"
                self.metrics.draining.set(1)
                sdnotify.notify("STOPPING=1\nSTATUS=draining")
                logs.event("replica_draining", replica=self.replica_id,
                           in_flight=len(pool.flights), drain_timeout=s.replica.drain_timeout,
                           margin_s=DRAIN_MARGIN_S)
                claiming.cancel_scope.cancel()  # (this block's own awaits end here too)
            self._claims_settled = True
            with trio.move_on_at(soft):
                await self._heartbeat_once()
            with trio.move_on_at(soft):
                await pool.wait_idle()
            if pool.flights:
                logs.warn("replica_drain_deadline", replica=self.replica_id,
                          releasing=len(pool.flights))
                pool.stop_all("drain")
                await pool.wait_idle()
            work.cancel_scope.cancel()

    # ------------------------------------------------------------ periodic

    async def _heartbeat_once(self) -> None:
        info = ReplicaInfo(
            replica_id=self.replica_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            version=VERSION,
            state=self._state,
            families=json.dumps(self.registry.names()),
            started_at_us=self._started_at_us,
            heartbeat_at_us=self.clock.now_us(),
        )
        try:
            with trio.move_on_after(10):
                await self.store.replica_heartbeat(info)
                self._last_db_ok = trio.current_time()
        except StorageError as exc:
            self.metrics.db_errors.labels("heartbeat").inc()
            logs.warn("replica_heartbeat_failed", error=str(exc))

    async def _heartbeat_loop(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        watchdog = sdnotify.watchdog_interval_s()
        interval = self.settings.replica.heartbeat_interval
        if watchdog is not None:
            interval = min(interval, watchdog)
        while True:
            await trio.sleep(interval)
            await self._heartbeat_once()
            if watchdog is not None:
                sdnotify.notify("WATCHDOG=1")

    async def _depth_loop(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        previous_us = self.clock.now_us()
        previous_claims = self.metrics.claimed_total()
        while True:
            try:
                now_us = self.clock.now_us()
                claims = self.metrics.claimed_total()
                depths = await self.store.work_depths()
                finished = await self.store.work_outcome_counts(previous_us, now_us)
                flow = await self.store.flow_sample(previous_us, now_us)
                self.metrics.set_depths(depths, now_us)
                self.metrics.effect_unknown_backlog.set(await self.store.effect_unknown_backlog())
                self.metrics.set_grant_reasons(
                    await self.store.grant_reauthorization_counts())
                if self.metrics.quota_declared:
                    # Lost claims' slots first: what comes back shows in this sample.
                    for lost in await return_lost_slots(
                            self.store, self.metrics.quota_declared, now_us=now_us,
                            clock_spread_us=self.settings.work.clock_spread_us):
                        self.metrics.count_quota(LOST_SLOT_EVENTS[lost.decision])
                    self.metrics.set_quota(await sample_quota(
                        self.store, self.metrics.quota_declared, now_us), now_us)
                self.history.append(
                    HistoryPoint(now_us, (now_us - previous_us) / 1_000_000, tuple(depths),
                                 tuple(finished), flow, claims - previous_claims)
                )
                previous_us, previous_claims = now_us, claims
                self._last_db_ok = trio.current_time()
            except StorageError as exc:
                self.metrics.db_errors.labels("depth_sample").inc()
                logs.warn("work_depth_sample_failed", error=str(exc))
            await trio.sleep(self.settings.work.depth_sample_interval)

    # ------------------------------------------------------ admin console

    def counter_samples(self, prefix: str = "integrationd_work_") -> list[MetricSample]:
        """This replica's metric samples (counters and gauges) whose name starts with
        ``prefix``, read from its registry without rendering text (the console's overview)."""
        out: list[MetricSample] = []
        for family in self.metrics.registry.collect():
            for sample in family.samples:
                if sample.name.startswith(prefix) and not sample.name.endswith("_created"):
                    out.append(MetricSample(sample.name, dict(sample.labels), sample.value))
        return out


def _pid_alive(pid: int) -> bool | None:
    """Whether ``pid`` runs on this host (``None``: cannot tell)."""
    if pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    except OSError:
        return None
    return True
