"""The demo's own entry point: ``python -m sandbox [--config PATH] [--leads N]
[--interval S] [--inbound-interval S]``.

It runs the HubSpot and Outreach simulators, the reference Runtime and the
reference legacy claimant's table (``legacy_events``, the owner the
``[[legacy_claimants]]`` example describes) against the same configuration the
replicas read (see :mod:`sandbox.demo`). Production code never imports the
sandbox: this module is where the demo is wired to a configuration, beside the
``integrationd`` CLI, not inside it. Exit 2 with one line for a configuration
mistake; SIGTERM or SIGINT stops it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

import trio

from config.catalog import CatalogError, load_catalog
from config.load import ConfigError, load_settings
from config.settings import Settings
from daemon.services import logs
from daemon.services.families import known_family_names
from sandbox.demo import run_sandbox
from sandbox.legacy import store as legacy
from storage.migrate import check_schema
from storage.open import open_store
from storage.port import StorageError

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sandbox",
        description="the provider simulators, the reference Runtime and the reference legacy"
                    " claimant (demo, tests, benchmarks)")
    p.add_argument("--config", metavar="PATH", default=os.environ.get("INTEGRATIOND_CONFIG"),
                   help="the replicas' TOML settings (default: $INTEGRATIOND_CONFIG)")
    p.add_argument("--log-level", default="INFO",
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--leads", type=int, default=5,
                   help="Leads (and contacts, and Prospects) to seed")
    p.add_argument("--interval", type=float, default=1.0,
                   help="seconds between title changes (0: no traffic)")
    p.add_argument("--inbound-interval", type=float, default=3.0,
                   help="seconds between remote changes sent as webhooks (0: none)")
    return p


async def serve(settings: Settings, args: argparse.Namespace) -> int:
    password = settings.storage.password.reveal() if settings.storage.password else None
    store = await open_store(
        settings.storage.url, password=password, pool_size=settings.storage.pool_size,
        sqlite_synchronous=settings.storage.sqlite_synchronous, base_dir=settings.base_dir,
        connect_timeout_s=settings.storage.connect_timeout,
        statement_timeout_s=settings.storage.statement_timeout)
    try:
        await check_schema(store.db, store.dialect)
        await legacy.install(store)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                async def stop_on_signal() -> None:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()

                nursery.start_soon(stop_on_signal)
                await run_sandbox(settings, store, leads=args.leads, interval_s=args.interval,
                                  inbound_interval_s=args.inbound_interval)
    finally:
        await store.db.aclose()
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logs.configure(args.log_level)
    try:
        settings = load_settings(args.config, known_families=known_family_names())
        load_catalog(settings)
        return trio.run(serve, settings, args)
    except BaseException as exc:  # one line and an exit code, or re-raised (a bug)
        leaf = _leaf(exc)
        if isinstance(leaf, ConfigError | CatalogError):  # some are found late, in the demo
            sys.stderr.write(f"sandbox: config error: {leaf}\n")
            return EXIT_USAGE
        if isinstance(leaf, StorageError):
            sys.stderr.write(f"sandbox: {leaf}\n")
            return EXIT_FAILURE
        if isinstance(leaf, KeyboardInterrupt):
            return EXIT_FAILURE
        raise


def _leaf(exc: BaseException) -> BaseException:
    """The one error a nursery tree carried (trio wraps it in a group per level)."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


if __name__ == "__main__":
    sys.exit(main())
