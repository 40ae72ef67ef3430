"""Torture run (issue 12): replicas killed, frozen and restarted, a database node killed, a
misbehaving provider, while commands, effects, webhooks and noop work flow all the while.

    python -m bench.torture --duration 600            # make torture DURATION=600
    python -m bench.torture --duration 60 --backends sqlite,mysql,galera
    python -m bench.torture --duration 60 --webhook-rate 8    # webhooks per second

For each backend in turn (MariaDB; a 3-node Galera cluster started for the run, replica *i*
on node *i mod 3*; one SQLite file shared by every replica), for ``duration / backends``
seconds of chaos:

* R ``integrationd run`` processes, each serving the /v1 API of its own reference Runtime
  (``bench.effects``' layout), all on one database; Lead title changes flow from every Runtime
  (command accepted -> WorkItem -> PATCH on the HubSpot simulator -> receipt committed in the
  Runtime), and noop WorkItems are enqueued beside them;
* every few seconds one of: SIGKILL a replica and restart it; SIGSTOP a replica past its lease
  (``lease_ttl`` + margin + 1 s) then SIGCONT (the zombie must lose every write); on Galera,
  once, SIGKILL a database node and restart it (it recovers its position, as MariaDB's
  systemd unit does, and rejoins by incremental state transfer);
* the simulator is armed all the while with latency, 5xx, 429 and connection resets before
  and after applying a PATCH;
* signed Outreach webhook deliveries (``--webhook-rate`` per second, default
  ``DEFAULT_RATE`` = 4) go to each replica's own ingress listener in turn, from the Outreach
  simulator's sender (only network failures are redelivered: 3 times, 1 s apart); the
  receipts become ``inbound_apply`` work that changes the first Runtime's Leads through its
  inbound mutations;
* each replica's wall clock is skewed (``bench/skewed_replica.py``): the replicas are
  spread evenly over ``--skew`` (default 0.9) of ``work.lease_margin``, centred on the
  simulators' clock;
* the effects draw on a provider quota the run's copy of the HubSpot L1 definition declares
  (``QUOTA_LIMIT`` PATCHes per ``QUOTA_WINDOW_S`` per app installation), and authenticate
  with grants whose access tokens the OAuth simulator (rotating refresh tokens) issues for
  ``TOKEN_LIFETIME_S``, so every binding's grant is refreshed every ~10 s through the kills;
* then the chaos stops, every replica runs, and the run waits until every intent is settled
  and no work is open (with webhooks: the sender idle, the spools forwarded, every receipt
  materialized), at most ``--settle`` seconds (``drained`` says which).

Invariants are read from the database, the simulator's own journal and each Runtime's own
store, never from integrationd's word:

* ``lost``: intents the Runtime created that never reached a final status, plus WorkItems
  still open, plus noop items that never succeeded (nothing unfinished is excused:
  ``awaiting_operator`` only says how many of them wait on an unresolved effect);
* ``duplicates``: PATCHes *applied* by the simulator beyond the first per idempotency key;
* ``receipts_not_once``: Runtimes whose committed receipts differ from their COMMITTED
  intents (each receipt is committed once; a repeated delivery is only a duplicate answer);
* ``quota_violations``: from the HubSpot simulator's arrival journal, windows of
  ``QUOTA_WINDOW_S`` on one app installation that saw more than ``QUOTA_LIMIT`` PATCHes;
* ``double_refreshes``: from the OAuth simulator's journal, token calls beyond the first per
  refresh token (a rotating refresh token's second use is ``invalid_grant``);
  ``grants_not_valid``: grants left needing re-authorization (every ``OPERATOR_EVERY_S``
  through the chaos, as an operator paged by the alert would, and all through the settle,
  the run's operator re-authorizes a grant its own SIGKILL left ``refresh_in_doubt`` when
  the OAuth simulator saw the refresh token at most once, the killed owner's own call:
  ``grants_reauthorized``, bench/torture_operator.py);
* webhooks (``bench/torture_webhooks.py``), from the Outreach simulator's delivery journal
  and the database: ``webhooks_lost`` (answered 200, no receipt: the spools are forwarded
  first), ``webhook_receipts_not_once`` (answered 200 with more than one receipt, or a
  receipt of a body never sent), ``webhook_events_not_once`` (a receipt not materialized
  into exactly one NormalizedEvent and its ``inbound_apply`` item),
  ``webhooks_spooled_left``, ``inbound_not_succeeded``; deliveries whose every try met a
  network failure are the provider's loss (``webhooks_undelivered``), not ours.

``--keep DIR`` keeps each backend's configs, per-incarnation replica logs, the simulators'
journals (``outreach_deliveries.jsonl``: every delivery try and its outcome) and (MariaDB)
the database for the post-mortem.

One JSON line on stdout (per-backend lines on stderr as each finishes); exit status 1 when an
invariant is broken.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import logging
import os
import random
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from bench import torture_webhooks as webhooks
from bench.effects import (
    publish_catalog,
    runtimes_for,
    scope_of,
    secrets_env,
    seed_links,
    serve_runtimes,
)
from bench.effects import write_config as effects_config
from bench.kernel import REPO, fresh_url, galera_database, mysql_admin, scrape, wait_admin
from bench.l1_copy import l1_copy
from bench.torture_operator import Doubt, Verdict, verdict
from daemon.core.states import WorkState
from daemon.core.token_bundle import (
    BundleContext,
    SecretText,
    TokenBundle,
    TokenKey,
    open_bundle,
    seal,
)
from daemon.core.work import WorkSpec
from daemon.services import logs
from sandbox.galera import GaleraCluster
from sandbox.hubspot_sim import Fault, HubSpotSimulator
from sandbox.oauth_sim import OAuthSimulator, refreshes_per_token, token_digest
from sandbox.ports import free_port
from sandbox.runtime import ReferenceRuntime
from storage.open import open_store
from storage.port import SqlTx, StorageError, WorkQuery
from storage.work_store import WorkStore

LEASE_TTL_S = 4.0
# On Galera a renewal's COMMIT certifies across three nodes: on this shared 2-core machine
# it took 1.1 s on average (and much longer in its tail) against the 1.7 s a 4 s lease
# leaves between a renewal (every TTL / 3) and the end of its trust (TTL - margin), so
# every claim ran out of trust and was reclaimed, over and over, until long after the
# chaos. A lease must outlast the database's renewal latency: the Galera run leases
# for longer (docs/tidb.md, "What was proven on Galera").
LEASE_TTL_FOR = {"galera": 10.0}
LEASE_MARGIN_S = 1.0
# Leads per Runtime. A Lead's title changes every LEADS * 30 ms * R: a read-back can
# prove a lost PATCH absent only when the contact was last modified more than the clock-skew
# margin before it (daemon/core/effects.py: reconcile), so changes on one Lead are spaced.
LEADS = 200
FINAL = ("COMMITTED", "REJECTED", "QUARANTINED")
# Provider quota, declared in the run's copy of the HubSpot L1 definition: this many PATCHes
# per window per app installation (one per Runtime here). The ledger spaces slots
# ceil((window + jitter + clock spread) / limit) apart: 250 ms of sending late (L1's jitter)
# plus the replicas' clock spread (work.clock_spread: each replica reads its slots on its
# own clock): ~9 per second with the default skew, against ~11 title changes per second
# per Runtime plus the retries the faults cause.
QUOTA_LIMIT = 20
QUOTA_WINDOW_S = 1.0
QUOTA_JITTER_S = 0.25
# Access tokens the OAuth simulator issues live this long; the token owner refreshes a token
# expiring within 60 s (daemon/services/token_refresh.py), so each binding's grant is
# refreshed about every 10 s, through the kills and freezes.
TOKEN_LIFETIME_S = 70
# How often the run's operator looks for grants its kills left in doubt during the
# chaos: left for the settle alone, a doubt early in a run held that binding's effects
# back for the rest of the chaos (a MariaDB phase 100 s long), a backlog the settle
# bound could not drain through the quota.
OPERATOR_EVERY_S = 10.0
CLIENT_SECRET = "torture-client-secret"
TOKEN_KEY = TokenKey("k1", bytes(range(32)))
# What each invariant is checked against on this branch (a check that has nothing to look at
# says so rather than passing silently).
CHECKS = {
    "lost": "Runtime intents not final + open WorkItems + noop items not succeeded, when the"
            " settle ended (drained, or its bound passed: see settle_s and drained); nothing"
            " unfinished is excused",
    "awaiting_operator": "of the open items, those on a remote record whose head effect's"
                         " outcome is still unknown (a diagnosis of lost, not an excuse)",
    "duplicates": "simulator journal: applied PATCHes per idempotency key",
    "receipts_not_once": "Runtime store: committed receipts vs COMMITTED intents",
    "quota_violations": "simulator journal: PATCH arrivals per app installation, windows of"
                        f" {QUOTA_WINDOW_S} s holding more than {QUOTA_LIMIT} (the L1 quota"
                        " this run declares)",
    "double_refreshes": "OAuth simulator journal: token calls beyond the first per refresh"
                        " token (rotating: a second use is invalid_grant)",
    "webhooks": webhooks.CHECK,
    "grants_reauthorized": "the run's operator (bench/torture_operator.py): grants left"
                           " refresh_in_doubt by the run's own SIGKILL of the refresh lease's"
                           " owner, whose refresh token the OAuth simulator saw at most"
                           " once (the killed owner's own call),"
                           " re-authorized during the settle (not a broken invariant: the"
                           " documented trade of rotating refresh tokens)",
}
FAULTS = (
    Fault(mode="latency", method="PATCH", latency_ms=1500, count=2),
    Fault(mode="status", method="PATCH", status=503, count=2),
    Fault(mode="status", method="PATCH", status=500),
    Fault(mode="rate_limit", method="PATCH", retry_after_s=1, count=2),
    Fault(mode="reset_before", method="PATCH"),
    Fault(mode="reset_after", method="PATCH"),
    Fault(mode="latency", method="GET", latency_ms=800),
    Fault(mode="status", method="GET", status=502),
)


def now_us() -> int:
    return time.time_ns() // 1000


def skews_ms(replicas: int, of_margin: float = 0.9) -> list[float]:
    """Each replica's clock offset: spread evenly over 90 % of ``work.lease_margin`` (the
    documented bound between replicas' clocks, docs/tidb.md), centred on the true time (so
    each is within half of it of the simulators' clocks, far inside the provider
    operation's ``max_clock_skew``)."""
    if replicas < 2:
        return [0.0] * replicas
    spread = of_margin * LEASE_MARGIN_S * 1000
    return [round(-spread / 2 + spread * i / (replicas - 1), 1) for i in range(replicas)]


