"""The peer for ``bench/ingress.py``: the webhook endpoint a team would otherwise write.

    python -m bench.ingress_peer CONFIG.json

Starlette on uvicorn; ``POST /hooks/{route}`` reads the body, checks the hex HMAC-SHA256
of the raw body in constant time, and inserts the receipt (id, dedup key = SHA-256 of the
body, the body, received time) with a synchronous driver (``sqlite3``, or PyMySQL for
MariaDB) in Starlette's thread pool, one connection per thread, one commit per delivery;
a duplicate key answers 200 too. What it leaves out: a per-request deadline, content-type
and size limits, the spool when the database is late, a derived dedup identity, safe-header
selection, metrics.

CONFIG.json: ``{"backend": "sqlite"|"mysql", "dsn": path or mysql URL, "port", "secret"}``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import sqlite3
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

SCHEMA_SQLITE = ("CREATE TABLE IF NOT EXISTS peer_receipts (receipt_id TEXT PRIMARY KEY,"
                 " dedup_key TEXT NOT NULL UNIQUE, body BLOB NOT NULL,"
                 " received_at_us INTEGER NOT NULL)")
SCHEMA_MYSQL = ("CREATE TABLE IF NOT EXISTS peer_receipts (receipt_id VARCHAR(32) PRIMARY KEY,"
                " dedup_key VARCHAR(64) NOT NULL UNIQUE, body MEDIUMBLOB NOT NULL,"
                " received_at_us BIGINT NOT NULL) ENGINE=InnoDB")


def _connect(cfg: dict[str, Any]) -> Any:
    if cfg["backend"] == "sqlite":
        conn = sqlite3.connect(cfg["dsn"], timeout=10, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        return conn
    import pymysql

    url = urlsplit(cfg["dsn"])
    return pymysql.connect(host=url.hostname, port=url.port or 3306, user=url.username,
                           database=url.path.strip("/"), autocommit=False)


def apply_schema(cfg: dict[str, Any]) -> None:
    conn = _connect(cfg)
    if cfg["backend"] == "sqlite":
        conn.execute(SCHEMA_SQLITE)
    else:
        with conn.cursor() as cur:
            cur.execute(SCHEMA_MYSQL)
        conn.commit()
    conn.close()


def build_app(cfg: dict[str, Any]) -> Any:
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    secret = cfg["secret"].encode()
    local = threading.local()

    def insert(body: bytes) -> str:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = local.conn = _connect(cfg)
        row = (uuid.uuid4().hex, hashlib.sha256(body).hexdigest(), body,
               time.time_ns() // 1000)
        if cfg["backend"] == "sqlite":
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("INSERT INTO peer_receipts VALUES (?, ?, ?, ?)", row)
                conn.execute("COMMIT")
            except sqlite3.IntegrityError:
                conn.execute("ROLLBACK")
                return "duplicate"
            return "stored"
        import pymysql

        try:
            with conn.cursor() as cur:
                cur.execute("INSERT INTO peer_receipts VALUES (%s, %s, %s, %s)", row)
            conn.commit()
        except pymysql.err.IntegrityError:
            conn.rollback()
            return "duplicate"
        return "stored"

    async def hook(request: Request) -> JSONResponse:
        body = await request.body()
        supplied = request.headers.get("outreach-webhook-signature", "")
        wanted = hmac.new(secret, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(wanted, supplied):
            return JSONResponse({"code": "bad_signature"}, status_code=401)
        result = await run_in_threadpool(insert, body)
        return JSONResponse({"code": result})

    return Starlette(routes=[Route("/hooks/{route}", hook, methods=["POST"])])


def main() -> None:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    apply_schema(cfg)
    import uvicorn

    # Exit with the parent (the benchmark) if it goes away.
    parent = os.getppid()

    def watch_parent() -> None:
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(0)

    threading.Thread(target=watch_parent, daemon=True).start()
    uvicorn.run(build_app(cfg), host="127.0.0.1", port=int(cfg["port"]), log_level="warning",
                access_log=False)


if __name__ == "__main__":
    main()
