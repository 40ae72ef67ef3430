"""``integrationd``: run a replica, migrate, check configuration, operate on work.

Exit codes (docs/operations.md; the systemd unit's ``SuccessExitStatus``,
``RestartPreventExitStatus`` and ``RestartForceExitStatus`` follow them):

* 0 success; for ``run``, a clean drain (every lease finished or released);
* 1 a runtime failure: database unreachable (past ``storage.startup_timeout``
  for ``run`` and ``migrate``), conflict, not found;
* 2 bad configuration or usage, one line naming the key; also a database that
  refuses us (wrong password, unknown database), a listener whose port is in
  use, a replica id held by a live process: restarting cannot fix these;
* 3 forced stop of ``run``: a second signal, or the drain deadline passed with
  leases that could not be released (left to lease expiry, logged).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from config.catalog import CatalogError, load_catalog
from config.load import ConfigError, load_settings
from daemon.cli_commands import ADMIN_COMMANDS, COMMANDS, FIND_COMMANDS
from daemon.services import logs

# Each command imports what it uses when it runs (daemon/cli_commands.py): a call pays
# for its own command only, not for the console, the reconciler or the operator API.
if TYPE_CHECKING:
    from admin_ui.extensions import ConsoleExtensions
    from config.settings import Settings
    from daemon.services.assembly import Assembly
    from storage.work_store import WorkStore

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_FORCED = 3
# The collector's generation thresholds for a running replica (CPython's default is
# (700, 10, 10)). Every claimed batch, request and transaction allocates thousands of
# short-lived objects, nearly all freed by reference counting, so the default youngest
# generation runs a collection every few hundred of them for almost nothing found.
GC_THRESHOLDS = (20_000, 20, 20)


class CliFailure(Exception):
    """A runtime failure to report as one line, exit 1."""


class CliRefused(Exception):
    """A problem restarting cannot fix (configuration, a port, an id): one line, exit 2."""


def _parser(full: Callable[[str], bool] = lambda command: True) -> argparse.ArgumentParser:
    """The ``integrationd`` parser: each command for which ``full`` holds with its own
    parser (its module imported), every other one bare (its name and help, no options)."""
    parser = argparse.ArgumentParser(
        prog="integrationd",
        description="Durable integration daemon: webhooks in, fenced work, effects out.",
    )
    parser.add_argument(
        "--config",
        metavar="PATH",
        default=os.environ.get("INTEGRATIOND_CONFIG"),
        help="TOML settings file (default: $INTEGRATIOND_CONFIG, else built-in defaults)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="structured log level on stderr (default INFO)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    added: set[str] = set()
    for name, (help_text, adder) in COMMANDS.items():
        if not full(name):
            # Bare: no --help of its own, so a first pass leaves the command's words alone.
            sub.add_parser(name, help=help_text, add_help=False)
        elif adder not in added:  # one adder may add several commands, in this order
            added.add(adder)
            module, function = adder.split(":")
            getattr(importlib.import_module(module), function)(sub)
    return parser


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Which command (every command bare: ``--help``, a missing or unknown command end
    here as they always did), then the arguments with that command's own parser."""
    chosen = _parser(lambda command: False).parse_known_args(argv)[0].command
    adder = COMMANDS[chosen][1]
    return _parser(lambda command: COMMANDS[command][1] == adder).parse_args(argv)


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


async def _open(settings: Settings, *, connect: bool = True, create: bool = False,
                timeout_s: float | None = None) -> WorkStore:
    """The configured store. Only ``migrate`` creates a SQLite file (``create``): any
    other command on a missing file is one line naming the path, and leaves nothing.
    ``timeout_s`` (``migrate``'s) replaces the statement and transaction timeouts."""
    from storage.open import open_store
    from storage.port import DatabaseRejected, StorageError

    password = settings.storage.password.reveal() if settings.storage.password else None
    try:
        return await open_store(
            settings.storage.url,
            password=password,
            pool_size=settings.storage.pool_size,
            sqlite_synchronous=settings.storage.sqlite_synchronous,
            base_dir=settings.base_dir,
            connect_timeout_s=settings.storage.connect_timeout,
            statement_timeout_s=timeout_s or settings.storage.statement_timeout,
            **({} if timeout_s is None else {"transaction_timeout_s": timeout_s}),
            connect=connect,
            create=create,
        )
    except DatabaseRejected as exc:
        raise CliRefused(_rejected_line(settings, exc)) from None
    except StorageError as exc:
        raise CliFailure(_unreachable_line(settings, exc)) from None


