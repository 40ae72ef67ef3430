"""Operator verbs that mirror the admin console's JSON API.

``integrationd hash-password`` prints an argon2id hash for ``[[operators]]
password_hash`` (reading the password from stdin when it is not a terminal,
else prompting twice). ``integrationd audit list`` reads the append-only audit
log; ``integrationd dlq list|classes|replay`` reads the DLQ and bulk-replays
it with the same rules as ``POST /admin/api/dlq/replay``: the actor is
authorized against the current ``[[operators]]`` for every item, each replay
is audited in its own transaction, conflicts are reported per item, and one
summary audit entry records the run.

``integrationd catalog publish|list|show|delete`` manages Catalog revisions
(:mod:`daemon.catalog_cli`); ``integrationd cutover status|begin|commit|rollback|
re-cutover|project`` moves a family between owners (:mod:`daemon.cutover_cli`).

Replays resolve families as ``integrationd run`` does (:func:`operator_registry`:
every family, with its replay guard). Every audit entry a CLI process writes
records, beside ``--actor``, the OS user it ran as and ``SUDO_USER``
(:func:`cli_origin`). As text, an empty listing says so; ``--json`` prints one
document. ``work show``'s text form (:func:`show_text`) prints times as ISO 8601
UTC and structures as JSON.

``daemon/cli.py`` adds ``hash-password``, ``audit`` and ``dlq`` with
:func:`add_operator_log_commands` (the others from their own modules, only the chosen
one's imported: daemon/cli_commands.py) and runs them all with :func:`run_admin_command`
(exit codes: 0 ok, 1 runtime failure, 2 usage); :func:`add_admin_commands` adds all of them.
"""

from __future__ import annotations

import argparse
import datetime
import getpass
import json
import os
import pwd
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from admin_ui.errors import ConsoleError
from config.settings import Settings
from daemon.cli_commands import ADMIN_COMMANDS, HELP
from daemon.core.ids import is_ulid
from daemon.services.clock import WallClock
from daemon.services.families import FamilyRegistry, UnknownFamily, require_known_family
from daemon.services.operator_api import BadRequest, NotAuthorized
from storage.migrate import check_schema
from storage.open import describe_url, open_store
from storage.port import DatabaseRejected, DeadQuery, StorageError
from storage.work_admin import AUDIT_ORIGIN
from storage.work_store import WorkStore

__all__ = ["ADMIN_COMMANDS", "add_admin_commands", "run_admin_command"]
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class _Usage(Exception):
    """Input the operator can fix: one line, exit 2."""


