"""Claim transactions left open by a frozen process, found before the rollback fence.

Theory of operation
-------------------
The rollback fence is one UPDATE over the family's unstarted rows. A replica
frozen (SIGSTOP, a hung VM, a debugger) after its claim UPDATE but before its
COMMIT holds those rows' locks with nothing left to release them: the fence
would wait on them until its statement timeout, and the operator would hear
"no answer to a statement" instead of who blocks the rollback.

So before the fence's transaction the step looks for such claims. On a
MySQL-family server a READ UNCOMMITTED read sees an open claim's uncommitted
rows -- ``processing`` under the claim's own lease owner (the replica id) and
token -- while a committed read still sees them unstarted. A healthy claim
commits within milliseconds; one seen again, the same row under the same token,
after :data:`GRACE_S` is open past any claim's business: a blocker, named by its
replica and its items, with the server's own view of the connections idle inside
a transaction on this database (connection id, client address, how long idle),
which is what an operator needs to KILL it when the process cannot be stopped.
The decision is still the step's: this only keeps it from waiting.

The server's view is read live: the transaction list of ``SHOW ENGINE INNODB
STATUS`` (transaction, ``ACTIVE n sec``, thread id) joined with
``information_schema.processlist`` (a connection's database, command and idle
seconds, computed per query). Not ``information_schema.innodb_trx``: InnoDB
serves that from a cache it refreshes only after 100 ms without readers, so
while a monitor polls it faster it shows a snapshot from before the frozen claim
began (the frozen-replica test timed out on exactly that). Both need the PROCESS
privilege; without it (or on a server without InnoDB's monitor, TiDB) the
blocker names the replica and its items only.

On Galera the same holds on the node the frozen replica's connection is on (its
row locks are that node's): a rollback through that node is refused the same
way. A rollback through another node neither sees the uncommitted rows nor waits
for them: its fence commits, and applying it on the frozen replica's node
aborts the frozen claim (Galera's brute-force abort of a local transaction that
conflicts with an applied one), which never committed. No test here runs a
frozen replica on Galera: this paragraph is Galera's documented behaviour.

SQLite has one writer: a process frozen inside any write transaction holds the
whole database, and no other connection can read its uncommitted rows. There
the step's own wait for the write lock is what reports it (as before).
"""

from __future__ import annotations

import re

import attrs
import trio

from storage.port import Database, SqlTx, StorageError
from storage.work_rows import placeholders

# A claim transaction is milliseconds of statements; one still open this much later
# is held by a process that stopped between its UPDATE and its COMMIT.
GRACE_S = 1.0


@attrs.frozen
class OpenClaims:
    owners: tuple[str, ...] = ()   # replicas (lease owners) whose claims are open
    items: int = 0                 # rows those claims hold
    sessions: tuple[str, ...] = ()  # the server's idle-in-transaction connections

    def described(self) -> tuple[str, ...]:
        """The blocker's phrase: who holds how many rows, and the server's view."""
        if not self.owners:
            return ()
        who = ("replica " if len(self.owners) == 1 else "replicas ") + ", ".join(self.owners)
        where = f" (server: {'; '.join(self.sessions)})" if self.sessions else ""
        return (f"{who} {'holds' if len(self.owners) == 1 else 'hold'} {self.items}"
                f" item{'' if self.items == 1 else 's'} claimed but uncommitted{where}",)


async def _uncommitted(db: Database, family: str) -> dict[tuple[str, str], str]:
    """(work id, lease token) -> lease owner of rows an open transaction claimed."""

    async def body(tx: SqlTx) -> dict[tuple[str, str], str]:
        # Applies to the next statement only (reads run in autocommit).
        await tx.execute("SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
        dirty = await tx.fetchall(
            "SELECT work_id, lease_token, lease_owner FROM work_items"
            " WHERE family = ? AND state = 'processing'", (family,))
        committed = await tx.fetchall(
            "SELECT work_id, lease_token FROM work_items"
            " WHERE family = ? AND state = 'processing'", (family,))
        seen = {(str(r[0]), str(r[1])) for r in committed}
        return {(str(r[0]), str(r[1])): str(r[2]) for r in dirty
                if (str(r[0]), str(r[1])) not in seen}

    return await db.transact(body, name="cutover.open_claims", write=False)


# One transaction of SHOW ENGINE INNODB STATUS's list: its age and its connection.
_INNODB_TRANSACTION = re.compile(
    r"^---TRANSACTION \d+, ACTIVE (\d+) sec.*?\n(?:(?!---TRANSACTION).*\n)*?"
    r"\w+ thread id (\d+),", re.MULTILINE)


def open_transactions(innodb_status: str) -> dict[int, int]:
    """Connection (thread) id -> seconds its transaction has been active, from the
    TRANSACTIONS section of ``SHOW ENGINE INNODB STATUS`` (started ones only)."""
    return {int(m[2]): int(m[1]) for m in _INNODB_TRANSACTION.finditer(innodb_status)}


async def _idle_sessions(db: Database, older_than_s: float) -> tuple[str, ...]:
    """This database's connections idle inside a transaction (needs PROCESS)."""

    async def body(tx: SqlTx) -> tuple[str, ...]:
        status = await tx.fetchall("SHOW ENGINE INNODB STATUS")
        active = open_transactions(_text(status[0][2])) if status else {}
        old = sorted(thread for thread, age in active.items() if age >= int(older_than_s))
        if not old:
            return ()
        rows = await tx.fetchall(
            "SELECT id, host, time FROM information_schema.processlist"
            f" WHERE db = DATABASE() AND command = 'Sleep' AND id IN ({placeholders(len(old))})"
            " ORDER BY time DESC, id", tuple(old))
        return tuple(f"connection {r[0]} from {_text(r[1])} idle in a transaction for"
                     f" {r[2]} s" for r in rows)

    try:
        return await db.transact(body, name="cutover.idle_sessions", write=False)
    except StorageError:  # no PROCESS privilege, or a server without InnoDB's monitor
        return ()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def find_open_claims(db: Database, family: str, grace_s: float = GRACE_S
                           ) -> OpenClaims:
    """Claims of ``family`` still uncommitted after ``grace_s`` (MySQL family only)."""
    if db.backend != "mysql":
        return OpenClaims()
    first = await _uncommitted(db, family)
    if not first:
        return OpenClaims()
    await trio.sleep(grace_s)
    again = await _uncommitted(db, family)
    stuck = {k: owner for k, owner in first.items() if again.get(k) == owner}
    if not stuck:
        return OpenClaims()
    return OpenClaims(owners=tuple(sorted(set(stuck.values()))), items=len(stuck),
                      sessions=await _idle_sessions(db, grace_s))