def start_skewed(cfg: Path, index: int, incarnation: int, skew_ms: float
                 ) -> tuple[subprocess.Popen[bytes], Path]:
    """``integrationd run`` with its wall clock off by ``skew_ms`` (bench/skewed_replica.py);
    one log per incarnation (a killed one's log is kept for the post-mortem)."""
    log = cfg.parent / f"replica-{index}.{incarnation}.log"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.skewed_replica", str(skew_ms), "--config", str(cfg),
         "run"],
        stdout=subprocess.DEVNULL, stderr=log.open("wb"), cwd=cfg.parent, env=env,
    )
    return proc, log


@attrs.define(eq=False)
class Replica:
    index: int
    config: Path
    proc: subprocess.Popen[bytes] | None = None
    admin: str = ""
    stopped: bool = False
    incarnation: int = 0
    skew_ms: float = 0.0  # this replica's wall clock runs this far ahead (behind if < 0)

    def start(self) -> None:
        self.incarnation += 1
        self.proc, log = start_skewed(self.config, self.index, self.incarnation, self.skew_ms)
        self.admin = wait_admin(self.proc, log, time.monotonic() + 90)
        self.stopped = False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.stopped:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc, self.admin, self.stopped = None, "", False

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.stopped:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None


@attrs.define(eq=False)
class Run:
    """One backend's run: what happened and what the counters said."""

    backend: str
    replicas: list[Replica]
    urls: list[str]
    cluster: GaleraCluster | None
    counts: collections.Counter[str] = attrs.field(factory=collections.Counter)
    # (replica index, incarnation) -> last scraped transaction retries
    retries: dict[tuple[int, int], float] = attrs.field(factory=dict)
    timings: dict[tuple[int, int], dict[str, float]] = attrs.field(factory=dict)
    noop_ids: list[str] = attrs.field(factory=list)
    log: Callable[[str], None] = print
    journal_dir: Path | None = None
    lease_ttl_s: float = LEASE_TTL_S
    quota_on: bool = True
    webhooks: webhooks.Webhooks | None = None
    # The replica ids (host:pid, a replica's default) of every incarnation chaos SIGKILLed.
    killed: set[str] = attrs.field(factory=set)


