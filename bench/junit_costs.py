"""Where a test run's time went, from its JUnit XML (``.ci/run`` writes
``var/ci/junit.xml``; each test's time there is its setup, call and teardown together).

``python -m bench.junit_costs var/ci/junit.xml`` prints one JSON line: the total, the time
by directory, by file (the slowest), by backend parameter (``sqlite``, ``mysql``,
``galera`` or none) with the number of tests of each, and the slowest tests. With
``--saving mysql=0.30 --saving galera=0.40`` (seconds saved per test of that backend, as
``bench.test_databases`` measures them) it also prints the total those savings leave."""

from __future__ import annotations

import argparse
import json
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path
from typing import Any

_BACKEND = re.compile(r"[\[-](sqlite|mysql|galera)[\]-]")


def backend_of(name: str, classname: str) -> str:
    """The backend a test ran on, by its parameter id (test_faults is MariaDB-only)."""
    found = _BACKEND.search(name)
    if found:
        return found.group(1)
    if "test_faults" in classname or "test_hung_database" in classname:
        return "mysql"
    return "none"


def costs(path: Path, *, top: int = 25, savings: dict[str, float] | None = None
          ) -> dict[str, Any]:
    cases = list(ET.parse(path).getroot().iter("testcase"))
    by_dir: dict[str, float] = defaultdict(float)
    by_file: dict[str, float] = defaultdict(float)
    by_backend: dict[str, list[float]] = defaultdict(list)
    tests: list[tuple[float, str]] = []
    for case in cases:
        seconds = float(case.get("time", "0"))
        classname = case.get("classname", "")
        name = case.get("name", "")
        parts = classname.split(".")
        module = ".".join(p for p in parts if not p[:1].isupper())
        by_dir[".".join(parts[:2])] += seconds
        by_file[module] += seconds
        by_backend[backend_of(name, classname)].append(seconds)
        tests.append((seconds, f"{module}::{name}"))
    total = sum(s for s, _ in tests)
    out: dict[str, Any] = {
        "tests": len(cases), "total_s": round(total, 1),
        "by_dir": {k: round(v, 1) for k, v in sorted(by_dir.items(), key=lambda kv: -kv[1])},
        "by_file": {k: round(v, 1) for k, v in
                    sorted(by_file.items(), key=lambda kv: -kv[1])[:top]},
        "by_backend": {k: {"tests": len(v), "total_s": round(sum(v), 1)}
                       for k, v in sorted(by_backend.items())},
        "slowest": [{"test": t, "s": round(s, 1)} for s, t in sorted(tests, reverse=True)[:top]],
    }
    if savings:
        saved = sum(len(by_backend.get(b, [])) * s for b, s in savings.items())
        out["savings"] = {"per_test_s": savings, "saved_s": round(saved, 1),
                          "total_after_s": round(total - saved, 1)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("junit", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--saving", action="append", default=[], metavar="BACKEND=SECONDS")
    args = parser.parse_args()
    savings = {b: float(s) for b, s in (item.split("=", 1) for item in args.saving)}
    print(json.dumps(costs(args.junit, top=args.top, savings=savings or None)))


if __name__ == "__main__":
    main()
