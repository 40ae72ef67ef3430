"""A real distributed engine in the suite (issue 12): a 3-node MariaDB Galera cluster on
loopback ports chosen at run time, with stores connected to different nodes.

Galera reports a lost race between nodes as 1213 at COMMIT (certification failure), as
TiDB's optimistic transactions report theirs: the adapter must retry the whole
transaction, never crash and never report a silent success."""

from __future__ import annotations

import os
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from sandbox.galera import GaleraCluster, GaleraUnavailable
from storage.migrate import migrate
from storage.mysql.adapter import MysqlDatabase, MysqlTarget
from storage.port import DatabaseUnavailable, SqlTx
from storage.work_store import WorkStore
from tests.support.backends import FreshDatabase, fresh_database
from tests.support.processes import alive
from tests.support.work import T0, claim, enqueue

pytestmark = [pytest.mark.slow, pytest.mark.galera]


@pytest.fixture
def galera(galera_cluster: GaleraCluster) -> GaleraCluster:
    """The session's cluster (tests/conftest.py), shared with the conformance suite."""
    return galera_cluster


@pytest.fixture
async def stores(galera: GaleraCluster, tmp_path: Path) -> AsyncIterator[list[WorkStore]]:
    """One migrated database, and one store per node."""
    async with fresh_database("galera", tmp_path, migrated=False) as tdb:
        opened = [await tdb.open_store(url=node.url(_name(tdb))) for node in galera.nodes]
        await migrate(opened[0].db, opened[0].dialect, T0)
        yield opened


def _name(tdb: FreshDatabase) -> str:
    return MysqlTarget.from_url(tdb.url).database


async def test_writes_on_one_node_are_read_on_the_others(stores: list[WorkStore]) -> None:
    ids = await enqueue(stores[0], 3)
    for store in stores[1:]:
        got = [await store.work_get(i) for i in ids]
        assert all(item is not None for item in got)


async def test_conflicting_commits_on_different_nodes_are_retried_as_whole_transactions(
        stores: list[WorkStore]) -> None:
    """The same row incremented from every node at once: certification conflicts happen
    (counted as retries), and not one increment is lost or applied twice."""

    async def setup(tx: SqlTx) -> None:
        await tx.execute("CREATE TABLE IF NOT EXISTS hot (id INTEGER PRIMARY KEY, v BIGINT)")
        await tx.execute("INSERT INTO hot VALUES (1, 0)")

    await stores[0].db.transact(setup, name="test.setup")
    per_task, tasks = 30, 2

    async def bump(store: WorkStore) -> None:
        async def body(tx: SqlTx) -> None:
            await tx.execute("UPDATE hot SET v = v + 1 WHERE id = 1")

        for _ in range(per_task):
            await store.db.transact(body, name="test.bump")

    retries_before = sum(s.db.stats.retries for s in stores)
    async with trio.open_nursery() as nursery:
        for store in stores:
            for _ in range(tasks):
                nursery.start_soon(bump, store)

    async def read(tx: SqlTx) -> int:
        return int((await tx.fetchall("SELECT v FROM hot WHERE id = 1"))[0][0])

    assert await stores[2].db.transact(read, name="test.read", write=False) == (
        per_task * tasks * len(stores))
    assert sum(s.db.stats.retries for s in stores) > retries_before  # conflicts did happen


async def test_claims_from_every_node_have_one_winner(stores: list[WorkStore]) -> None:
    ids = set(await enqueue(stores[0], 60, subject_id="s1")
              + await enqueue(stores[0], 60, subject_id="s2"))
    won: list[tuple[str, int]] = []

    async def claimer(store: WorkStore, owner: str) -> None:
        idle = 0
        while idle < 3:
            got = await claim(store, owner=owner, limit=4)
            won.extend((i.work_id, i.ownership_epoch) for i in got.claimed)
            idle = 0 if got.claimed or got.contended else idle + 1

    async with trio.open_nursery() as nursery:
        for n, store in enumerate(stores):
            nursery.start_soon(claimer, store, f"node{n}")
    assert sorted(w for w, _ in won) == sorted(ids)  # each claimed exactly once


async def test_a_killed_node_rejoins_with_what_it_missed(galera: GaleraCluster,
                                                         stores: list[WorkStore]) -> None:
    galera.kill(galera.nodes[2])
    ids = await enqueue(stores[0], 5)
    # The killed node's datadir still names its place in the cluster's history, so it
    # rejoins by incremental state transfer (no donor copies its datadir under a lock).
    position = galera.recover_position(galera.nodes[2])
    assert position is not None and int(position.rsplit(":", 1)[1]) >= 0, position
    galera.restart(galera.nodes[2])
    fresh = await MysqlDatabase(MysqlTarget.from_url(galera.nodes[2].url(
        _database_of(stores[0]))), pool_size=1).open()
    try:
        store = WorkStore(fresh, fresh.dialect)
        assert [await store.work_get(i) is not None for i in ids] == [True] * len(ids)
    finally:
        await fresh.aclose()