def write_definitions(workdir: Path, quota_on: bool) -> Path:
    """The run's own copy of the shipped L1 definitions: instead of the providers' real
    limits, one quota dimension on HubSpot's that the run can saturate (unless
    ``quota_on`` is false). The replicas' clock spread is not folded into its jitter
    (that would let a late sender spend it too): each replica's ``work.clock_spread``
    says it (``replica_config``)."""
    quota = (f'[quota.torture]\nlimit = {QUOTA_LIMIT}\nwindow = {QUOTA_WINDOW_S}\n'
             f'scope = "app_installation"\njitter = {QUOTA_JITTER_S}\n'
             ) if quota_on else ""
    directory = l1_copy(workdir / "l1", quota={"hubspot": quota} if quota else None)
    (workdir / "k1.key").write_text(TOKEN_KEY.material.hex())
    (workdir / "client.secret").write_text(CLIENT_SECRET + "\n")
    return directory


def replica_config(workdir: Path, url: str, i: int, replicas: int, api_ports: list[int],
                   runtime_ports: list[int], sim_port: int, oauth_port: int, ttl: float,
                   clock_spread_s: float = 0.0, hooks: webhooks.Webhooks | None = None,
                   outreach_port: int = 0) -> Path:
    """bench.effects' configuration, with short leases, the run's L1 copy (quota), the
    replicas' clock spread, each binding authenticating with a grant refreshed at
    the OAuth simulator, and (``hooks``) the Outreach binding in the first Runtime's org
    with its webhook route, served on this replica's own ingress listener."""
    cfg = effects_config(workdir, url, i, replicas, api_ports, runtime_ports, sim_port,
                         definitions=workdir / "l1")
    text = cfg.read_text()
    grant = (f'auth = "grant"\ntoken_url = "http://127.0.0.1:{oauth_port}/oauth/v1/token"\n'
             f'client_id = "client-1"\nclient_secret_file = "{workdir / "client.secret"}"\n')
    if text.count('auth = "static_token"\n') != replicas:
        raise SystemExit("bench/effects.py's bindings changed: expected one static token each")
    text = text.replace('auth = "static_token"\n', grant)
    text += f'\n[keys]\nactive = "{TOKEN_KEY.key_id}"\ndir = "{workdir}"\n'
    short = f"lease_ttl = {ttl}\nmax_attempts = 1000000\nbackoff_cap = 2.0\n"
    text = (text
            .replace("[work]\npoll_interval = 0.1\n",
                     f"[work]\npoll_interval = 0.1\nlease_margin = {LEASE_MARGIN_S}\n"
                     f"reclaim_interval = 0.5\nclock_spread = {clock_spread_s}\n")
            .replace("[families.external_effect]\n", "[families.external_effect]\n" + short)
            .replace("[families.runtime_receipt]\n", "[families.runtime_receipt]\n" + short)
            .replace("[replica]\ndrain_timeout = 10.0\n",
                     "[replica]\ndrain_timeout = 5.0\nheartbeat_interval = 1.0\n"))
    text += f"\n[families.noop]\nlease_ttl = {ttl}\nbatch_size = 32\n"
    if url.startswith("sqlite"):
        text = text.replace("pool_size = 16\n", 'pool_size = 16\nsqlite_synchronous = "NORMAL"\n')
    if hooks is not None:
        first = scope_of(0)
        text += webhooks.binding_toml(first.org_id, first.app_installation_id, outreach_port,
                                      workdir / "webhook.secret")
        text += webhooks.ingress_toml(hooks.ports[i], hooks.spools[i])
    cfg.write_text(text)
    return cfg


# Transactions whose time (pool wait and retries included) the run reports, by name.
TIMED = ("work.renew", "work.claim", "work.finalize")


