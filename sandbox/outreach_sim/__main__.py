"""``python -m sandbox.outreach_sim``: run the Outreach simulator as its own process.

Bearer tokens come from ``--token-file`` (one per line) and/or ``OUTREACH_SIM_TOKEN``
(whitespace separated), never from the command line. When listening it writes one JSON
line to stderr: ``{"event":"outreach_sim_listening","host":...,"port":...}``. SIGTERM or
SIGINT stops it (exit 0); a user error is one JSON line and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import trio

from sandbox.outreach_sim.simulator import OutreachSimulator

TOKEN_ENV = "OUTREACH_SIM_TOKEN"  # noqa: S105 (the variable's name, not a secret)


def _event(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}, separators=(",", ":")), file=sys.stderr,
          flush=True)


def _tokens(token_file: Path | None) -> set[str]:
    tokens = set(os.environ.get(TOKEN_ENV, "").split())
    if token_file is not None:
        text = token_file.read_text(encoding="utf-8")
        tokens |= {line.strip() for line in text.splitlines()
                   if line.strip() and not line.strip().startswith("#")}
    return tokens


async def _serve(sim: OutreachSimulator, host: str, port: int) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(sim.run, host, port)
            _event("outreach_sim_listening", host=host, port=bound)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sandbox.outreach_sim",
                                     description="Outreach API v2 simulator (loopback).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8793)
    parser.add_argument("--token-file", type=Path)
    parser.add_argument("--seed-prospects", type=int, default=0, metavar="N")
    args = parser.parse_args(argv)
    try:
        tokens = _tokens(args.token_file)
    except OSError as exc:
        _event("outreach_sim_usage_error", error=f"cannot read --token-file: {exc.strerror}")
        return 2
    if not tokens:
        _event("outreach_sim_usage_error",
               error=f"no tokens: pass --token-file PATH or set {TOKEN_ENV}")
        return 2
    sim = OutreachSimulator(tokens=tokens)
    for n in range(1, max(args.seed_prospects, 0) + 1):
        sim.put_prospect({"firstName": f"P{n}", "title": None}, prospect_id=n)
    failed: BaseException | None = None
    try:
        trio.run(_serve, sim, args.host, args.port)
    except* OSError as group:  # e.g. address in use: the operator's to fix
        failed = group.exceptions[0]
    if failed is not None:
        _event("outreach_sim_bind_failed", host=args.host, port=args.port, error=str(failed))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
