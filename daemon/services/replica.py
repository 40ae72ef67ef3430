"""One replica: the supervisor of every service in the process.

Theory of operation
-------------------
The service tree, each started with ``nursery.start`` so that "started" means
ready::

    Replica.run
    |- admin HTTP server (the console, /metrics, /healthz, /readyz)
    |- service API (/v1/, when [[runtimes]] are configured)
    |- heartbeat (replicas table: seen, running/draining)
    |- depth sampler (one bounded query per interval feeds the depth gauges)
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
"""

from __future__ import annotations

import collections
import json
import os
import socket
import time

import attrs
import trio
from quart_trio import QuartTrio

from admin_ui.app import create_app
from admin_ui.extensions import ConsoleExtensions
from config.settings import Settings
from daemon.services import logs, sdnotify
from daemon.services.clock import Clock
from daemon.services.completer import Completer
from daemon.services.families import FamilyRegistry
from daemon.services.http_server import serve_app
from daemon.services.lease_keeper import LeaseKeeper
from daemon.services.metrics import Metrics
from daemon.services.scheduler import Scheduler
from daemon.services.worker_pool import WorkerPool
from storage.flow import FlowSample
from storage.port import OutcomeCount, QueueDepth, ReplicaInfo, StorageError
from storage.work_store import WorkStore

VERSION = "0.1.0"


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
    # Tests of the work loop under trio's MockClock run without the HTTP listener.
    serve_admin: bool = True
    # The service API (/v1/) for the Runtime, served on [api] listen when set.
    api_app: QuartTrio | None = None
    # Console pages and lineage contributed by capabilities (the effect journal).
    console_extensions: ConsoleExtensions | None = None
    api_address: str | None = None
    schedulers: dict[str, Scheduler] = attrs.field(factory=dict)
    pool: WorkerPool | None = None
    history: collections.deque[HistoryPoint] = attrs.field(
        factory=lambda: collections.deque(maxlen=HISTORY_POINTS)
    )
    _drain: trio.Event = attrs.field(factory=trio.Event)
    _state: str = "starting"
    _last_db_ok: float = 0.0
    _started_at_us: int = 0

    # --------------------------------------------------------------- public

    def request_drain(self) -> None:
        """Stop claiming and drain; ``run`` returns when done."""
        self._drain.set()

    @property
    def state(self) -> str:
        return self._state

    def metrics_text(self) -> bytes:
        return self.metrics.render()

    def readiness(self) -> tuple[bool, dict[str, object]]:
        db_fresh = time.monotonic() - self._last_db_ok < max(
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
        await self.store.db.ping()
        self._last_db_ok = time.monotonic()
        async with trio.open_nursery() as services:
            if self.serve_admin:
                self.admin_address = await services.start(
                    serve_app, create_app(self, self.console_extensions),
                    self.settings.admin.listen
                )
            if self.api_app is not None:
                self.api_address = await services.start(
                    serve_app, self.api_app, self.settings.api.listen
                )
            await services.start(self._heartbeat_loop)
            await services.start(self._depth_loop)
            logs.event(
                "replica_started",
                replica=self.replica_id,
                admin=self.admin_address,
                api=self.api_address,
                backend=self.store.db.backend,
                families=",".join(self.registry.names()),
            )
            await self._run_work(task_status)
            self._state = "stopped"
            self.metrics.draining.set(0)
            await self._heartbeat_once()
            services.cancel_scope.cancel()
        logs.event("replica_stopped", replica=self.replica_id)

    async def _run_work(self, task_status: trio.TaskStatus[str]) -> None:
        s = self.settings
        completer = Completer(self.store, self.clock, self.metrics, self.replica_id,
                              backoff_cap_s=s.work.db_backoff_cap)
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
                    )
                    self.schedulers[family.name] = scheduler
                    await claiming.start(scheduler.run)
                self._state = "running"
                await self._heartbeat_once()
                sdnotify.notify("READY=1\nSTATUS=running")
                task_status.started(self.admin_address or "")
                await self._drain.wait()
                self._state = "draining"
                self.metrics.draining.set(1)
                sdnotify.notify("STOPPING=1\nSTATUS=draining")
                logs.event("replica_draining", replica=self.replica_id,
                           in_flight=len(pool.flights))
                await self._heartbeat_once()
                claiming.cancel_scope.cancel()
            with trio.move_on_after(s.replica.drain_timeout):
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
                self._last_db_ok = time.monotonic()
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
        while True:
            try:
                now_us = self.clock.now_us()
                depths = await self.store.work_depths()
                finished = await self.store.work_outcome_counts(previous_us, now_us)
                flow = await self.store.flow_sample(previous_us, now_us)
                self.metrics.set_depths(depths, now_us)
                self.metrics.effect_unknown_backlog.set(await self.store.effect_unknown_backlog())
                self.history.append(
                    HistoryPoint(now_us, (now_us - previous_us) / 1_000_000, tuple(depths),
                                 tuple(finished), flow)
                )
                previous_us = now_us
                self._last_db_ok = time.monotonic()
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
