"""Run ``integrationd`` counting every SQL statement it sends, by transaction and text.

    python -m bench.sql_tally OUT.json --config replica.toml run

Wraps the MySQL adapter's transaction (``_MysqlTx``) so that every statement, BEGIN and
COMMIT is counted under the name of the transaction that sent it and the statement's
first words; at exit it writes ``{"by_statement": {...}, "by_transaction": {...},
"round_trips": N, "rows_by_statement": {...}, "params_by_statement": {...}}`` to
OUT.json. Counts do not depend on the machine's load: the
benchmarks use this for ``BENCH_SQL_TALLY_DIR`` (replica 0), and ``--tally FILE``
prints them per effect. Each SIGUSR1 keeps a copy of the counts by transaction so far
(``"snapshots"`` in OUT.json): ``bench.kernel`` sends one just before it releases the
items and one once they are drained, so that the difference is the drain's alone.
"""

from __future__ import annotations

import collections
import json
import re
import signal
import sys
from typing import Any

from daemon.cli import main
from storage.mysql import adapter

_WORDS = re.compile(r"\s+")


def _key(name: str, sql: str | bytes) -> str:
    text = sql.decode("utf-8", "replace") if isinstance(sql, bytes) else sql
    return f"{name}: {_WORDS.sub(' ', text).strip()[:90]}"


def install(tally: collections.Counter[str], by_tx: collections.Counter[str],
            rows: collections.Counter[str] | None = None,
            params: collections.Counter[str] | None = None) -> None:
    tx_class: Any = adapter._MysqlTx
    params_out = params
    execute, fetchall, send, begin = (tx_class.execute, tx_class.fetchall, tx_class._send,
                                      tx_class.begin)
    database: Any = adapter.MysqlDatabase
    commit, attempt = database._commit, database._attempt

    async def counted_execute(self: Any, sql: str, params: Any = ()) -> int:
        tally[_key(self._name, sql)] += 1
        if params_out is not None:
            params_out[_key(self._name, sql)] += len(params)
        return int(await execute(self, sql, params))

    async def counted_fetchall(self: Any, sql: str, params: Any = ()) -> Any:
        tally[_key(self._name, sql)] += 1
        found = await fetchall(self, sql, params)
        if rows is not None:
            rows[_key(self._name, sql)] += len(found)
        if params_out is not None:
            params_out[_key(self._name, sql)] += len(params)
        return found

    async def counted_send(self: Any, statement: bytes) -> int:
        tally[_key(self._name, statement[:200])] += 1
        return int(await send(self, statement))

    async def counted_begin(self: Any) -> None:
        tally[f"{self._name}: BEGIN"] += 1
        await begin(self)

    async def counted_commit(self: Any, conn: Any, name: str) -> bool:
        tally[f"{name}: COMMIT"] += 1
        return bool(await commit(self, conn, name))

    async def counted_attempt(self: Any, body: Any, name: str, write: bool) -> Any:
        by_tx[name] += 1
        return await attempt(self, body, name, write)

    tx_class.execute, tx_class.fetchall, tx_class._send = (counted_execute, counted_fetchall,
                                                           counted_send)
    tx_class.begin = counted_begin
    database._commit, database._attempt = counted_commit, counted_attempt


def run() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    sys.argv = ["integrationd", *args]
    tally: collections.Counter[str] = collections.Counter()
    by_tx: collections.Counter[str] = collections.Counter()
    rows: collections.Counter[str] = collections.Counter()
    params: collections.Counter[str] = collections.Counter()
    install(tally, by_tx, rows, params)
    snapshots: list[dict[str, int]] = []
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: snapshots.append(dict(by_tx)))
    try:
        main()
    except SystemExit:
        pass
    finally:
        with open(out, "w") as f:
            json.dump({"round_trips": sum(tally.values()),
                       "by_transaction": dict(by_tx.most_common()),
                       "snapshots": snapshots,
                       "by_statement": dict(tally.most_common()),
                       # Rows each statement's result sets carried, and the parameters
                       # bound to it (multi-row INSERTs, already formatted, are not
                       # counted there).
                       "rows_by_statement": dict(rows.most_common()),
                       "params_by_statement": dict(params.most_common())}, f, indent=1)


if __name__ == "__main__":
    run()