def _unreachable_line(settings: Settings, exc: BaseException) -> str:
    return _database_line("database unreachable", settings, exc)


def _rejected_line(settings: Settings, exc: BaseException) -> str:
    return _database_line("database refused us", settings, exc)


def _database_line(what: str, settings: Settings, exc: BaseException) -> str:
    from storage.open import describe_url

    where = describe_url(settings.storage.url)
    detail = str(exc)
    for prefix in (f"cannot connect to {where}: ", f"{where}: "):
        detail = detail.removeprefix(prefix)
    return f"{what} ({where}): {detail}"


async def _wait_for_database(settings: Settings, store: WorkStore) -> None:
    """``migrate`` (systemd's ExecStartPre) waits for a database still coming up, as ``run``."""
    from storage.open import wait_until_reachable
    from storage.port import DatabaseRejected, StorageError

    def retry(tries: int, delay_s: float, error: str) -> None:
        logs.warn("database_waiting", attempt=tries, retry_in_s=round(delay_s, 2),
                  within_s=settings.storage.startup_timeout, error=error)

    try:
        await wait_until_reachable(store, timeout_s=settings.storage.startup_timeout,
                                   on_retry=retry)
    except DatabaseRejected as exc:
        raise CliRefused(_rejected_line(settings, exc)) from None
    except StorageError as exc:
        raise CliFailure(_unreachable_line(settings, exc)) from None


async def _with_store(settings: Settings, action: Callable[[WorkStore], Any]) -> Any:
    store = await _open(settings)
    try:
        return await action(store)
    finally:
        await store.db.aclose()


async def _cmd_migrate(settings: Settings) -> int:
    from daemon.services.clock import WallClock
    from storage.migrate import Migration, migrate

    def applying(migration: Migration) -> None:
        logs.event("migration_applying", version=migration.version,
                   migration=migration.name)

    def waiting(migration: Migration) -> None:
        logs.event("migration_waiting", version=migration.version,
                   migration=migration.name, within_s=timeout_s)

    # A migration's DDL may rebuild a table of millions of rows: storage.migration_timeout
    # bounds it (and the wait for one another replica is applying); the ping and the
    # ledger's statements keep the statement timeout (a hung server is found as before).
    timeout_s = settings.storage.migration_timeout
    store = await _open(settings, connect=False, create=True)
    try:
        ddl = await _open(settings, connect=False, timeout_s=timeout_s)
        try:
            await _wait_for_database(settings, store)
            applied = await migrate(store.db, store.dialect, WallClock().now_us(),
                                    wait_s=timeout_s, applying=applying, waiting=waiting,
                                    ddl_db=ddl.db)
        finally:
            await ddl.db.aclose()
    finally:
        await store.db.aclose()
    logs.event("migrate_done", applied=",".join(map(str, applied)) or "none")
    sys.stdout.write(f"migrations applied: {applied or 'none (up to date)'}\n")
    return EXIT_OK


def admin_extensions(parts: Assembly) -> ConsoleExtensions:
    """Everything the console of ``run`` serves beside the kernel's pages (the secret
    scan enumerates the routes of exactly this app)."""
    from admin_ui.effects import effect_extensions
    from admin_ui.extensions import combine
    from admin_ui.history import history_extensions
    from admin_ui.ingress import ingress_extensions
    from admin_ui.subscriptions import subscriptions_extensions
    from admin_ui.sync import sync_extensions

    return combine(effect_extensions(parts.catalog, parts.catalogs.pinned),
                   sync_extensions(parts.catalog), ingress_extensions(),
                   subscriptions_extensions(parts.catalog), history_extensions())