def scrape_timings(admin: str) -> dict[str, float]:
    """Counts and seconds of the TIMED transactions and the pool wait, from /metrics."""
    with urllib.request.urlopen(admin + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for name in TIMED:
        for kind in ("transactions", "transaction_seconds"):
            pattern = (rf"^integrationd_db_{kind}_total{{[^}}]*name=\"{re.escape(name)}\""
                       r"[^}]*} (\S+)$")
            out[f"{name}:{kind}"] = sum(float(m.group(1))
                                        for m in re.finditer(pattern, text, re.MULTILINE))
    wait = re.search(r"^integrationd_db_connection_wait_seconds_total{[^}]*} (\S+)$", text,
                     re.MULTILINE)
    out["pool_wait_s"] = float(wait.group(1)) if wait else 0.0
    return out


def timing_summary(run: Run) -> dict[str, float]:
    """Mean milliseconds per TIMED transaction and total pool wait, over every incarnation."""
    total: collections.Counter[str] = collections.Counter()
    for got in run.timings.values():
        total.update(got)
    out = {f"{name}_mean_ms": round(1000 * total[f"{name}:transaction_seconds"]
                                    / total[f"{name}:transactions"], 1)
           for name in TIMED if total[f"{name}:transactions"]}
    out["pool_wait_s"] = round(total["pool_wait_s"], 1)
    return out


async def scrape_loop(run: Run) -> None:
    while True:
        for r in run.replicas:
            if r.admin and not r.stopped:
                try:
                    got = await trio.to_thread.run_sync(scrape, r.admin)
                    timed = await trio.to_thread.run_sync(scrape_timings, r.admin)
                except (OSError, http.client.HTTPException):  # killed mid-scrape
                    continue
                run.retries[(r.index, r.incarnation)] = got[
                    "integrationd_db_transaction_retries_total"]
                run.timings[(r.index, r.incarnation)] = timed
        await trio.sleep(1.0)


async def traffic(run: Run, runtimes: list[ReferenceRuntime]) -> None:
    """Title changes on every Runtime's Leads in turn, and noop work, until cancelled."""
    store = await open_store(run.urls[0], sqlite_synchronous="NORMAL")
    n = 0
    try:
        while True:
            # Round robin over each Runtime's Leads: one Lead changes every LEADS * R * 30 ms.
            rt = runtimes[n % len(runtimes)]
            rt.store.update_lead(f"lead-{(n // len(runtimes)) % LEADS}", {"title": f"T{n}"})
            rt.wakeup.set()
            n += 1
            if n % 10 == 0:
                specs = [WorkSpec(family="noop", org_id="org-torture", subject_kind="torture",
                                  subject_id=f"n{n}-{k}") for k in range(5)]
                try:
                    got = await store.work_enqueue(specs, now_us())
                    run.noop_ids.extend(e.work_id for e in got)
                except StorageError as exc:  # a chaos casualty: count it and go on
                    run.counts["enqueue_failed"] += 1
                    run.log(f"enqueue failed: {type(exc).__name__}")
            await trio.sleep(0.03)
    finally:
        with trio.CancelScope(shield=True):
            await store.db.aclose()


async def chaos(run: Run, sim: HubSpotSimulator, seconds: float) -> None:
    """Faults armed every 0.3-1.2 s; between 1 and 3 s apart, one of: SIGKILL and restart a
    replica, SIGSTOP one past its lease then SIGCONT, or nothing (the first two actions are
    one kill and one freeze, so even a short run has both); on Galera, once, a node killed
    and restarted a third of the way in."""
    deadline = trio.current_time() + seconds
    node_killed = False
    next_fault = trio.current_time()
    planned = ["kill", "stop"]
    # Until the deadline, and until the planned kill and freeze and (on Galera) the node
    # kill have happened: a long freeze could carry the loop past the deadline before the
    # node kill's turn (then a run had no node kill at all).
    while (trio.current_time() < deadline or planned
           or (run.cluster is not None and not node_killed)):
        if trio.current_time() >= next_fault:
            sim.inject(random.choice(FAULTS))
            run.counts["faults"] += 1
            next_fault = trio.current_time() + random.uniform(0.3, 1.2)
        live = [r for r in run.replicas if r.proc is not None and not r.stopped]
        if (run.cluster is not None and not node_killed
                and trio.current_time() > deadline - seconds * 0.66):
            node_killed = True
            await kill_node(run, run.cluster)
            continue
        roll = random.random()
        action = planned.pop(0) if planned else (
            "kill" if roll < 0.45 else "stop" if roll < 0.75 else "none")
        if action == "kill" and len(live) > 1:
            victim = random.choice(live)
            assert victim.proc is not None
            run.killed.add(f"{socket.gethostname()}:{victim.proc.pid}")
            await trio.to_thread.run_sync(victim.kill)
            run.counts["kills"] += 1
            await trio.sleep(random.uniform(0.2, 1.5))
            await trio.to_thread.run_sync(victim.start)
            run.counts["restarts"] += 1
        elif action == "stop" and len(live) > 1:
            victim = random.choice(live)
            assert victim.proc is not None
            victim.proc.send_signal(signal.SIGSTOP)
            victim.stopped = True
            run.counts["sigstops"] += 1
            await trio.sleep(run.lease_ttl_s + LEASE_MARGIN_S + 1.0)
            victim.proc.send_signal(signal.SIGCONT)
            victim.stopped = False
        await trio.sleep(random.uniform(1.0, 3.0))


async def kill_node(run: Run, cluster: GaleraCluster) -> None:
    node = cluster.nodes[-1]  # the driver's store is on node 0
    await trio.to_thread.run_sync(cluster.kill, node)
    run.counts["db_node_kills"] += 1
    run.log(f"galera node {node.index} killed")
    await trio.sleep(3.0)
    await trio.to_thread.run_sync(cluster.restart, node)
    run.counts["db_node_restarts"] += 1
    run.log(f"galera node {node.index} rejoined")


async def settle(run: Run, runtimes: list[ReferenceRuntime], within_s: float,
                 oauth: OAuthSimulator | None = None) -> tuple[float, bool]:
    """Every replica running, no fault armed; wait, at most ``within_s``, for every intent
    and item to finish (with webhooks: first for the sender's last redeliveries, then for
    the spools to be forwarded and every receipt materialized), the run's operator
    re-authorizing meanwhile what its kills left in doubt (:func:`reauthorize_kills`).
    Returns the seconds waited and whether everything drained."""
    store = await open_store(run.urls[0], sqlite_synchronous="NORMAL")
    t0 = trio.current_time()
    try:
        with trio.move_on_after(within_s) as bound:
            if run.webhooks is not None:
                await run.webhooks.osim.wait_deliveries_settled()
            while True:
                open_intents = sum(
                    n for rt in runtimes
                    for status, n in rt.store.stats()["intents_by_status"].items()
                    if status not in FINAL)
                try:
                    # In the pipeline's order (spool -> receipt -> item): what is seen
                    # gone here cannot come back behind the next count.
                    unsettled = 0 if run.webhooks is None else (
                        run.webhooks.spooled_left() + await webhooks.unsettled(store))
                    open_items = await store.work_count_open()
                    if open_items and oauth is not None:
                        await reauthorize_kills(run, store, oauth)
                except StorageError:  # the database may still be recovering
                    unsettled = open_items = -1
                if open_intents == 0 and open_items == 0 and unsettled == 0:
                    break
                for rt in runtimes:
                    rt.wakeup.set()
                await trio.sleep(0.5)
    finally:
        with trio.CancelScope(shield=True):
            await store.db.aclose()
    if bound.cancelled_caught:
        run.log(f"{run.backend}: not drained within the settle bound of {within_s:g} s")
        if run.cluster is not None:
            run.log(f"galera: {await trio.to_thread.run_sync(run.cluster.describe)}")
    return trio.current_time() - t0, not bound.cancelled_caught


async def operator(run: Run, oauth: OAuthSimulator, every_s: float = OPERATOR_EVERY_S
                   ) -> None:
    """The run's operator during the chaos: every ``every_s``, :func:`reauthorize_kills`
    (the settle goes on doing it until the end)."""
    store = await open_store(run.urls[0], sqlite_synchronous="NORMAL")
    try:
        while True:
            await trio.sleep(every_s)
            try:
                await reauthorize_kills(run, store, oauth)
            except StorageError:  # the database may be recovering (a Galera node killed)
                continue
    finally:
        with trio.CancelScope(shield=True):
            await store.db.aclose()


async def reauthorize_kills(run: Run, store: WorkStore, oauth: OAuthSimulator) -> None:
    """The run's operator (bench/torture_operator.py): each current grant in doubt whose
    doubt the run's own SIGKILL made, and whose refresh token the OAuth simulator saw at
    most once (the killed owner's own call), gets a new grant at the next token version
    (fresh test tokens the simulator knows), as a re-authorization hands one over; anything
    else is left for the invariants to count."""

    async def doubts(tx: SqlTx) -> list[tuple[Any, ...]]:
        return await tx.fetchall(
            "SELECT g.binding_id, g.generation, g.token_version, l.call_sent_at_us,"
            " e.replica FROM authorization_grants g"
            " JOIN principal_bindings b ON b.binding_id = g.binding_id"
            " AND b.generation = g.generation"
            " LEFT JOIN refresh_leases l ON l.binding_id = g.binding_id"
            " AND l.generation = g.generation AND l.from_version = g.token_version"
            " LEFT JOIN work_executions e ON e.work_id = l.owner_work_id"
            " AND e.ownership_epoch = l.owner_epoch"
            " WHERE g.state = 'needs_reauthorization' AND g.reason_code = 'refresh_in_doubt'")

    presentations = collections.Counter(str(e["refresh_token"]) for e in oauth.journal)
    for binding_id, generation, version, marker, owner in await store.db.transact(
            doubts, name="torture.doubts", write=False):
        generation, version = int(generation), int(version)
        grant = await store.grant_get(binding_id, generation)
        if grant is None or grant.token_version != version:
            continue  # healed or replaced meanwhile
        bundle = open_bundle(grant.sealed, {TOKEN_KEY.key_id: TOKEN_KEY},
                             BundleContext(binding_id, generation, version))
        seen = (0 if bundle.refresh_token is None
                else presentations[token_digest(bundle.refresh_token.reveal())])
        doubt = Doubt(owner_replica=None if owner is None else str(owner),
                      presentations=seen, marked=marker is not None)
        if verdict(doubt, frozenset(run.killed)) is not Verdict.REAUTHORIZE:
            continue
        now = now_us()
        fresh = fresh_bundle(oauth, now)
        if await store.grant_replace(
                binding_id=binding_id, generation=generation, expected_version=version,
                sealed=seal(fresh, TOKEN_KEY, BundleContext(binding_id, generation,
                                                            version + 1)),
                expires_at_us=fresh.expires_at_us, now_us=now, refreshed=False):
            run.counts["grants_reauthorized"] += 1
            run.log(f"{run.backend}: operator re-authorized {binding_id} (version {version},"
                    f" in doubt since the kill of {owner})")


def quota_violations(sim: HubSpotSimulator) -> tuple[int, int]:
    """From the simulator's arrival journal: windows of ``QUOTA_WINDOW_S`` on one app
    installation (Runtime *r*'s contacts are ``r * 100000 + i``) that saw more than
    ``QUOTA_LIMIT`` PATCHes, and the most any such window saw."""
    arrivals: dict[int, list[float]] = collections.defaultdict(list)
    for rec in sim.requests:
        if rec.method == "PATCH" and rec.contact_id is not None:
            arrivals[int(rec.contact_id) // 100000].append(rec.received_at)
    violations = peak = 0
    for times in arrivals.values():
        times.sort()
        start = 0
        for end, t in enumerate(times):  # the window (t - W, t] ending at each arrival
            while times[start] <= t - QUOTA_WINDOW_S:
                start += 1
            peak = max(peak, end - start + 1)
            if end - start + 1 > QUOTA_LIMIT:
                violations += 1
    return violations, peak


def double_refreshes(oauth: OAuthSimulator) -> int:
    """From the OAuth simulator's journal: token calls beyond the first per refresh token
    (each is a version refreshed twice; with rotation the second is ``invalid_grant``)."""
    return sum(n - 1 for n in refreshes_per_token(oauth.journal).values() if n > 1)


async def invariants(run: Run, sim: HubSpotSimulator, runtimes: list[ReferenceRuntime],
                     oauth: OAuthSimulator) -> dict[str, Any]:
    applied: collections.Counter[str] = collections.Counter()
    for rec in sim.requests:
        if rec.method == "PATCH" and rec.applied:
            applied[rec.idempotency_key or f"no-key:{rec.contact_id}:{rec.body_sha256}"] += 1
    statuses: collections.Counter[str] = collections.Counter()
    receipts = receipts_not_once = 0
    for rt in runtimes:
        stats = rt.store.stats()
        statuses.update(stats["intents_by_status"])
        receipts += int(stats["receipts_committed"])
        if int(stats["receipts_committed"]) != int(stats["intents_by_status"]["COMMITTED"]):
            receipts_not_once += 1
    store = await open_store(run.urls[0], sqlite_synchronous="NORMAL")
    try:
        open_items = await store.work_count_open()
        noop = set(run.noop_ids)

        async def noop_done(tx: SqlTx) -> tuple[int, int]:
            rows = await tx.fetchall(
                "SELECT work_id, state FROM work_items WHERE family = 'noop'")
            ok = sum(1 for r in rows if r[0] in noop and r[1] == "succeeded")
            return ok, len(rows)

        noop_ok, _ = await store.db.transact(noop_done, name="torture.noop", write=False)

        async def held(tx: SqlTx) -> tuple[int, int]:
            """Open items on a remote record whose head awaits an operator (and how many of
            them are effects)."""
            rows = await tx.fetchall(
                "SELECT target_lane, family, failure_class FROM work_items"
                " WHERE state IN ('pending', 'processing', 'retry')")
            lanes = {r[0] for r in rows if r[2] == "outcome_unknown" and r[0] is not None}
            mine = [r for r in rows if r[0] in lanes]
            return len(mine), sum(1 for r in mine if r[1] == "external_effect")

        held_items, _ = await store.db.transact(held, name="torture.held", write=False)

        async def grants(tx: SqlTx) -> dict[str, int]:
            rows = await tx.fetchall(
                "SELECT state, token_version FROM authorization_grants")
            return {"not_valid": sum(1 for r in rows if r[0] != "valid"),
                    "top_version": max((int(r[1]) for r in rows), default=0)}

        grant_state = await store.db.transact(grants, name="torture.grants", write=False)
        summary = await store.work_execution_summary("noop")
        hooks = ({} if run.webhooks is None
                 else await webhooks.invariants(store, run.webhooks))
        stuck = []  # what did not finish, to say where to look
        for state in (WorkState.PENDING, WorkState.PROCESSING, WorkState.RETRY, WorkState.DEAD):
            for item in await store.work_list(WorkQuery(state=state, limit=10)):
                stuck.append({"work_id": item.work_id, "family": item.family,
                              "state": item.state.value, "attempt": item.attempt,
                              "epoch": item.ownership_epoch,
                              "subject_id": item.subject_id,
                              **await _why(store, item.work_id)})
    finally:
        await store.db.aclose()
    not_final = sum(n for s, n in statuses.items() if s not in FINAL)
    quota_windows = quota_violations(sim) if run.quota_on else (0, 0)
    return {
        "effects": len(applied),
        "patch_requests": sum(1 for r in sim.requests if r.method == "PATCH"),
        "receipts": receipts,
        "duplicates": sum(n - 1 for n in applied.values() if n > 1),
        "lost": not_final + open_items + (len(noop) - noop_ok),
        "awaiting_operator": held_items,
        "receipts_not_once": receipts_not_once,
        "quota_violations": quota_windows[0],
        "quota_peak_per_window": quota_windows[1],
        "double_refreshes": double_refreshes(oauth),
        "refreshes": sum(1 for e in oauth.journal if e.get("answer") == "ok"),
        "refresh_answers": dict(collections.Counter(str(e.get("answer"))
                                                    for e in oauth.journal)),
        "grants_not_valid": grant_state["not_valid"],
        "grant_top_version": grant_state["top_version"],
        "intents": dict(statuses),
        "noop_items": len(noop),
        "noop_reexecuted": summary.repeated,
        "stuck": stuck[:20],
        **hooks,
    }


async def _why(store: WorkStore, work_id: str) -> dict[str, Any]:
    """The item's failure class and summary, its executions' outcomes and its effect
    attempts' outcomes (ids and classes only: no payload)."""

    async def body(tx: SqlTx) -> dict[str, Any]:
        (row,) = await tx.fetchall(
            "SELECT failure_class, operator_summary FROM work_items WHERE work_id = ?",
            (work_id,))
        runs = await tx.fetchall(
            "SELECT outcome FROM work_executions WHERE work_id = ? ORDER BY ownership_epoch",
            (work_id,))
        attempts = await tx.fetchall(
            "SELECT ownership_epoch, response_status, outcome, evidence, disposition"
            " FROM effect_attempts WHERE work_id = ? ORDER BY ownership_epoch", (work_id,))
        return {"failure_class": row[0], "summary": row[1],
                "executions": [r[0] for r in runs][-8:],
                "attempts": [list(a) for a in attempts][-4:]}

    return await store.db.transact(body, name="torture.why", write=False)


async def drive(run: Run, runtimes: list[ReferenceRuntime], sim: HubSpotSimulator,
                sim_port: int, runtime_ports: list[int], seconds: float, settle_s: float,
                oauth: OAuthSimulator, oauth_port: int, outreach_port: int = 0
                ) -> dict[str, Any]:
    async with trio.open_nursery() as nursery:
        await nursery.start(sim.run, "127.0.0.1", sim_port)
        await nursery.start(oauth.run, "127.0.0.1", oauth_port)
        if run.webhooks is not None:
            await nursery.start(run.webhooks.osim.run, "127.0.0.1", outreach_port)
            run.webhooks.seed()
        await serve_runtimes(nursery, runtimes, runtime_ports, LEADS)
        # The contacts existed long before the run, as a CRM's do: seeded "now", a PATCH
        # that failed with a 5xx within the clock-skew margin of the seeding could never
        # be proven absent by a read-back (the record was modified too recently), and it
        # waited for an operator, correctly, past the settle bound.
        seeded_ms = int((time.time() - 3600) * 1000)
        for r in range(len(runtimes)):
            for i in range(LEADS):
                sim.put_contact(f"{r * 100000 + i}", {"jobtitle": "Engineer"},
                                modified_ms=seeded_ms)
        for replica in run.replicas:
            await trio.to_thread.run_sync(replica.start)
        nursery.start_soon(scrape_loop, run)
        async with trio.open_nursery() as load:
            load.start_soon(traffic, run, runtimes)
            load.start_soon(operator, run, oauth)
            if run.webhooks is not None:
                load.start_soon(run.webhooks.traffic)
            await chaos(run, sim, seconds)
            load.cancel_scope.cancel()
        sim.clear_faults()
        for replica in run.replicas:
            if replica.proc is None:
                await trio.to_thread.run_sync(replica.start)
                run.counts["restarts"] += 1
        settle_seconds, drained = await settle(run, runtimes, settle_s, oauth)
        result = await invariants(run, sim, runtimes, oauth)
        if run.journal_dir is not None:  # --keep: the journals the counters came from
            with (run.journal_dir / "hubspot_requests.jsonl").open("w") as out:
                out.writelines(json.dumps(r.to_json()) + "\n" for r in sim.requests)
            (run.journal_dir / "oauth_journal.json").write_text(json.dumps(oauth.journal))
            if run.webhooks is not None:
                with (run.journal_dir / "outreach_deliveries.jsonl").open("w") as out:
                    out.writelines(json.dumps(d) + "\n" for d in run.webhooks.journal())
        result["settle_s"] = round(settle_seconds, 1)
        result["drained"] = drained
        nursery.cancel_scope.cancel()
    return result


def run_backend(backend: str, replicas: int, seconds: float, settle_s: float,
                log: Callable[[str], None], keep: Path | None, skew: float,
                quota_on: bool = True, webhook_rate: float = webhooks.DEFAULT_RATE
                ) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"torture-{backend}-") as tmp:
        workdir = keep / backend if keep else Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        _log_sandbox_to(workdir / "sandbox.log")
        cluster: GaleraCluster | None = None
        dbname: str | None = None
        started = time.monotonic()
        try:
            if backend == "galera":
                cluster = GaleraCluster.create(workdir / "galera")
                cluster.start()
                urls, dbname = galera_database(cluster)
            else:
                url, dbname = fresh_url(backend, workdir)
                urls = [url]
            trio.run(seed_links, urls[0], replicas, LEADS)
            first = scope_of(0)
            trio.run(webhooks.seed_links, urls[0], first.org_id, first.app_installation_id)
            api_ports = [free_port() for _ in range(replicas)]
            runtime_ports = [free_port() for _ in range(replicas)]
            sim_port = free_port()
            oauth_port = free_port()
            outreach_port = free_port()
            hooks = webhooks.Webhooks(ports=[free_port() for _ in range(replicas)],
                                      spools=[workdir / f"spool-{i}" for i in range(replicas)],
                                      rate=webhook_rate)
            (workdir / "webhook.secret").write_text(webhooks.SECRET + "\n")
            ttl = LEASE_TTL_FOR.get(backend, LEASE_TTL_S)
            env = secrets_env(replicas)
            for r in range(replicas):  # the bindings authenticate with grants, not these
                del env[f"INTEGRATIOND_BINDING_HUBSPOT_{r}_TOKEN"]
            os.environ.update(env, **webhooks.env())
            skews = skews_ms(replicas, skew)
            write_definitions(workdir, quota_on)
            configs = [replica_config(workdir, urls[i % len(urls)], i, replicas, api_ports,
                                      runtime_ports, sim_port, oauth_port, ttl,
                                      (max(skews) - min(skews)) / 1000, hooks, outreach_port)
                       for i in range(replicas)]
            trio.run(publish_catalog, urls[0], configs[0])
            oauth = OAuthSimulator(client_secret=CLIENT_SECRET, lifetime_s=TOKEN_LIFETIME_S)
            trio.run(install_grants, urls[0], replicas, oauth)
            run = Run(backend, [Replica(i, c, skew_ms=s)
                                for i, (c, s) in enumerate(zip(configs, skews, strict=True))],
                      urls, cluster, log=log, journal_dir=workdir if keep else None,
                      lease_ttl_s=ttl, quota_on=quota_on, webhooks=hooks)
            # The provider accepts exactly the access tokens the OAuth simulator issued.
            sim = HubSpotSimulator(tokens=oauth.access_tokens)
            runtimes = runtimes_for(replicas, api_ports)
            try:
                result = trio.run(drive, run, runtimes, sim, sim_port, runtime_ports, seconds,
                                  settle_s, oauth, oauth_port, outreach_port)
            finally:
                for replica in run.replicas:
                    replica.terminate()
        finally:
            if cluster is not None:
                if keep:  # the nodes' own logs: why a node left or rejoined
                    for node_log in cluster.base.glob("n*.log"):
                        shutil.copy(node_log, workdir / f"galera-{node_log.name}")
                cluster.stop()
            elif dbname and keep:
                log(f"kept database {dbname} and {workdir}")
            elif dbname:
                mysql_admin(f"DROP DATABASE IF EXISTS {dbname}")
    return {
        "backend": backend,
        "replicas": replicas,
        "chaos_s": round(seconds, 1),
        "wall_s": round(time.monotonic() - started, 1),
        "kills": run.counts["kills"],
        "restarts": run.counts["restarts"],
        "sigstops": run.counts["sigstops"],
        "db_node_kills": run.counts["db_node_kills"],
        "grants_reauthorized": run.counts["grants_reauthorized"],
        "faults_injected": run.counts["faults"],
        "conflicts_retried": int(sum(run.retries.values())),
        "clock_skew_ms": [r.skew_ms for r in run.replicas],
        "lease_ttl_s": run.lease_ttl_s,
        "webhook_rate": webhook_rate,
        "db_timings": timing_summary(run),
        **result,
    }


def fresh_bundle(oauth: OAuthSimulator, now: int) -> TokenBundle:
    """A grant's tokens as the provider issues them: an access token it accepts, expiring
    within the refresh margin soon, and a refresh token the OAuth simulator knows. Test
    values, made here, never logged."""
    access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    oauth.access_tokens.add(access)
    oauth.seed(refresh)
    return TokenBundle(access_token=SecretText(access), refresh_token=SecretText(refresh),
                       expires_at_us=now + TOKEN_LIFETIME_S * 1_000_000)


async def install_grants(url: str, replicas: int, oauth: OAuthSimulator) -> None:
    """Each binding's first grant (token version 1, :func:`fresh_bundle`)."""
    store = await open_store(url, sqlite_synchronous="NORMAL")
    try:
        now = now_us()
        for r in range(replicas):
            bundle = fresh_bundle(oauth, now)
            await store.grant_install(
                binding_id=f"hubspot-{r}", generation=1,
                sealed=seal(bundle, TOKEN_KEY, BundleContext(f"hubspot-{r}", 1, 1)),
                expires_at_us=bundle.expires_at_us, now_us=now)
    finally:
        await store.db.aclose()


def _log_sandbox_to(path: Path) -> None:
    """The Runtime's and the simulator's own log lines go to a file, not the terminal."""
    logger = logging.getLogger(logs.LOGGER_NAME)
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    handler = logging.FileHandler(path)
    handler.setFormatter(logs.JsonLineFormatter())
    logger.addHandler(handler)
    logger.propagate = False


TOTALS = ("kills", "restarts", "sigstops", "db_node_kills", "grants_reauthorized",
          "faults_injected", "conflicts_retried", "effects", "receipts", "duplicates", "lost",
          "awaiting_operator", "receipts_not_once", "quota_violations", "double_refreshes",
          "refreshes", "grants_not_valid", "webhooks_sent", "webhooks_answered_200",
          "webhooks_answered_non200", "webhooks_undelivered", "webhook_receipts",
          "inbound_items", *webhooks.BROKEN)
BROKEN = ("duplicates", "lost", "receipts_not_once", "quota_violations", "double_refreshes",
          "grants_not_valid", *webhooks.BROKEN)


def main() -> None:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--duration", type=float, default=90.0,
                        help="seconds of chaos in all, shared by the backends")
    parser.add_argument("--backends", default="mysql,galera,sqlite")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--settle", type=float, default=120.0,
                        help="seconds to wait, after the chaos, for everything to finish")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-quota", action="store_true",
                        help="declare no provider quota (a diagnosis run: quota_violations"
                             " is then not checked, and the JSON line says so)")
    parser.add_argument("--skew", type=float, default=0.9,
                        help="the replicas' clocks are spread over this fraction of"
                             f" work.lease_margin ({LEASE_MARGIN_S} s here); at most 1")
    parser.add_argument("--webhook-rate", type=float, default=webhooks.DEFAULT_RATE,
                        help="signed Outreach webhook deliveries per second, spread over the"
                             " replicas' ingress listeners (0: none; the webhook checks then"
                             " say so)")
    parser.add_argument("--keep", metavar="DIR", type=Path,
                        help="keep configs, logs (the Galera nodes' too) and the MariaDB"
                             " database in DIR")
    args = parser.parse_args()
    backends = [b for b in args.backends.split(",") if b]
    unknown = set(backends) - {"mysql", "galera", "sqlite"}
    if unknown or not backends:
        parser.error(f"--backends: one or more of mysql, galera, sqlite (got {args.backends})")
    if args.webhook_rate < 0:
        parser.error(f"--webhook-rate: deliveries per second, 0 or more (got"
                     f" {args.webhook_rate})")
    if not 0 <= args.skew <= 1:
        parser.error(f"--skew: a fraction of work.lease_margin, 0 to 1 (got {args.skew})")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    random.seed(seed)

    def log(message: str) -> None:
        sys.stderr.write(f"torture: {message}\n")
        sys.stderr.flush()

    per_backend = []
    for backend in backends:
        got = run_backend(backend, args.replicas, args.duration / len(backends), args.settle,
                          log, args.keep, args.skew, not args.no_quota, args.webhook_rate)
        log(json.dumps(got))
        per_backend.append(got)
    line: dict[str, Any] = {"torture": "issue 12", "seed": seed, "duration_s": args.duration,
                            "backends": backends, "webhook_rate": args.webhook_rate}
    line.update({k: sum(int(b[k]) for b in per_backend) for k in TOTALS})
    line["per_backend"] = {b["backend"]: {k: b[k] for k in (*TOTALS, "intents", "noop_items",
                                                            "noop_reexecuted", "settle_s",
                                                            "drained", "lease_ttl_s",
                                                            "clock_skew_ms", "db_timings",
                                                            "quota_peak_per_window",
                                                            "refresh_answers",
                                                            "grant_top_version",
                                                            "webhook_attempts",
                                                            "webhook_statuses",
                                                            "webhook_receipts_via_spool",
                                                            "webhook_duplicates_collapsed",
                                                            "stuck")}
                           for b in per_backend}
    line["checks"] = dict(CHECKS)
    if args.no_quota:
        line["checks"]["quota_violations"] = "not exercised: --no-quota"
    if args.webhook_rate == 0:
        line["checks"]["webhooks"] = "not exercised: --webhook-rate 0"
    print(json.dumps(line), flush=True)
    if any(line[k] for k in BROKEN):
        sys.exit(1)


if __name__ == "__main__":
    main()
