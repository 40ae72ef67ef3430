"""A plain MariaDB connection beside the code under test: what a monitoring session
(another client of the server) sees while replicas hold transactions open."""

from __future__ import annotations

import trio_mysql

from storage.mysql.adapter import MysqlTarget


async def mysql_connect(url: str) -> trio_mysql.connections.Connection:
    target = MysqlTarget.from_url(url)
    conn = trio_mysql.connect(host=target.host, port=target.port, user=target.user,
                              password=target.password, database=target.database,
                              autocommit=True)
    await conn.connect()
    return conn


async def mysql_rows(conn: trio_mysql.connections.Connection, sql: str,
                     args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    cur = conn.cursor()
    await cur.execute(sql, args)
    return list(await cur.fetchall())