async def _cmd_run(settings: Settings) -> int:
    from admin_ui.app import console_factory
    from daemon.services.assembly import assemble
    from daemon.services.catalog_view import serving_refusal
    from daemon.services.clock import WallClock
    from daemon.services.metrics import Metrics
    from daemon.services.replica import Replica

    # The replica waits for the database itself (serving /readyz meanwhile).
    store = await _open(settings, connect=False)
    try:

        async def catalog_published() -> None:
            """Effect work is configured: the current revision must be published with
            exactly this configuration's content (nothing is published here). Run by
            the replica once the database answers and its schema is current."""
            if not (settings.bindings or settings.runtimes):
                return
            catalog = load_catalog(settings)
            refusal = serving_refusal(catalog, await store.catalog_digest(catalog.revision))
            if refusal is not None:
                raise ConfigError("catalog.revision", refusal)

        async def token_keys_open_their_bundles() -> None:
            """A loaded token key that opens none of the bundles sealed under its id is a
            different key under the right id: one line naming it, exit 2 (every grant it
            seals would be refused here, one use at a time)."""
            if not settings.keys.active:
                return
            from config.keys import load_token_keys
            from daemon.services.key_rotation import wrong_keys

            keys = load_token_keys(settings.keys, os.environ, settings.base_dir)
            for key_id, message in await wrong_keys(store, keys):
                raise ConfigError(f"keys.{key_id}", message)

        async def bindings_bootstrapped() -> None:
            """Every [[bindings]] entry has its durable PrincipalBinding row (created
            from the TOML only when missing; a differing TOML generation is logged)."""
            from daemon.services.principal_bootstrap import ensure_config_bindings

            await ensure_config_bindings(store, settings.bindings, WallClock().now_us())

        async def subscription_chains() -> None:
            """Each binding with subscriptions has its reconciliation chain queued (one per
            time slot: replicas starting together make one)."""
            from daemon.services.subscription_items import SUBSCRIPTION_FAMILY
            from daemon.services.subscription_operator import start_chains

            if any(r.public_url for r in settings.webhook_routes):
                await start_chains(store, load_catalog(settings), settings.webhook_routes,
                                   WallClock().now_us(), max_attempts=settings.family(
                                       SUBSCRIPTION_FAMILY).max_attempts)

        clock = WallClock()
        metrics = Metrics()
        parts = assemble(settings, store, clock, metrics)
        # The composition root: the console is built here and handed to the replica, so
        # the services never import the console, nor the console the replica.
        admin_app = console_factory(admin_extensions(parts))
        replica = Replica(settings, store, parts.registry, clock, metrics=metrics,
                          api_app=parts.api_app, admin_app=admin_app,
                          ingress_app=parts.ingress.app if parts.ingress else None,
                          startup_checks=(catalog_published, token_keys_open_their_bundles,
                                          bindings_bootstrapped, subscription_chains),
                          abandon_hooks=(parts.credentials.abandon_at,))
        if parts.api_context is not None:
            parts.api_context.wake = replica.wake
        if settings.replica.id:
            replica.replica_id = settings.replica.id
        if parts.ingress is not None:
            parts.ingress.app.replica_id = replica.replica_id
        # Everything built so far (modules, the Catalog, the services) lives as long as the
        # process: frozen out of the collector's sight, a full collection no longer walks
        # it. It was the longest pause a replica had, paid inside whichever request or
        # claim triggered it: 150-240 ms under bench.effects, 27-75 ms frozen (README,
        # Performance). What is frozen is never collected, so the garbage of start-up is
        # collected first, once.
        gc.collect()
        gc.freeze()
        gc.set_threshold(*GC_THRESHOLDS)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_watch_signals, replica)
                await replica.run()  # returns once a drain has finished (or was forced)
                nursery.cancel_scope.cancel()
        finally:
            with trio.move_on_after(1):
                await parts.aclose()
    finally:
        await store.db.aclose()
    return EXIT_FORCED if replica.forced_stop else EXIT_OK


