"""Client CPU of reading result sets: the adapter's reader (storage/mysql/wire.py) against
trio-mysql's own, on the same statements, interleaved.

    python -m bench.mysql_reader [--rounds 5] [--queries 400]

Creates a scratch database with work_items-shaped rows, then per round runs ``--queries``
statements on each connection (a plain trio-mysql ``Connection`` and a ``FastConnection``)
and prints one JSON line: CPU microseconds per statement on each side and their ratio, for
a wide read (a claim's read-back: 16 rows of 35 columns) and a narrow one (a claim
window: 64 rows of 5 columns) and a point read (1 row). Only the client's CPU
(``time.process_time``) counts, so the server's load hardly moves it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from typing import Any

import trio
import trio_mysql
from trio_mysql.constants import CLIENT

from storage.mysql.wire import FastConnection

URL_HOST, URL_PORT, USER = "127.0.0.1", 3306, "root"
DB = "bench_mysql_reader"
COLUMNS = 35
STATEMENTS = {
    "wide_16x35": "SELECT * FROM t WHERE id < 16",
    "narrow_64x5": "SELECT id, c1, c2, c3, n FROM t WHERE id < 64",
    "point_1x35": "SELECT * FROM t WHERE id = 7",
}


def _connect(cls: Any, database: str | None) -> Any:
    return cls(host=URL_HOST, port=URL_PORT, user=USER, password="", database=database,
               charset="utf8mb4", use_unicode=True, client_flag=CLIENT.FOUND_ROWS,
               autocommit=True)


async def _setup() -> None:
    conn = _connect(trio_mysql.Connection, None)
    await conn.connect()
    cur = conn.cursor()
    with warnings.catch_warnings():  # the server's note that there was none to drop
        warnings.simplefilter("ignore")
        await cur.execute(f"DROP DATABASE IF EXISTS {DB}")
    await cur.execute(f"CREATE DATABASE {DB} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    cols = ", ".join(f"c{i} VARCHAR(64) NULL" for i in range(1, COLUMNS - 1))
    await cur.execute(f"CREATE TABLE {DB}.t (id INT PRIMARY KEY, {cols}, n BIGINT NULL)")
    for i in range(64):
        values = ", ".join("NULL" if j % 3 == 0 else f"'01JF{i:04d}value{j:02d}'"
                           for j in range(1, COLUMNS - 1))
        await cur.execute(f"INSERT INTO {DB}.t VALUES ({i}, {values}, {1733500000000000 + i})")
    await conn.aclose()


async def _cpu_per_statement(conn: Any, sql: str, n: int) -> float:
    cur = conn.cursor()
    started = time.process_time()
    for _ in range(n):
        await cur.execute(sql)
        await cur.fetchall()
    return (time.process_time() - started) / n * 1e6


async def main(rounds: int, queries: int) -> dict[str, Any]:
    await _setup()
    plain, fast = _connect(trio_mysql.Connection, DB), _connect(FastConnection, DB)
    await plain.connect()
    await fast.connect()
    out: dict[str, Any] = {"bench": "bench.mysql_reader", "rounds": rounds, "queries": queries}
    try:
        for name, sql in STATEMENTS.items():
            ours, theirs = [], []
            for _ in range(rounds):
                theirs.append(await _cpu_per_statement(plain, sql, queries))
                ours.append(await _cpu_per_statement(fast, sql, queries))
            ratios = [o / t for o, t in zip(ours, theirs, strict=True)]
            out[name] = {"driver_us": round(statistics.mean(theirs), 1),
                         "ours_us": round(statistics.mean(ours), 1),
                         "ratio": round(statistics.mean(ratios), 3),
                         "ratio_sd": round(statistics.stdev(ratios), 3) if rounds > 1 else 0}
    finally:
        cur = plain.cursor()
        await cur.execute(f"DROP DATABASE IF EXISTS {DB}")
        await plain.aclose()
        await fast.aclose()
    return out


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--queries", type=int, default=400)
    args = parser.parse_args()
    print(json.dumps(trio.run(main, args.rounds, args.queries)))


if __name__ == "__main__":
    run()