def test_describe_gives_each_nodes_replication_state(galera: GaleraCluster) -> None:
    """What the torture run prints when a Galera settle does not drain."""
    described = galera.describe().split("; ")
    assert [d.split(":")[0] for d in described] == ["n0", "n1", "n2"]
    for line in described:
        assert ": Synced, cluster size 3, recv queue " in line, line
        assert "flow control paused " in line and "?" not in line, line


def test_a_node_that_exits_while_starting_says_why_in_the_error() -> None:
    """stop() removes the cluster's directory, logs included: the error carries the end
    of the node's log (here: its SQL port taken by another listener)."""
    cluster = GaleraCluster.create(die_with_parent=True)
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", cluster.nodes[0].sql_port))
        taken.listen()
        try:
            with pytest.raises(GaleraUnavailable) as raised:
                cluster.start(timeout_s=60)
        finally:
            cluster.stop()
    message = str(raised.value)
    assert message.startswith("node 0 exited; the end of "), message
    assert "already in use" in message.lower() or "bind" in message.lower(), message


def _database_of(store: WorkStore) -> str:
    assert isinstance(store.db, MysqlDatabase)
    return store.db.target.database


async def test_a_node_that_refuses_queries_is_unavailable_not_a_bug(
        galera: GaleraCluster, stores: list[WorkStore]) -> None:
    """A node that is not ready for clients (joining, non-primary, or told to refuse them)
    answers 1047 ("WSREP has not yet prepared node for application use"): the store must
    call that the database being unavailable for now, a condition that waiting fixes, and
    the other nodes carry on."""
    node = galera.nodes[1]
    (wid,) = await enqueue(stores[0], 1)
    galera.sql(node, "SET GLOBAL wsrep_reject_queries = ALL")
    try:
        with pytest.raises(DatabaseUnavailable, match=r"not ready for clients \(1047\)"):
            await claim(stores[1], owner="n1")
        got = await claim(stores[2], owner="n2")
        assert [i.work_id for i in got.claimed] == [wid]
    finally:
        galera.sql(node, "SET GLOBAL wsrep_reject_queries = NONE")
    item = await stores[1].work_get(wid)  # the node serves again, and has seen the claim
    assert item is not None and item.lease_owner == "n2"


_NODE_IN_A_CHILD = """
import sys, time
from pathlib import Path
from sandbox.galera import GaleraCluster
cluster = GaleraCluster.create(Path(sys.argv[1]), die_with_parent=True)
node = cluster.nodes[0]
cluster.install(node)
cluster._launch(node, bootstrap=True)
cluster._wait_synced(node, time.monotonic() + 120)
print(node.proc.pid, flush=True)
time.sleep(600)
"""


def test_a_killed_test_run_leaves_no_galera_node_behind(tmp_path: Path) -> None:
    """A test run stopped by SIGKILL (a time limit) runs no teardown: the node it started
    must die with it, as the suite's cluster is made (``die_with_parent``)."""
    import signal
    import subprocess
    import sys
    import time

    with subprocess.Popen(
        [sys.executable, "-c", _NODE_IN_A_CHILD, str(tmp_path / "cluster")],
        stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2],
    ) as child:
        assert child.stdout is not None
        node_pid = int(child.stdout.readline())
        assert alive(node_pid), "the node is not running"
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    deadline = time.monotonic() + 30
    while alive(node_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(node_pid):
        os.kill(node_pid, signal.SIGKILL)
        raise AssertionError(f"mariadbd {node_pid} outlived the killed test run")


def test_a_node_leaves_other_servers_temporary_tables_alone(tmp_path: Path) -> None:
    """MariaDB deletes every ``#sql*`` file in its ``tmpdir`` when it starts (and when
    ``mariadb-install-db`` bootstraps a datadir), taking them for its own leftovers. A node
    on the default tmpdir (``$TMPDIR`` or /tmp, the machine's shared one) so deleted the
    on-disk temporary tables of the machine's other MariaDB server while its queries used
    them (the likely cause of ``bench.seqload``'s history rollup failing with error 6, its
    ``#sql-temptable-*`` file under /tmp gone): a node's installation and start must touch
    only its own tmpdir."""
    import secrets
    import tempfile
    import time

    shared = Path(tempfile.gettempdir())
    probes = [shared / f"#sql-temptable-galera-probe-{secrets.token_hex(4)}{ext}"
              for ext in (".MAI", ".MAD")]
    for probe in probes:
        probe.write_bytes(b"")
    cluster = GaleraCluster.create(tmp_path / "cluster")
    node = cluster.nodes[0]
    try:
        cluster.install(node)
        assert [p.name for p in probes if not p.exists()] == [], "deleted by the install"
        cluster._launch(node, bootstrap=True)
        cluster._wait_synced(node, time.monotonic() + 120)
        assert [p.name for p in probes if not p.exists()] == [], "deleted by the start"
    finally:
        cluster.stop()
        for probe in probes:
            probe.unlink(missing_ok=True)
