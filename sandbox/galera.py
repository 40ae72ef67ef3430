"""A 3-node MariaDB Galera cluster on loopback ports chosen at run time (issue 12).

Galera stands in for a distributed engine in the suite: every node accepts writes, and
conflicting transactions on different nodes fail at COMMIT with 1213 (certification
failure), the same class of error TiDB's optimistic transactions report. Each node has
its own datadir, SQL port, group-communication port, IST port and SST port; the first
node bootstraps the cluster (``--wsrep-new-cluster``), the others join it (a node killed
and restarted recovers its position and rejoins by incremental state transfer).
``python -m sandbox.galera`` starts one and prints its node URLs (for trying things by
hand); the test fixtures start one per session, ``bench.kernel --backend galera`` and the
torture run one per run.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs

from sandbox.ports import free_port

PROVIDER = "/usr/lib/galera/libgalera_smm.so"
MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
NODES = 3


class GaleraUnavailable(RuntimeError):
    """galera-4 or the MariaDB server is not installed, or the cluster did not form."""


@attrs.define
class GaleraNode:
    index: int
    datadir: Path
    sql_port: int
    gcomm_port: int
    ist_port: int
    sst_port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.datadir.parent / f"n{self.index}.sock"

    @property
    def tmpdir(self) -> Path:
        """The node's own temporary directory. MariaDB deletes every ``#sql*`` file in its
        tmpdir when it starts or installs a datadir, taking them for its own leftovers:
        on the default one (``$TMPDIR`` or /tmp) a node would delete the temporary tables
        another server on the machine is using (error 6 in that server's query)."""
        return self.datadir.parent / f"n{self.index}-tmp"

    def url(self, database: str) -> str:
        return f"mysql://root@127.0.0.1:{self.sql_port}/{database}"


@attrs.define
class GaleraCluster:
    base: Path
    nodes: list[GaleraNode] = attrs.field(factory=list)
    # Each node gets SIGKILL when the thread that started it dies (setpriv --pdeathsig):
    # a test run stopped by a signal or a time limit leaves no mariadbd behind. Only for
    # a caller that starts and restarts nodes from one long-lived thread (the test
    # session's); the kernel signals on the *thread's* exit, not the process's.
    die_with_parent: bool = False

    @classmethod
    def create(cls, base: Path | None = None, *, die_with_parent: bool = False
               ) -> GaleraCluster:
        if not Path(PROVIDER).exists() or not Path(MARIADBD).exists():
            raise GaleraUnavailable(f"need {PROVIDER} (apt-get install galera-4 rsync) and"
                                    f" {MARIADBD}")
        root = base or Path(tempfile.mkdtemp(prefix="galera-"))
        nodes = [GaleraNode(i, root / f"n{i}", free_port(), free_port(), free_port(),
                            free_port()) for i in range(NODES)]
        return cls(root, nodes, die_with_parent)

    def _command(self, node: GaleraNode, *, bootstrap: bool,
                 start_position: str | None = None) -> list[str]:
        members = ",".join(f"127.0.0.1:{n.gcomm_port}" for n in self.nodes)
        options = (f"gmcast.listen_addr=tcp://127.0.0.1:{node.gcomm_port};"
                   f"ist.recv_addr=127.0.0.1:{node.ist_port};"
                   "gcache.size=128M;evs.suspect_timeout=PT5S;"
                   "evs.inactive_timeout=PT10S")
        cmd = [
            MARIADBD, "--no-defaults", f"--datadir={node.datadir}", f"--tmpdir={node.tmpdir}",
            f"--socket={node.socket}",
            f"--port={node.sql_port}", "--bind-address=127.0.0.1", "--user=root",
            f"--pid-file={node.datadir.parent / f'n{node.index}.pid'}",
            "--skip-log-bin", "--binlog-format=ROW", "--default-storage-engine=InnoDB",
            "--innodb-autoinc-lock-mode=2", "--innodb-buffer-pool-size=32M",
            "--innodb-flush-log-at-trx-commit=2",
            "--max-connections=1000", "--wsrep-on=ON", f"--wsrep-provider={PROVIDER}",
            "--wsrep-cluster-name=integrationd-test",
            f"--wsrep-cluster-address=gcomm://{members}",
            f"--wsrep-node-address=127.0.0.1:{node.gcomm_port}",
            f"--wsrep-node-incoming-address=127.0.0.1:{node.sql_port}",
            f"--wsrep-provider-options={options}", "--wsrep-sst-method=rsync",
            f"--wsrep-sst-receive-address=127.0.0.1:{node.sst_port}",
            # Causal reads: a SELECT sees every commit acknowledged before it began, on
            # any node (as a distributed engine such as TiDB gives).
            "--wsrep-slave-threads=2", "--wsrep-sync-wait=1",
        ]
        if bootstrap:
            cmd.append("--wsrep-new-cluster")
        if start_position is not None:
            cmd.append(f"--wsrep-start-position={start_position}")
        return cmd

    def start(self, timeout_s: float = 120.0) -> None:
        """Bootstrap node 0 once to create the cluster's state and the loopback root user,
        stop it cleanly, give every node a copy of that state, then start all three: the
        joiners already hold the cluster's exact position, so no state transfer runs (an
        rsync SST of a fresh datadir is both slow and, here, fragile)."""
        first = self.nodes[0]
        self.install(first)
        deadline = time.monotonic() + timeout_s
        self._launch(first, bootstrap=True)
        self._wait_synced(first, deadline)
        self.sql(first, "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';"
                        " GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;")
        self._stop_cleanly(first)
        for node in self.nodes[1:]:
            shutil.copytree(first.datadir, node.datadir,
                            ignore=shutil.ignore_patterns("gvwstate.dat", "galera.cache"))
            state = node.datadir / "grastate.dat"
            state.write_text(state.read_text().replace("safe_to_bootstrap: 1",
                                                       "safe_to_bootstrap: 0"))
        # The rsync daemon a joiner runs for state transfer drops root for "nobody": it must
        # be able to enter and write the datadirs (throwaway test directories).
        self.base.chmod(0o755)
        for node in self.nodes:
            for path in (node.datadir, *node.datadir.rglob("*")):
                path.chmod(0o777 if path.is_dir() else 0o666)
        for node in self.nodes:
            self._launch(node, bootstrap=node.index == 0)
            self._wait_synced(node, deadline)
        self._wait_size(deadline)

    def install(self, node: GaleraNode) -> None:
        """A fresh datadir for ``node`` (``mariadb-install-db``, on the node's tmpdir)."""
        node.tmpdir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={node.datadir}",
                        f"--tmpdir={node.tmpdir}", "--auth-root-authentication-method=normal",
                        "--skip-test-db", "--user=root"], check=True, capture_output=True,
                       timeout=120)

    def _wait_status(self, name: str, value: str, deadline: float) -> None:
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None:
                    raise GaleraUnavailable(f"node {node.index} exited: see {self.base}/n"
                                            f"{node.index}.log")
            if all(self._status(n, name) == value for n in self.nodes):
                return
            time.sleep(0.2)
        raise GaleraUnavailable(f"the cluster did not reach {name} = {value} in time")

    def _stop_cleanly(self, node: GaleraNode) -> None:
        assert node.proc is not None
        node.proc.send_signal(signal.SIGTERM)
        node.proc.wait(timeout=60)
        node.proc = None

    def _launch(self, node: GaleraNode, *, bootstrap: bool,
                start_position: str | None = None) -> None:
        node.tmpdir.mkdir(parents=True, exist_ok=True)
        log = open(self.base / f"n{node.index}.log", "ab")  # noqa: SIM115 - the child owns it
        # New files and directories readable and writable by the state-transfer daemon
        # (MariaDB reads UMASK and UMASK_DIR as the modes it creates them with).
        env = {**os.environ, "UMASK": "0666", "UMASK_DIR": "0777"}
        command = self._command(node, bootstrap=bootstrap, start_position=start_position)
        if self.die_with_parent:
            command = ["setpriv", "--pdeathsig", "KILL", "--", *command]
        node.proc = subprocess.Popen(command, stdout=log,
                                     stderr=subprocess.STDOUT, start_new_session=True, env=env)
        log.close()

    def restart(self, node: GaleraNode, timeout_s: float = 120.0) -> None:
        """Start a stopped node again, as MariaDB's systemd unit does (``galera_recovery``):
        first recover the position its datadir holds, then start it there, so that it
        rejoins by incremental state transfer from another node's gcache. Started without
        it, a node that was SIGKILLed knows no position and takes a full rsync SST: the
        donor holds a global read lock on its datadir while it copies, and stays desynced
        until it has caught up. Galera still falls back to SST when no gcache holds the
        writes missed. Returns once every running node is Synced again, the donor too."""
        deadline = time.monotonic() + timeout_s
        self._launch(node, bootstrap=False, start_position=self.recover_position(node))
        for each in self.nodes:
            if each.proc is not None:
                self._wait_synced(each, deadline)
        self._wait_size(deadline)

    def recover_position(self, node: GaleraNode) -> str | None:
        """The cluster position (``uuid:seqno``) a stopped node's datadir holds, read by
        ``mariadbd --wsrep-recover`` from InnoDB; None when it names none."""
        out = subprocess.run([*self._command(node, bootstrap=False), "--wsrep-recover"],
                             capture_output=True, text=True, timeout=120, check=False)
        found = [line.rsplit(" ", 1)[-1] for line in (out.stdout + out.stderr).splitlines()
                 if "WSREP: Recovered position:" in line]
        position = found[-1] if found else ""
        return position if position and not position.endswith(":-1") else None

    def kill(self, node: GaleraNode) -> None:
        """SIGKILL one node (the others keep quorum)."""
        if node.proc is not None and node.proc.poll() is None:
            node.proc.send_signal(signal.SIGKILL)
            node.proc.wait(timeout=30)
        node.proc = None

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGKILL)
        for node in self.nodes:
            if node.proc is not None:
                node.proc.wait(timeout=30)
                node.proc = None
        shutil.rmtree(self.base, ignore_errors=True)

    def sql(self, node: GaleraNode, statement: str) -> str:
        out = subprocess.run(
            ["mariadb", f"--socket={node.socket}", "--user=root", "-N", "-B", "-e", statement],
            capture_output=True, text=True, timeout=30, check=False)
        if out.returncode != 0:
            raise GaleraUnavailable(f"node {node.index}: {out.stderr.strip()}")
        return out.stdout.strip()

    def _status(self, node: GaleraNode, name: str) -> str:
        try:
            row = self.sql(node, f"SHOW STATUS LIKE '{name}'")
        except (GaleraUnavailable, subprocess.TimeoutExpired):
            return ""
        return row.split("\t")[-1] if row else ""

    def describe(self) -> str:
        """Each node's replication state in one line, for a run that found the cluster
        stuck: its state, the cluster size it sees, its receive queue and the share of
        time flow control paused it (SHOW STATUS waits for no causal read)."""
        names = ("wsrep_local_state_comment", "wsrep_cluster_size", "wsrep_local_recv_queue",
                 "wsrep_flow_control_paused")
        parts = []
        for node in self.nodes:
            if node.proc is None or node.proc.poll() is not None:
                parts.append(f"n{node.index}: not running")
                continue
            try:  # one statement a node: a stuck node costs one timeout, not four
                rows = self.sql(node, "SHOW STATUS WHERE Variable_name IN ("
                                      + ", ".join(f"'{n}'" for n in names) + ")")
            except (GaleraUnavailable, subprocess.TimeoutExpired) as exc:
                parts.append(f"n{node.index}: no answer ({type(exc).__name__})")
                continue
            got = dict(line.split("\t", 1) for line in rows.splitlines() if "\t" in line)
            state, size, queue, paused = (got.get(name, "?") for name in names)
            parts.append(f"n{node.index}: {state}, cluster size {size}, recv queue {queue},"
                         f" flow control paused {paused}")
        return "; ".join(parts)

    def _wait_synced(self, node: GaleraNode, deadline: float) -> None:
        while time.monotonic() < deadline:
            if node.proc is not None and node.proc.poll() is not None:
                # The log's tail goes with the error: stop() removes the directory.
                log = self.base / f"n{node.index}.log"
                tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
                raise GaleraUnavailable(f"node {node.index} exited; the end of {log}:\n"
                                        + "\n".join(tail))
            if self._status(node, "wsrep_local_state_comment") == "Synced":
                return
            time.sleep(0.2)
        raise GaleraUnavailable(f"node {node.index} did not sync in time")

    def _wait_size(self, deadline: float) -> None:
        alive = [n for n in self.nodes if n.proc is not None]
        while time.monotonic() < deadline:
            if all(self._status(n, "wsrep_cluster_size") == str(len(alive)) for n in alive):
                return
            time.sleep(0.2)
        raise GaleraUnavailable("the cluster did not form in time")


def main() -> None:
    cluster = GaleraCluster.create()
    started = time.monotonic()
    cluster.start()
    sys.stdout.write(f"galera up in {time.monotonic() - started:.1f} s:"
                     f" {' '.join(n.url('test') for n in cluster.nodes)} (Ctrl-C stops)\n")
    sys.stdout.flush()
    try:
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()


if __name__ == "__main__":
    os.environ.setdefault("TZ", "UTC")
    main()
