"""What a test's fresh database costs (tests/support/backends.py ``fresh_database``): the
migrations run for real against the clone of the session's template, interleaved in one
process, per backend.

``python -m bench.test_databases --backends sqlite,mysql,galera --iterations 20`` prints
one JSON line per backend and mode (``migrate``: ``clone=False``, what every test paid
before the template; ``clone``: what it pays now) with the median and quartiles of the
setup (database made and migrated) and of the teardown (connections closed, database
dropped; on MariaDB the hand-over to the dropper's thread, whose drops are
``background_drop_s``), and the statements each setup sends (a figure the machine's load
cannot move).
The modes alternate iteration by iteration, so both see the same load; the load average
is printed beside them. Galera starts its own 3-node cluster (~20 s)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from sandbox.galera import GaleraCluster
from storage.dialect import MYSQL, SQLITE
from storage.migrate import load_migrations
from tests.support.backends import DROPPER, fresh_database, use_galera


def _setup_statements(backend: str, clone: bool) -> int:
    """Statements one setup sends (the database's CREATE and the clone's own included)."""
    dialect = SQLITE if backend == "sqlite" else MYSQL
    if clone:
        if backend == "sqlite":
            return 0  # a file copy
        # CREATE DATABASE, USE, SET foreign_key_checks, one CREATE TABLE per table (the
        # ledger's among them), one INSERT for the ledger's rows: one round trip.
        tables = sum(script.upper().count("CREATE TABLE")
                     for script in (m.script for m in load_migrations())) + 1
        return 3 + tables + 1
    # The ledger check and CREATE, then per migration: the ledger read, the claim, its
    # statements and the done mark (BEGIN/COMMIT not counted).
    per_migration = sum(2 + len(dialect.render_ddl(m.script)) + 1 for m in load_migrations())
    return (0 if backend == "sqlite" else 1) + 2 + per_migration


def _quartiles(values: list[float]) -> dict[str, float]:
    q1, median, q3 = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {"median": round(median, 4), "q1": round(q1, 4), "q3": round(q3, 4)}


async def measure(backend: str, iterations: int) -> list[dict[str, object]]:
    times: dict[bool, tuple[list[float], list[float]]] = {False: ([], []), True: ([], [])}
    # The first clone builds the session's template (one real migration): not counted.
    with tempfile.TemporaryDirectory() as warm:
        async with fresh_database(backend, Path(warm)):
            pass
    await trio.to_thread.run_sync(DROPPER.wait)
    first_drop = len(DROPPER.drop_s)
    loads = [os.getloadavg()[0]]
    for n in range(iterations):
        for clone in ((False, True) if n % 2 == 0 else (True, False)):
            with tempfile.TemporaryDirectory() as tmp:
                started = time.perf_counter()
                async with fresh_database(backend, Path(tmp), clone=clone):
                    made = time.perf_counter()
                dropped = time.perf_counter()
            times[clone][0].append(made - started)
            times[clone][1].append(dropped - made)
        loads.append(os.getloadavg()[0])
    # MariaDB's drops run on the dropper's thread, beside the next setups: the teardown
    # above is the hand-over, and what the drops took is their own figure.
    await trio.to_thread.run_sync(DROPPER.wait)
    drops = DROPPER.drop_s[first_drop:]
    background = {"background_drop_s": _quartiles(drops)} if drops else {}
    return [{"system": "test_databases", "backend": backend,
             "mode": "clone" if clone else "migrate", "iterations": iterations,
             "setup_s": _quartiles(setup), "teardown_s": _quartiles(teardown),
             "setup_statements": _setup_statements(backend, clone), **background,
             "load": [round(min(loads), 2), round(max(loads), 2)]}
            for clone, (setup, teardown) in times.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,mysql,galera")
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    for backend in args.backends.split(","):
        cluster = None
        if backend == "galera":
            cluster = GaleraCluster.create(die_with_parent=True)
            cluster.start()
            use_galera(cluster)
        try:
            for line in trio.run(measure, backend, args.iterations):
                print(json.dumps(line), flush=True)
        finally:
            if cluster is not None:
                use_galera(None)
                cluster.stop()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
