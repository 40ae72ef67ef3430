"""What a benchmark costs the MariaDB server inside InnoDB, statement by statement.

    python -m bench.server_pages [--top 15] -- bench.kernel --backend mysql --replicas 8 \\
        --items 50000 --no-peer

Turns the server's slow log on for every statement, with InnoDB's own figures
(``long_query_time=0``, ``log_slow_verbosity='innodb,query_plan'``), runs the benchmark
module as a child process, turns the log off again, and sums the log by statement shape
(literals and ``IN`` lists folded). It prints one JSON line: the totals and the ``--top``
shapes by page accesses, each with its count, ``Pages_accessed`` (buffer-pool page
accesses), ``Old_rows_read`` (old row versions a consistent read built from undo),
``Rows_examined`` and ``Query_time``.

Page accesses do not depend on the machine's speed, so one run of each side compares
what two versions make the server do (docs/performance.md, "Claims across replicas",
found the claims' extra server work at 8 replicas this way). The log holds every
statement's text: use it on benchmark databases only. The server is the one
``INTEGRATIOND_BENCH_MYSQL_URL`` names; the log is written where the server can write
(``--log``, default a fresh file under /tmp) and removed afterwards unless ``--keep-log``.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import attrs

from bench.kernel import REPO, mysql_admin, mysql_query

FIGURES = ("Query_time", "Rows_examined", "Pages_accessed", "Old_rows_read")
_NUMBER = re.compile(r"\b\d+\b")
_STRING = re.compile(r"'(?:[^'\\]|\\.)*'")
_LIST = re.compile(r"\((?:\s*\?\s*,)+\s*\?\s*\)")
_SPACE = re.compile(r"\s+")
_FIGURE = re.compile(r"(\w+): ([\d.]+)")
# Lines of an entry that are not the statement's text.
_NOT_TEXT = ("#", "SET timestamp=", "use ")


@attrs.frozen
class StatementCost:
    shape: str
    count: int
    figures: dict[str, float]


def shape(statement: str) -> str:
    """The statement with its literals as ``?`` and each ``IN``/``VALUES`` list as one."""
    text = _STRING.sub("?", statement)
    text = _NUMBER.sub("?", text)
    text = _SPACE.sub(" ", text).strip().removesuffix(";").rstrip()
    return _LIST.sub("(?..)", text)


def summarize(lines: Iterable[str]) -> list[StatementCost]:
    """The slow log's entries summed by statement shape, most page accesses first."""
    counts: collections.Counter[str] = collections.Counter()
    sums: dict[str, dict[str, float]] = collections.defaultdict(lambda: dict.fromkeys(FIGURES, 0.0))
    figures = dict.fromkeys(FIGURES, 0.0)
    text: list[str] = []
    entered = False  # the server's header comes before the first entry

    def close() -> None:
        statement = " ".join(text).strip()
        if statement:
            key = shape(statement)
            counts[key] += 1
            for name, value in figures.items():
                sums[key][name] += value
        text.clear()
        figures.update(dict.fromkeys(FIGURES, 0.0))

    for line in lines:
        if line.startswith("# User@Host:"):
            close()
            entered = True
        elif not entered:
            continue
        elif line.startswith("#"):
            for name, value in _FIGURE.findall(line):
                if name in figures:
                    figures[name] += float(value)
        elif not line.startswith(_NOT_TEXT):
            text.append(line.strip())
    close()
    costs = [StatementCost(key, counts[key], sums[key]) for key in counts]
    return sorted(costs, key=lambda c: (-c.figures["Pages_accessed"], c.shape))


def report(costs: list[StatementCost], top: int) -> dict[str, object]:
    totals = {f: round(sum(c.figures[f] for c in costs), 3) for f in FIGURES}
    return {
        "statements": sum(c.count for c in costs),
        "totals": totals,
        "top": [{"shape": c.shape[:300], "count": c.count,
                 **{f: round(v, 3) for f, v in c.figures.items()}} for c in costs[:top]],
    }


def last_json(output: str) -> object:
    """The benchmark's last line, if it is a JSON document (each ``bench.*`` ends so)."""
    lines = output.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None


def slow_log_path(named: Path | None) -> tuple[Path, bool]:
    """(where the server writes its slow log, whether the directory is this run's own).
    The server writes the log as its own user: a fresh directory of ours is opened to it;
    a directory the caller named is left as it is (making it writable is the caller's
    choice: /tmp, say, must keep its sticky bit)."""
    if named is not None:
        return named, False
    own = Path(tempfile.mkdtemp(prefix="server-pages-"))
    own.chmod(0o777)
    return own / "slow.log", True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--log", type=Path, default=None,
                        help="slow log path (the server must be able to write it)")
    parser.add_argument("--keep-log", action="store_true")
    parser.add_argument("bench", nargs=argparse.REMAINDER,
                        help="-- then the benchmark module and its arguments")
    args = parser.parse_args(argv)
    command = args.bench[1:] if args.bench[:1] == ["--"] else args.bench
    if not command:
        parser.error("give the benchmark after --, e.g. -- bench.kernel --backend mysql")
    log, own_directory = slow_log_path(args.log)
    before = mysql_query("SELECT @@GLOBAL.slow_query_log, @@GLOBAL.slow_query_log_file,"
                         " @@GLOBAL.long_query_time, @@GLOBAL.log_slow_verbosity")
    mysql_admin(f"SET GLOBAL slow_query_log_file = '{log}'; SET GLOBAL long_query_time = 0;"
                " SET GLOBAL log_slow_verbosity = 'innodb,query_plan';"
                " SET GLOBAL slow_query_log = 1")
    try:
        bench = subprocess.run([sys.executable, "-m", *command], cwd=REPO,
                               capture_output=True, text=True, check=False)
    finally:
        enabled, path, long_query_time, verbosity = before
        mysql_admin(f"SET GLOBAL slow_query_log = {int(enabled)};"
                    f" SET GLOBAL slow_query_log_file = '{path}';"
                    f" SET GLOBAL long_query_time = {float(long_query_time)};"
                    f" SET GLOBAL log_slow_verbosity = '{verbosity}'")
    with log.open(errors="replace") as lines:
        result = report(summarize(lines), args.top)
    if not args.keep_log:
        log.unlink(missing_ok=True)
        if own_directory:
            log.parent.rmdir()
    print(json.dumps({"bench": command, "exit": bench.returncode,
                      "bench_result": last_json(bench.stdout), **result}))
    if bench.returncode:
        sys.stderr.write(bench.stderr[-4000:])
        raise SystemExit(bench.returncode)


if __name__ == "__main__":
    main()
