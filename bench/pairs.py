"""Interleaved pairs: one benchmark, this tree against another commit, alternating.

This machine's speed changes by the minute, so a before/after figure is only honest
from runs interleaved in one session. ``python -m bench.pairs --pairs 4 --against REF
-- bench.effects --replicas 4 --effects 2000 --noop-items 0 --no-peer`` runs the
benchmark module in this tree, then in REF (a directory holding another checkout, or
a commit, checked out once into ``var/bench-worktrees/``), four times each, ours
first in odd pairs and theirs first in even ones. It samples the load average every
5 s during each run and prints one JSON line: every numeric figure of each side (mean,
sample standard deviation, values), the ratio ours / theirs per pair (mean and spread),
and the load during each run. Each benchmark's own peer ratio (ours against
procrastinate in the same run) is one of its figures.

Every ``bench.*`` module also takes ``--pairs N [--against REF]`` itself and hands
over to this module (see :func:`delegate`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _flatten(prefix: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, int | float):
        out[prefix] = float(value)
    elif isinstance(value, dict):
        for key, inner in value.items():
            _flatten(f"{prefix}.{key}" if prefix else str(key), inner, out)


def figures(stdout: str) -> dict[str, float]:
    """Every numeric figure of a benchmark's JSON lines, by dotted name (a line that
    names its ``system`` is prefixed with it, so several lines never collide)."""
    out: dict[str, float] = {}
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    for n, line in enumerate(lines):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if not isinstance(doc, dict):
            continue
        # A line names what it measured: its system and, where a benchmark prints one
        # line per backend, mode or rate, those too (so no two lines collide).
        parts = [str(doc[k]) for k in ("system", "backend", "mode") if doc.get(k)]
        if "rate" in doc and not isinstance(doc["rate"], bool):
            parts.append(f"rate{doc['rate']}")
        if doc.get("summary") is True:
            parts.append("summary")
        _flatten(".".join(parts) if parts else (f"line{n}" if n else ""), doc, out)
    return out


def checkout(ref: str) -> Path:
    """REF as a directory: itself if it is one, else a detached worktree of the commit."""
    if Path(ref).is_dir():
        return Path(ref).resolve()
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                         capture_output=True, text=True, check=True).stdout.strip()
    path = REPO / "var" / "bench-worktrees" / sha[:12]
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), sha],
                       capture_output=True, check=True)
    return path


class LoadSampler:
    """The 1-minute load average every ``interval_s`` while a run goes."""

    def __init__(self, interval_s: float = 5.0) -> None:
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])


def run_once(tree: Path, module_args: Sequence[str], timeout_s: float) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    started = time.monotonic()
    with LoadSampler() as load:
        done = subprocess.run([sys.executable, "-m", *module_args], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise SystemExit(f"bench.pairs: {' '.join(module_args)} in {tree} exited"
                         f" {done.returncode}:\n{done.stderr[-2000:]}")
    return {"figures": figures(done.stdout), "wall_s": round(time.monotonic() - started, 1),
            "load": [round(min(load.samples), 2), round(max(load.samples), 2)]}


def _spread(values: list[float]) -> dict[str, Any]:
    return {"mean": round(statistics.fmean(values), 4),
            "sd": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
            "values": [round(v, 4) for v in values]}


def summarize(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and spread of every figure both sides have, and of the per-pair ratio."""
    names = sorted(set.intersection(*(set(r["figures"]) for r in ours + theirs)))
    out: dict[str, Any] = {"ours": {}, "theirs": {}, "ratio": {}}
    for name in names:
        a = [r["figures"][name] for r in ours]
        b = [r["figures"][name] for r in theirs]
        out["ours"][name], out["theirs"][name] = _spread(a), _spread(b)
        if all(v != 0 for v in b):
            out["ratio"][name] = _spread([x / y for x, y in zip(a, b, strict=True)])
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="Run a benchmark module as interleaved pairs against another commit.",
        usage="python -m bench.pairs [--pairs N] [--against REF] -- bench.MODULE [ARGS...]")
    parser.add_argument("--pairs", type=int, default=4, help="pairs of runs (default 4)")
    parser.add_argument("--against", default="HEAD",
                        help="another checkout's directory, or a commit (default HEAD)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per run")
    parser.add_argument("module", nargs=argparse.REMAINDER,
                        help="the benchmark module and its arguments, after --")
    args = parser.parse_args(argv)
    module_args = [a for a in args.module if a != "--"] if args.module[:1] == ["--"] \
        else list(args.module)
    if not module_args or not module_args[0].startswith("bench."):
        parser.error("name a benchmark module after --, for example: -- bench.effects")
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    other = checkout(args.against)
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    for pair in range(args.pairs):
        order = [(REPO, ours), (other, theirs)]
        for tree, side in order if pair % 2 == 0 else reversed(order):
            side.append(run_once(tree, module_args, args.timeout))
            print(f"bench.pairs: pair {pair + 1}/{args.pairs}"
                  f" {'ours' if tree == REPO else 'theirs'} done in {side[-1]['wall_s']} s,"
                  f" load {side[-1]['load']}", file=sys.stderr, flush=True)
    result = {"bench": module_args[0], "args": module_args[1:], "pairs": args.pairs,
              "ours_tree": str(REPO), "theirs_tree": str(other),
              "load_ours": [r["load"] for r in ours],
              "load_theirs": [r["load"] for r in theirs],
              **summarize(ours, theirs)}
    print(json.dumps(result), flush=True)


def delegate(module: str, argv: Sequence[str] | None = None) -> None:
    """For a benchmark's ``main``: when its arguments hold ``--pairs N`` (and perhaps
    ``--against REF``), run it as interleaved pairs through this module and exit."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--pairs" not in argv and not any(a.startswith("--pairs=") for a in argv):
        return
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--pairs", type=int, required=True)
    pre.add_argument("--against", default="HEAD")
    known, rest = pre.parse_known_args(argv)
    main(["--pairs", str(known.pairs), "--against", known.against, "--", module, *rest])
    raise SystemExit(0)


if __name__ == "__main__":
    main()
