"""``python -m sim``: run seeds of the deterministic simulation (``make simulate``).

    python -m sim --seeds 200 [--duration 30]     # seeds 1..200 (or --first N)
    python -m sim --seed 17 [--duration 30]       # replay one seed (--keep DIR: its files)

Prints one JSON line: ``seeds``, ``violations`` (seeds that broke a promise),
``failing_seeds``, ``simulated_s``, ``sim_ops_per_wall_s`` (network exchanges plus
database transactions per wall second), ``trace_digest`` (of the last seed) and
``faults`` (injected, by kind). For each failing seed, stderr gets the command that
replays it and the last events of its trace. Exit status 1 when any seed failed.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

HASH_SEED = "0"


def _reexec_with_fixed_hash_seed(module: str = "sim") -> None:
    """String hashing (set order) must not vary between runs of one seed."""
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        os.environ["PYTHONHASHSEED"] = HASH_SEED
        # The same interpreter and arguments: nothing from outside reaches a shell.
        os.execv(sys.executable, [sys.executable, "-m", module, *sys.argv[1:]])  # noqa: S606


def run_one(seed: int, duration_s: float, keep: Path | None = None) -> dict[str, Any]:
    from sim.world import TRACE_TAIL, Options, run_seed

    started = time.perf_counter()
    try:
        out = run_seed(Options(seed=seed, duration_s=duration_s), keep=keep)
    except BaseException as exc:  # the simulation itself (or code under it) blew up
        if isinstance(exc, KeyboardInterrupt):
            raise
        text = "".join(traceback.format_exception(exc))
        return {"seed": seed, "violations": [{"oracle": "exception",
                                              "error": text[-4000:]}],
                "faults": {}, "ops": 0, "simulated_s": 0.0, "digest": "",
                "wall_s": time.perf_counter() - started, "tail": [], "result": {}}
    world = out["world"]
    return {
        "seed": seed,
        "violations": world.violations,
        "faults": dict(world.faults),
        "ops": world.ops["sends_all"] + world.ops["db_transactions"],
        "simulated_s": world.simulated_s,
        "digest": world.digest.hexdigest(),
        "wall_s": time.perf_counter() - started,
        "tail": world.trace_lines[-TRACE_TAIL:],
        "result": out["result"],
        # What the operators did (replays, rebinds, key rotations, binding moves, ...).
        "operators": {k: v for k, v in sorted(world.ops.items()) if k.startswith("operator_")},
    }


def run_fresh(seed: int, duration_s: float, mutant: str | None) -> subprocess.Popen[str]:
    """One seed in a fresh interpreter (spawned, not forked): exactly what ``python -m sim
    --seed S`` replays, whatever ran before it (a sweep's earlier seeds leave caches, a
    heap and the cyclic collector's counts behind, and nothing may depend on them)."""
    command = [sys.executable, "-m", "sim", "--seed", str(seed),
               "--duration", f"{duration_s:g}", "--seed-json"]
    if mutant is not None:
        command += ["--mutant", mutant]
    # The same interpreter and arguments: nothing from outside reaches a shell.
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True)  # noqa: S603


def collect(child: subprocess.Popen[str], seed: int) -> dict[str, Any]:
    out, _ = child.communicate()
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if child.returncode not in (0, 1) or not lines:
        return {"seed": seed, "violations": [{"oracle": "exception",
                                              "error": f"exit status {child.returncode}"}],
                "faults": {}, "ops": 0, "simulated_s": 0.0, "digest": "", "wall_s": 0.0,
                "tail": [], "result": {}}
    got: dict[str, Any] = json.loads(lines[-1])
    return got


def run_many(seeds: list[int], duration_s: float, mutant: str | None, jobs: int
             ) -> Generator[dict[str, Any], None, None]:
    """Each seed in its own fresh interpreter, ``jobs`` at a time, in seed order."""
    pending = list(seeds)
    running: collections.deque[tuple[int, subprocess.Popen[str]]] = collections.deque()
    try:
        while pending or running:
            while pending and len(running) < max(1, jobs):
                seed = pending.pop(0)
                running.append((seed, run_fresh(seed, duration_s, mutant)))
            seed, child = running.popleft()
            yield collect(child, seed)
    finally:  # the caller stopped early (a mutant caught): the seeds started ahead go
        for _, child in running:
            child.kill()
            child.wait()


def report_failure(got: dict[str, Any], duration_s: float, mutant: str | None = None) -> None:
    seed = got["seed"]
    what = f" MUTANT={mutant}" if mutant else ""
    sys.stderr.write(f"sim: seed {seed} broke a promise: "
                     f"{json.dumps(got['violations'][:5], default=str)}\n"
                     f"sim: replay with: make simulate SEED={seed} DURATION={duration_s:g}{what}\n"
                     "sim: last events before the violation:\n")
    for line in got["tail"]:
        sys.stderr.write(f"  {line}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--seeds", type=int, default=None, help="how many seeds to run")
    parser.add_argument("--first", type=int, default=1, help="the first seed of --seeds")
    parser.add_argument("--seed", type=int, default=None, help="replay exactly this seed")
    parser.add_argument("--duration", type=float, default=30.0,
                        help="simulated seconds of chaos per seed (then everything settles)")
    parser.add_argument("--mutant", default=None,
                        help="run with this named mutant applied (sim/mutants.py)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="with --seed: keep the run's configs, database and spools here")
    parser.add_argument("--jobs", type=int, default=1,
                        help="seeds run side by side (each in its own interpreter)")
    parser.add_argument("--seed-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    _reexec_with_fixed_hash_seed()
    if args.seed is not None:
        seeds = [args.seed]
    else:
        seeds = list(range(args.first, args.first + (args.seeds or 1)))
    faults: collections.Counter[str] = collections.Counter()
    operators: collections.Counter[str] = collections.Counter()
    failing: list[int] = []
    simulated = ops = wall = 0.0
    digest = ""
    from sim.mutants import MUTANTS, applied

    if args.mutant is not None and args.mutant not in MUTANTS:
        parser.error(f"--mutant: one of {', '.join(MUTANTS)}")
    if args.seed is not None:
        with applied(args.mutant):
            results: Iterator[dict[str, Any]] = iter(
                [run_one(args.seed, args.duration, keep=args.keep)])
        if args.seed_json:  # a sweep's child: its parent reports
            got = next(results)
            got.pop("result", None)
            print(json.dumps(got, default=str), flush=True)
            return 0
    else:
        results = run_many(seeds, args.duration, args.mutant, args.jobs)
    for got in results:
        seed = got["seed"]
        faults.update(got["faults"])
        operators.update(got.get("operators") or {})
        simulated += got["simulated_s"]
        ops += got["ops"]
        wall += got["wall_s"]
        digest = got["digest"]
        if got["violations"]:
            failing.append(seed)
            report_failure(got, args.duration, args.mutant)
        elif len(seeds) > 1:
            sys.stderr.write(f"sim: seed {seed} ok ({got['simulated_s']:.0f} simulated s,"
                             f" {got['wall_s']:.1f} wall s)\n")
            sys.stderr.flush()
    line = {"seeds": len(seeds), "violations": len(failing), "failing_seeds": failing,
            "simulated_s": round(simulated, 1),
            "sim_ops_per_wall_s": round(ops / wall, 1) if wall else 0.0,
            "wall_s": round(wall, 1), "trace_digest": digest,
            "faults": dict(sorted(faults.items())),
            "operator_actions": dict(sorted(operators.items()))}
    print(json.dumps(line), flush=True)
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
