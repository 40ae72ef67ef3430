"""Run ``integrationd`` under cProfile counting CPU time, not wall time.

    python -m bench.profile_replica OUT.prof --config replica.toml run

``python -m cProfile`` charges a replica for the time it sits in ``send()``
while the kernel runs the receiving process; a CPU-time clock shows where its
own cycles go. The benchmarks use this for ``BENCH_PROFILE_DIR``.
"""

from __future__ import annotations

import cProfile
import sys
import time

from daemon.cli import main


def run() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    sys.argv = ["integrationd", *args]
    profile = cProfile.Profile(time.process_time)
    try:
        profile.runcall(main)
    except SystemExit:
        pass
    finally:
        profile.dump_stats(out)


if __name__ == "__main__":
    run()