def add_admin_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add every one of :data:`ADMIN_COMMANDS` to the ``integrationd`` parser."""
    from daemon.catalog_cli import add_catalog_command
    from daemon.cutover_cli import add_cutover_command
    from daemon.reconcile_cli import add_reconcile_command
    from daemon.subscriptions_cli import add_subscriptions_command

    add_operator_log_commands(sub)
    add_catalog_command(sub)
    add_reconcile_command(sub)
    add_cutover_command(sub)
    add_subscriptions_command(sub)


def add_operator_log_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``hash-password``, ``audit`` and ``dlq`` (the rest of :data:`ADMIN_COMMANDS` are
    added by their own modules)."""
    from admin_ui.filters import DLQ_CLASS_SAMPLE, MAX_BULK

    hp = sub.add_parser(
        "hash-password",
        help=HELP["hash-password"],
        description="Reads the password from stdin when stdin is not a terminal (first line),"
                    " otherwise prompts twice. Prints only the hash.",
    )
    hp.add_argument("--stdin", action="store_true",
                    help="read the password from stdin even when it is a terminal")

    audit = sub.add_parser("audit", help=HELP["audit"])
    audit_verbs = audit.add_subparsers(dest="audit_command", required=True, metavar="VERB")
    al = audit_verbs.add_parser("list", help="audit entries, newest first")
    al.add_argument("--target", help="only entries about this target (work id, dlq/FAMILY/...)")
    al.add_argument("--limit", type=int, default=100, help="at most this many (1..1000)")
    al.add_argument("--json", action="store_true", help="print JSON (as GET /admin/api/audit)")

    dlq = sub.add_parser("dlq", help=HELP["dlq"])
    dlq_verbs = dlq.add_subparsers(dest="dlq_command", required=True, metavar="VERB")
    dl = dlq_verbs.add_parser("list", help="dead items, newest first")
    dl.add_argument("--family", help="only this work family")
    dl.add_argument("--class", dest="failure_class", help="only this failure class")
    dl.add_argument("--unreplayed", action="store_true", help="only items not replayed yet")
    dl.add_argument("--after", help="page: items older than this work id")
    dl.add_argument("--limit", type=int, default=50, help="at most this many (1..200)")
    dl.add_argument("--json", action="store_true", help="print JSON (as GET /admin/api/dlq)")
    dc = dlq_verbs.add_parser("classes", help="dead items per family and failure class")
    dc.add_argument("--sample", type=int, default=DLQ_CLASS_SAMPLE,
                    help=f"count among the newest N dead items (default {DLQ_CLASS_SAMPLE})")
    dc.add_argument("--json", action="store_true", help="print JSON")
    dr = dlq_verbs.add_parser(
        "replay", help="replay dead items of one family (and class) that were not replayed yet")
    dr.add_argument("--family", required=True, help="work family (required)")
    dr.add_argument("--class", dest="failure_class", help="only this failure class")
    dr.add_argument("--limit", type=int, default=50, help=f"at most this many (1..{MAX_BULK})")
    dr.add_argument("--actor", required=True, help="operator name (must hold operator/admin)")
    dr.add_argument("--reason", required=True, help="why (kept in the audit log)")
    dr.add_argument("--json", action="store_true",
                    help="print the report as JSON (as POST /admin/api/dlq/replay)")


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def say_empty(what: str) -> None:
    """An empty listing says so (text output; JSON shows an empty list)."""
    sys.stdout.write(f"no {what}\n")