async def _cmd_check_connect(settings: Settings) -> int:
    """``check-config --connect``: the database answers and its schema is current."""
    from daemon.services.cutover import verified_claimant
    from storage.migrate import check_schema
    from storage.open import describe_url

    store = await _open(settings)
    try:
        await check_schema(store.db, store.dialect)
        # Each declared legacy claimant's statements run once (rolled back): one the
        # database refuses is a config error naming its key.
        for c in settings.legacy_claimants:
            await verified_claimant(store, settings, c.family)
    finally:
        await store.db.aclose()
    sys.stderr.write(f"integrationd: {describe_url(settings.storage.url)}: reachable,"
                     " schema current"
                     + (", legacy claimants answer" if settings.legacy_claimants else "")
                     + "\n")
    return EXIT_OK


async def _watch_signals(replica: Any) -> None:
    """First SIGTERM/SIGINT drains; a second one stops at once (exit 3)."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        drain_requested = False
        async for signum in signals:
            if drain_requested:
                replica.force_stop(f"second signal {int(signum)}")
                return
            drain_requested = True
            logs.event("replica_signal", signal=int(signum))
            replica.request_drain()


async def _cmd_work(settings: Settings, args: argparse.Namespace) -> int:
    from daemon.admin_cli import (
        iso_utc,
        operator_registry,
        record_cli_origin,
        say_empty,
        show_text,
    )
    from daemon.services.clock import WallClock
    from daemon.services.families import build_registry, require_known_family
    from daemon.services.operator_api import (
        EnqueueRequest,
        cancel,
        command_facts_json,
        enqueue,
        item_json,
        operator_path_json,
        parse_state,
        replay,
    )
    from storage.migrate import check_schema
    from storage.port import WorkNotFound, WorkQuery

    record_cli_origin()
    clock = WallClock()
    registry = build_registry(settings)
    verb = args.work_command

    async def act(store: WorkStore) -> int:
        await check_schema(store.db, store.dialect)
        if verb == "enqueue":
            ids = await enqueue(
                store,
                registry,
                clock,
                EnqueueRequest(
                    family=args.family,
                    count=args.count,
                    org_id=args.org,
                    payload=args.payload,
                    source_lane=args.source_lane,
                    target_lane=args.target_lane,
                    delay_s=args.delay,
                ),
            )
            _print_json({"enqueued": len(ids), "first": ids[0], "last": ids[-1]})
        elif verb == "list":
            require_known_family(args.family)
            query = WorkQuery(
                state=parse_state(args.state),
                family=args.family,
                org_id=args.org,
                subject_id=args.subject,
                lane=args.lane,
                after_id=args.after,
                limit=args.limit,
            )
            items = await store.work_list(query)
            if args.json:
                _print_json([item_json(i) for i in items])
            elif not items:
                say_empty("work items match")
            else:
                for i in items:
                    sys.stdout.write(
                        f"{i.work_id}  {i.family:<12} {i.state.value:<24} attempt={i.attempt}"
                        f" epoch={i.ownership_epoch} org={i.org_id}\n"
                    )
                if len(items) == args.limit:
                    # A full page may not be all: say so, and how to read on.
                    sys.stderr.write(f"integrationd: stopped at --limit {args.limit}; more may"
                                     f" match: next page with --after {items[-1].work_id}\n")
        elif verb == "show":
            item = await store.work_get(args.work_id)
            if item is None:
                raise WorkNotFound(args.work_id)
            doc = item_json(item, await store.work_executions(item.work_id))
            doc["hold"] = registry.hold_reason(item)
            path = await operator_path_json(store, settings, item)
            if path is not None:  # a command's item: where its Runtime intent stands
                doc["operator_path"] = path
                doc.update(await command_facts_json(store, item.subject_id))
            if args.json:
                _print_json(doc)
            else:
                sys.stdout.write(show_text(doc))
        elif verb == "replay":
            async with operator_registry(settings, store) as families:
                new = await replay(
                    store, settings, families, clock,
                    work_id=args.work_id, actor=args.actor, reason=args.reason,
                )
            if args.json:
                _print_json(item_json(new))
            else:
                sys.stdout.write(f"replayed {args.work_id} as {new.work_id}\n")
        elif verb == "cancel":
            result = await cancel(store, settings, clock, work_id=args.work_id, actor=args.actor,
                                  reason=args.reason, rules=registry.cancel_rules())
            _print_json({"work_id": result.work_id, "disposition": result.disposition,
                         "state": result.state.value})
        elif verb == "count":
            await _work_count(store, clock.now_us(), args)
        elif verb == "depths":
            depths = await store.work_depths()
            if args.json:
                _print_json([
                    {"family": d.family, "state": d.state.value, "count": d.count,
                     "oldest_run_after_us": d.oldest_run_after_us}
                    for d in depths
                ])
            elif not depths:
                say_empty("queued work (every family is empty)")
            else:
                for d in depths:
                    oldest = (iso_utc(d.oldest_run_after_us)
                              if d.oldest_run_after_us is not None else "-")
                    sys.stdout.write(f"{d.family:<16} {d.state.value:<24} {d.count:>10}"
                                     f"  oldest run_after {oldest}\n")
        return EXIT_OK

    result: int = await _with_store(settings, act)
    return result


async def _work_count(store: WorkStore, now_us: int, args: argparse.Namespace) -> None:
    """``work count``: items created in the range by family and state (their state now),
    and executions finished in it by family and outcome."""
    from daemon.admin_cli import iso_utc, say_empty
    from daemon.core.human_time import wall_text
    from daemon.core.time_range import BadTime, parse_range
    from daemon.services.families import require_known_family
    from daemon.services.operator_api import BadRequest

    require_known_family(args.family)
    try:
        span = parse_range(args.since, args.until, now_us)
    except BadTime as exc:
        raise BadRequest(str(exc)) from None
    created = await store.work_state_counts(span.since_us, span.until_us, args.family)
    finished = [c for c in await store.work_outcome_counts(span.since_us or 0, span.until_us)
                if args.family is None or c.family == args.family]
    by_family: dict[str, int] = {}
    by_state: dict[str, int] = {}
    for family, state, n in created:
        by_family[family] = by_family.get(family, 0) + n
        by_state[state] = by_state.get(state, 0) + n
    if args.json:
        _print_json({
            "since_us": span.since_us, "until_us": span.until_us,
            "since": None if span.since_us is None else iso_utc(span.since_us),
            "until": iso_utc(span.until_us), "family": args.family,
            "created": [{"family": f, "state": st, "count": n} for f, st, n in created],
            "by_family": by_family, "by_state": by_state, "total": sum(by_family.values()),
            "finished": [{"family": c.family, "outcome": c.outcome, "count": c.count}
                         for c in sorted(finished, key=lambda c: (c.family, c.outcome))]})
        return
    since = "the beginning" if span.since_us is None else wall_text(span.since_us)
    sys.stdout.write(f"work created from {since} until {wall_text(span.until_us)}"
                     + (f", family {args.family}" if args.family else "") + ":\n")
    if not created:
        say_empty("work items were created in that range")
    for family, state, n in created:
        sys.stdout.write(f"  {family:<24} {state:<24} {n:>10}\n")
    for family, n in sorted(by_family.items()):
        sys.stdout.write(f"  {family:<24} {'(all states)':<24} {n:>10}\n")
    if created:
        sys.stdout.write(f"  {'total':<49} {sum(by_family.values()):>10}\n")
    sys.stdout.write("executions finished in that range:\n")
    if not finished:
        say_empty("execution finished in that range")
    for c in sorted(finished, key=lambda c: (c.family, c.outcome)):
        sys.stdout.write(f"  {c.family:<24} {c.outcome:<24} {c.count:>10}\n")


def main(argv: Sequence[str] | None = None) -> int:
    from daemon.services.families import known_family_names

    args = _parse(argv)
    logs.configure(args.log_level)
    try:
        settings = load_settings(args.config, known_families=known_family_names())
        load_catalog(settings)
    except (ConfigError, CatalogError) as exc:
        sys.stderr.write(f"integrationd: config error: {exc}\n")
        return EXIT_USAGE
    try:
        if args.command in ADMIN_COMMANDS:
            from daemon.admin_cli import run_admin_command

            return trio.run(run_admin_command, settings, args)
        if args.command == "check-config":
            from config.summary import describe_settings
            from storage.open import describe_url

            _print_json(describe_settings(settings, known_family_names(), describe_url))
            if args.connect:
                return trio.run(_cmd_check_connect, settings)
            return EXIT_OK
        if args.command == "migrate":
            return trio.run(_cmd_migrate, settings)
        # The commands whose module runs them with this module's store opener.
        runner = {"keys": "daemon.keys_cli:run_keys_command",
                  "binding": "daemon.binding_cli:run_binding_command",
                  "command": "daemon.command_cli:run_command_command",
                  "link": "daemon.link_cli:run_link_command",
                  "history": "daemon.history_cli:run_history_command",
                  **dict.fromkeys(FIND_COMMANDS, "daemon.find_cli:run_find_command"),
                  }.get(args.command)
        if runner is not None:
            module, function = runner.split(":")
            done: int = trio.run(getattr(importlib.import_module(module), function),
                                 settings, args, _open)
            return done
        if args.command == "run":
            return trio.run(_cmd_run, settings)
        if args.command == "work":
            return trio.run(_cmd_work, settings, args)
    except BaseException as exc:  # mapped to one line and an exit code, or re-raised
        code = _report(_leaf(exc), settings)
        if code is None:
            raise
        return code
    raise AssertionError(f"unhandled command {args.command}")


def _leaf(exc: BaseException) -> BaseException:
    """The one error a nursery tree carried (trio wraps it in an ExceptionGroup per level)."""
    while isinstance(exc, BaseExceptionGroup):
        leaves = [e for e in exc.exceptions if not isinstance(e, trio.Cancelled)]
        if len(leaves) != 1:
            return exc
        exc = leaves[0]
    return exc


def _report(exc: BaseException, settings: Settings) -> int | None:
    """Print ``exc`` as one line and return the exit code (``None``: a bug, re-raise)."""
    # The classes of the errors a command may end with, imported here (an error's way
    # out) rather than by every command.
    from daemon.binding_cli import BindingNotFound
    from daemon.command_cli import CommandNotFound
    from daemon.services.families import UnknownFamily
    from daemon.services.http_server import ListenerError
    from daemon.services.operator_api import BadRequest, NotAuthorized
    from daemon.services.replica import ReplicaIdInUse
    from storage.cutover.values import LegacyClaimantError
    from storage.port import DatabaseRejected, DatabaseUnavailable, StorageError

    line: str
    code: int
    if isinstance(exc, ConfigError | LegacyClaimantError):  # found late (at --connect)
        line, code = f"config error: {exc}", EXIT_USAGE
    elif isinstance(exc, ListenerError):
        named = {settings.ingress.listen: "ingress", settings.api.listen: "api",
                 settings.admin.listen: "admin"}
        line, code = exc.line(named.get(exc.listen)), EXIT_USAGE
    elif isinstance(exc, BadRequest | UnknownFamily | CliRefused | ReplicaIdInUse):
        line, code = str(exc), EXIT_USAGE
    elif isinstance(exc, DatabaseRejected):
        line, code = _rejected_line(settings, exc), EXIT_USAGE
    elif isinstance(exc, DatabaseUnavailable):
        line, code = _unreachable_line(settings, exc), EXIT_FAILURE
    elif isinstance(exc, CliFailure | NotAuthorized | StorageError | BindingNotFound
                    | CommandNotFound):
        line, code = str(exc), EXIT_FAILURE
    elif isinstance(exc, KeyboardInterrupt):
        return EXIT_FAILURE
    else:
        return None
    sys.stderr.write(f"integrationd: {line}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
