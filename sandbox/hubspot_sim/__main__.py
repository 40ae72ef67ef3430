"""``python -m sandbox.hubspot_sim``: run the HubSpot simulator as its own process.

Tokens come from ``--token-file`` (one per line; blank lines and ``#`` comments
ignored) and/or the ``HUBSPOT_SIM_TOKEN`` environment variable (whitespace
separated), never from the command line, where ``ps`` would show them. When the
server is listening it writes one JSON line to stderr::

    {"event":"hubspot_sim_listening","host":"127.0.0.1","port":8791}

SIGTERM or SIGINT stops it with exit code 0. A user error (no tokens, unreadable
token file, address in use) is one JSON line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import trio

from sandbox.hubspot_sim.simulator import HubSpotSimulator

TOKEN_ENV = "HUBSPOT_SIM_TOKEN"  # noqa: S105 (the variable's name, not a secret)


class UsageError(Exception):
    """A mistake the person running the simulator can fix; printed as one line."""


def load_tokens(token_file: Path | None, environ: Mapping[str, str]) -> set[str]:
    """Valid bearer tokens from the token file and the environment variable."""
    tokens = set(environ.get(TOKEN_ENV, "").split())
    if token_file is not None:
        try:
            text = token_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot read --token-file {token_file}: {exc.strerror}") from exc
        for line in text.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                tokens.add(line)
    if not tokens:
        raise UsageError(f"no tokens: pass --token-file PATH or set {TOKEN_ENV}")
    return tokens


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sandbox.hubspot_sim",
        description="HubSpot contacts API simulator with fault injection (loopback only).",
    )
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default: %(default)s)"
    )
    parser.add_argument(
        "--port", type=int, default=8791, help="port to bind; 0 picks one (default: %(default)s)"
    )
    parser.add_argument(
        "--token-file",
        type=Path,
        help=f"file of valid bearer tokens, one per line (or set {TOKEN_ENV})",
    )
    parser.add_argument(
        "--seed-contacts",
        type=int,
        default=0,
        metavar="N",
        help='create contacts "1".."N" with jobtitle null (default: %(default)s)',
    )
    return parser


def _event(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}, separators=(",", ":")), file=sys.stderr,
          flush=True)


async def _serve(sim: HubSpotSimulator, host: str, port: int) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(sim.run, host, port)
            _event("hubspot_sim_listening", host=host, port=bound)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break


def _first_error(group: BaseExceptionGroup[OSError]) -> OSError:
    first = group.exceptions[0]
    return first if isinstance(first, OSError) else _first_error(first)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.seed_contacts < 0:
            raise UsageError("--seed-contacts must be >= 0")
        sim = HubSpotSimulator(tokens=load_tokens(args.token_file, os.environ))
    except UsageError as exc:
        _event("hubspot_sim_usage_error", error=str(exc))
        return 2
    for n in range(1, args.seed_contacts + 1):
        sim.add_contact(str(n), jobtitle=None)
    bind_error: OSError | None = None
    try:
        trio.run(_serve, sim, args.host, args.port)
    except* OSError as group:  # e.g. address in use: the operator's to fix, not a bug
        # trio's nursery wraps the bind failure in an ExceptionGroup; report the cause.
        bind_error = _first_error(group)
    if bind_error is not None:
        _event("hubspot_sim_bind_failed", host=args.host, port=args.port, error=str(bind_error))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