def iso_utc(us: int) -> str:
    """UTC epoch microseconds as ISO 8601 UTC (``2026-12-01T08:00:00.000000Z``)."""
    at = datetime.datetime.fromtimestamp(us // 1_000_000, tz=datetime.UTC)
    return at.replace(microsecond=us % 1_000_000).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def cli_origin() -> str:
    """Who really acts through this CLI process, recorded in the audit log beside
    ``--actor``: the OS user the process runs as (from its effective uid, not from
    the environment) and, under sudo, the invoking ``SUDO_USER``."""
    uid = os.geteuid()
    try:
        os_user = pwd.getpwuid(uid).pw_name
    except KeyError:
        os_user = str(uid)
    doc: dict[str, Any] = {"via": "cli", "os_user": os_user, "uid": uid}
    # From the environment (sudo sets it): recorded as a claim, printable and bounded.
    sudo_user = "".join(c for c in os.environ.get("SUDO_USER", "") if c.isprintable())[:128]
    if sudo_user:
        doc["sudo_user"] = sudo_user
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def record_cli_origin() -> None:
    """Record :func:`cli_origin` with every audit entry this task (and the tasks it
    starts) writes: the operator verbs call it first."""
    AUDIT_ORIGIN.set(cli_origin())


def _readable(key: str, value: Any) -> tuple[str, Any]:
    """``*_us`` epoch-microsecond fields become ISO 8601 UTC under the key without ``_us``."""
    if key.endswith("_us") and (value is None or isinstance(value, int)):
        return key[:-3], iso_utc(value) if value is not None else None
    if isinstance(value, dict):
        return key, dict(_readable(k, v) for k, v in value.items())
    if isinstance(value, list):
        return key, [_readable("", v)[1] for v in value]
    return key, value


def show_text(doc: dict[str, Any]) -> str:
    """``work show``: one ``key: value`` line per field, times as ISO 8601 UTC, nested
    structures (the execution journal) as JSON, ``None`` as ``-``."""
    lines = []
    for key, value in (_readable(k, v) for k, v in doc.items()):
        if isinstance(value, dict | list):
            text = json.dumps(value, sort_keys=True)
        elif value is None:
            text = "-"
        else:
            text = str(value)
        lines.append(f"{key}: {text}")
    return "\n".join(lines) + "\n"


@asynccontextmanager
async def operator_registry(settings: Settings, store: WorkStore) -> AsyncIterator[FamilyRegistry]:
    """The registry of every family this build runs, as ``integrationd run`` builds it
    (with each family's replay guard), for operator verbs that resolve families."""
    from daemon.services.assembly import assemble

    parts = assemble(settings, store, WallClock())
    try:
        yield parts.registry
    finally:
        await parts.aclose()


def _read_password(force_stdin: bool) -> str:
    if force_stdin or not sys.stdin.isatty():
        line = sys.stdin.readline()
        password = line[:-1] if line.endswith("\n") else line
    else:
        password = getpass.getpass("Password: ")
        if getpass.getpass("Again: ") != password:
            raise _Usage("the passwords differ")
    if not password:
        raise _Usage("the password is empty")
    return password


def _limit(value: int, high: int) -> int:
    if not 1 <= value <= high:
        raise _Usage(f"--limit must be from 1 to {high}")
    return value


async def _open(settings: Settings) -> WorkStore:
    password = settings.storage.password.reveal() if settings.storage.password else None
    try:
        store = await open_store(
            settings.storage.url, password=password, pool_size=2,
            sqlite_synchronous=settings.storage.sqlite_synchronous, base_dir=settings.base_dir,
            # The configured bounds, as for every other verb: a hung database is one line.
            connect_timeout_s=settings.storage.connect_timeout,
            statement_timeout_s=settings.storage.statement_timeout,
            create=False,  # a read or an action on a missing SQLite file leaves no file
        )
    except DatabaseRejected as exc:
        raise _Usage(str(exc)) from None  # exit 2, as the other verbs: fix the setup
    except StorageError as exc:
        raise StorageError(
            f"database unreachable ({describe_url(settings.storage.url)}): {exc}") from None
    try:
        await check_schema(store.db, store.dialect)
    except BaseException:
        await store.db.aclose()
        raise
    return store


async def _audit(store: WorkStore, args: argparse.Namespace) -> None:
    from admin_ui.serialize import audit_json

    entries = await store.audit_list(limit=_limit(args.limit, 1000), target_id=args.target)
    if args.json:
        _print_json({"entries": [audit_json(e) for e in entries]})
        return
    if not entries:
        say_empty("audit entries" + (f" about {args.target}" if args.target else ""))
    for e in entries:
        sys.stdout.write(
            f"{e.audit_id}  {iso_utc(e.at_us)}  {e.actor} ({e.role})  {e.action}"
            f"  {e.target_kind}:{e.target_id}  {e.before} -> {e.after}  reason: {e.reason}"
            f"{_origin_text(e.origin)}\n"
        )


def _origin_text(origin: str | None) -> str:
    if origin is None:
        return ""
    try:
        doc = json.loads(origin)
    except ValueError:
        return ""
    if not isinstance(doc, dict):
        return ""
    parts = [f"{k}={doc[k]}" for k in ("os_user", "sudo_user") if doc.get(k)]
    return f"  via {doc.get('via', '?')}" + (f" ({', '.join(parts)})" if parts else "")


async def _dlq(store: WorkStore, settings: Settings, args: argparse.Namespace) -> int:
    from admin_ui.filters import MAX_BULK, BulkReplayRequest, reason_from
    from admin_ui.serialize import dead_class_json, work_json

    verb = args.dlq_command
    if verb == "list":
        require_known_family(args.family)
        if args.after is not None and not is_ulid(args.after):
            raise _Usage("--after must be a work id")
        items = await store.work_dead_list(DeadQuery(
            family=args.family, failure_class=args.failure_class,
            unreplayed_only=args.unreplayed, after_id=args.after,
            limit=_limit(args.limit, 200)))
        replayed = await store.work_replay_map([i.work_id for i in items])
        docs = [work_json(i, replayed_as=replayed.get(i.work_id)) for i in items]
        if args.json:
            _print_json({"items": docs})
        elif not docs:
            say_empty("dead items match")
        else:
            for d in docs:
                sys.stdout.write(
                    f"{d['work_id']}  {d['family']:<12} {d['failure_class'] or '-':<20}"
                    f" {d['operator_summary'] or ''}"
                    f"{'  replayed as ' + d['replayed_as'] if d.get('replayed_as') else ''}\n"
                )
        return EXIT_OK
    if verb == "classes":
        classes = await store.work_dead_classes(max(1, args.sample))
        if args.json:
            _print_json({"classes": [dead_class_json(c) for c in classes],
                         "classes_sample": args.sample})
        elif not classes:
            say_empty("dead items")
        else:
            for c in classes:
                sys.stdout.write(f"{c.count:>8}  {c.family:<12} {c.failure_class or '-'}\n")
        return EXIT_OK
    # replay
    request = BulkReplayRequest(family=args.family, failure_class=args.failure_class,
                                limit=_limit(args.limit, MAX_BULK),
                                reason=reason_from(args.reason))
    from admin_ui.actions import Operations

    async with operator_registry(settings, store) as registry:
        ops = Operations(store, settings, registry, WallClock())
        report = await ops.bulk_replay(request, actor=args.actor)
    if args.json:
        _print_json(report.to_json())
    elif not report.selected:
        which = f" of class {report.failure_class}" if report.failure_class else ""
        sys.stdout.write(f"nothing to replay: no dead {report.family} item{which} is waiting"
                         " for a replay (no audit entry written)\n")
    else:
        for item in report.items:
            detail = item.new_work_id or item.message
            sys.stdout.write(f"{item.work_id}  {item.outcome:<13} {detail}\n")
        audit = (f"audit {report.audit_id}" if report.audit_id is not None
                 else "the summary audit entry could not be written")
        sys.stdout.write(
            f"selected {report.selected}, replayed {report.count('replayed')},"
            f" conflicts {report.count('conflict')} (run {report.bulk_id}; {audit})\n"
        )
    return EXIT_OK if report.complete else EXIT_FAILURE


async def run_admin_command(settings: Settings, args: argparse.Namespace) -> int:
    """Run one of :data:`ADMIN_COMMANDS`; report errors as one line on stderr."""
    record_cli_origin()
    run, usage, failure = _delegated(args.command)
    usage_errors: tuple[type[Exception], ...] = (_Usage, BadRequest, ConsoleError,
                                                 UnknownFamily, *usage)
    failure_errors: tuple[type[Exception], ...] = (NotAuthorized, StorageError, *failure)
    try:
        if args.command == "hash-password":
            from admin_ui.passwords import hash_password

            sys.stdout.write(hash_password(_read_password(args.stdin)) + "\n")
            return EXIT_OK
        store = await _open(settings)
        try:
            if args.command == "audit":
                await _audit(store, args)
                return EXIT_OK
            if args.command == "dlq":
                return await _dlq(store, settings, args)
            if run is not None:
                code = await run(store, settings, args)
                return EXIT_OK if code is None else code
        finally:
            await store.db.aclose()
    except usage_errors as exc:
        sys.stderr.write(f"integrationd: {exc}\n")
        return EXIT_USAGE
    except failure_errors as exc:
        sys.stderr.write(f"integrationd: {exc}\n")
        return EXIT_FAILURE
    raise AssertionError(f"not an admin command: {args.command}")


_Run = Callable[[WorkStore, Settings, argparse.Namespace], Awaitable[int | None]]


def _delegated(command: str) -> tuple[_Run | None, tuple[type[Exception], ...],
                                      tuple[type[Exception], ...]]:
    """The runner of an admin command another module serves, with its errors that mean
    usage (exit 2) and failure (exit 1): imported only when it is the one chosen."""
    if command == "catalog":
        from daemon.catalog_cli import CatalogNotFound, CatalogUsage, run_catalog_command

        return run_catalog_command, (CatalogUsage,), (CatalogNotFound,)
    if command == "reconcile":
        from daemon.reconcile_cli import ReconcileUsage, run_reconcile_command

        return run_reconcile_command, (ReconcileUsage,), ()
    if command == "cutover":
        from daemon.cutover_cli import CutoverUsage, run_cutover_command

        return run_cutover_command, (CutoverUsage,), ()
    if command == "subscriptions":
        from daemon.subscriptions_cli import SubscriptionsUsage, run_subscriptions_command

        return run_subscriptions_command, (SubscriptionsUsage,), ()
    return None, (), ()
