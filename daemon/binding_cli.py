"""``integrationd binding ...``: PrincipalBinding transitions as audited operator actions.

Every verb prints plain text, or JSON with ``--json`` (times as epoch microseconds).
``binding list [--org ORG]`` and ``binding show ID`` read the durable facts (``show`` with the
grant of the current generation: state, token version, key id, expiry, last refresh and
why it needs re-authorization: a stable code and its sentence). ``binding status``
prints one line per ``[[bindings]]`` entry: its durable generation, state and remote
account, and where the TOML disagrees with the durable fact (which wins: a rebind or a
reinstall does not edit the file; docs/identity.md). ``binding
connect``, ``disconnect``, ``reconnect`` and ``change`` apply one transition (an operator or
admin, ``--actor`` and ``--reason`` required, the OS user recorded beside the actor); each
but ``connect`` names the generation the operator saw (``--generation N``), so a binding
that changed meanwhile is refused rather than changed twice. A binding holds no secret.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable, Mapping

from config.settings import BindingSettings, Settings
from daemon.admin_cli import record_cli_origin
from daemon.cli_commands import HELP
from daemon.core.human_time import span_text, wall_text
from daemon.core.principals import (
    BindingEvent,
    BindingFacts,
    BindingIdentity,
    BindingRefused,
    PrincipalKind,
    config_drift,
    connect,
)
from daemon.services.clock import WallClock
from daemon.services.operator_api import NotAuthorized
from daemon.services.principal_bootstrap import bootstrap_facts
from storage.migrate import check_schema
from storage.port import WorkConflict
from storage.principals import Actor
from storage.work_store import WorkStore

EXIT_OK = 0
_WRITERS = ("operator", "admin")


def add_binding_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    binding = sub.add_parser("binding", help=HELP["binding"])
    verbs = binding.add_subparsers(dest="binding_command", required=True, metavar="VERB")
    lst = verbs.add_parser("list", help="every binding (generation, state, identity)")
    lst.add_argument("--org", help="only this org")
    lst.add_argument("--json", action="store_true", help="print JSON")
    show = verbs.add_parser("show", help="one binding and its current grant")
    show.add_argument("binding_id")
    show.add_argument("--json", action="store_true",
                      help="print JSON (times as epoch microseconds)")
    status = verbs.add_parser("status", help="one line per configured binding: the durable"
                              " facts and any drift of the TOML from them")
    status.add_argument("--json", action="store_true", help="print JSON")
    for verb, text in (("connect", "create a binding at generation 1"),
                       ("disconnect", "stop dispatch under the binding (generation kept)"),
                       ("reconnect", "connect again: the generation moves"),
                       ("change", "change its identity or scopes: the generation moves")):
        p = verbs.add_parser(verb, help=text)
        p.add_argument("binding_id")
        p.add_argument("--actor", required=True,
                       help="your operator name, as configured in [[operators]] (role"
                            " operator or admin)")
        p.add_argument("--reason", required=True, help="why (kept in the audit log)")
        p.add_argument("--json", action="store_true", help="print the binding as JSON")
        if verb != "connect":
            p.add_argument("--generation", type=int, required=True,
                           help="the generation you saw (refused if it has moved)")
        if verb != "disconnect":
            need = verb == "connect"
            p.add_argument("--issuer", required=need, help="token issuer")
            p.add_argument("--remote-account", required=need, help="remote tenant/account id")
            p.add_argument("--remote-subject", required=need, help="remote user or app id")
            p.add_argument("--installation", help="provider app installation id")
            p.add_argument("--scopes", help="comma-separated scopes")
        if verb == "connect":
            p.add_argument("--kind", choices=[k.value for k in PrincipalKind],
                           default="shared")
            p.add_argument("--user", default="", help="per-user principals: whose grant")
            p.add_argument("--org", required=True)
            p.add_argument("--app-installation", required=True)
            p.add_argument("--provider", required=True)


def binding_json(facts: BindingFacts) -> dict[str, object]:
    return {"binding_id": facts.binding_id, "kind": facts.kind.value, "org_id": facts.org_id,
            "app_installation_id": facts.app_installation_id, "provider": facts.provider,
            "user_id": facts.user_id or None, "generation": facts.generation,
            "state": facts.state.value, "issuer": facts.identity.issuer,
            "remote_account_id": facts.identity.remote_account_id,
            "remote_subject": facts.identity.remote_subject,
            "installation_id": facts.identity.installation_id or None,
            "scopes": list(facts.identity.scopes)}


def _actor(settings: Settings, args: argparse.Namespace) -> Actor:
    operator = settings.operator(args.actor)
    if operator is None or operator.role not in _WRITERS:
        raise NotAuthorized(f"{args.actor!r} may not change bindings (operators and admins)")
    return Actor(operator.name, operator.role, args.reason)


def _identity(args: argparse.Namespace, base: BindingIdentity | None) -> BindingIdentity:
    def pick(value: str | None, old: str) -> str:
        return old if value is None else value

    scopes = None if args.scopes is None else [s.strip() for s in args.scopes.split(",")
                                               if s.strip()]
    return BindingIdentity(
        issuer=pick(args.issuer, base.issuer if base else ""),
        remote_account_id=pick(args.remote_account, base.remote_account_id if base else ""),
        remote_subject=pick(args.remote_subject, base.remote_subject if base else ""),
        installation_id=pick(args.installation, base.installation_id if base else ""),
        scopes=tuple(scopes if scopes is not None else (base.scopes if base else ())))


async def run_binding_command(settings: Settings, args: argparse.Namespace,
                              open_database: Callable[[Settings], Awaitable[WorkStore]]) -> int:
    verb = args.binding_command
    record_cli_origin()  # the OS user (and SUDO_USER) beside --actor in the audit log
    actor = _actor(settings, args) if verb not in ("list", "show", "status") else None
    store = await open_database(settings)
    now = WallClock().now_us()
    try:
        await check_schema(store.db, store.dialect)
        if verb == "list":
            found = await store.binding_list(args.org)
            if args.json:
                _print([binding_json(b) for b in found])
            elif not found:
                sys.stdout.write("no bindings" + (f" in org {args.org}" if args.org else "")
                                 + "\n")
            else:
                sys.stdout.write("".join(binding_line(b) + "\n" for b in found))
            return EXIT_OK
        if verb == "status":
            durable = await store.binding_get_many([b.binding_id for b in settings.bindings])
            if args.json:
                _print([{"binding_id": b.binding_id,
                         "durable": (binding_json(durable[b.binding_id])
                                     if b.binding_id in durable else None),
                         "drift": [{"field": d.field, "configured": d.configured,
                                    "durable": d.durable}
                                   for d in (config_drift(bootstrap_facts(b),
                                                          durable[b.binding_id])
                                             if b.binding_id in durable else [])]}
                        for b in settings.bindings])
            elif not settings.bindings:
                sys.stdout.write("no [[bindings]] configured\n")
            for b in settings.bindings if not args.json else ():
                sys.stdout.write(status_line(b, durable.get(b.binding_id)) + "\n")
            return EXIT_OK
        if verb == "show":
            one = await store.binding_get(args.binding_id)
            if one is None:
                raise BindingNotFound(f"no binding {args.binding_id}")
            grant = await store.grant_get(one.binding_id, one.generation)
            # The grant of the current generation: its state, never a token.
            grant_doc = None if grant is None else {
                "state": grant.state.value, "token_version": grant.token_version,
                "key_id": grant.sealed.key_id, "expires_at_us": grant.expires_at_us,
                "last_refresh_at_us": grant.last_refresh_at_us,
                "reason": None if grant.reason is None else {
                    "code": grant.reason.code, "text": grant.reason.text}}
            if args.json:
                _print({**binding_json(one), "grant": grant_doc})
            else:
                sys.stdout.write(show_text(one, grant_doc, now))
            return EXIT_OK
        assert actor is not None
        try:
            if verb == "connect":
                facts = connect(binding_id=args.binding_id, kind=PrincipalKind(args.kind),
                                org_id=args.org, app_installation_id=args.app_installation,
                                provider=args.provider, identity=_identity(args, None),
                                user_id=args.user)
                result = await store.binding_connect(facts, actor, now)
            else:
                current = await store.binding_get(args.binding_id)
                identity = (None if verb == "disconnect" or current is None
                            else _identity(args, current.identity))
                result = await store.binding_transition(
                    args.binding_id, BindingEvent(verb), actor,
                    expected_generation=args.generation, now_us=now, identity=identity)
        except BindingRefused as exc:
            raise WorkConflict(str(exc)) from None
        if args.json:
            _print(binding_json(result))
        else:
            sys.stdout.write(binding_line(result) + "\n")
        return EXIT_OK
    finally:
        await store.db.aclose()


class BindingNotFound(Exception):
    """``binding show`` of an id with no durable binding (exit 1, as every not found)."""


def binding_line(b: BindingFacts) -> str:
    """One binding on one line, as ``binding list`` and the transitions print it."""
    return (f"{b.binding_id}: generation {b.generation} {b.state.value}, {b.kind.value}"
            f" {b.provider}, org {b.org_id}, account {b.identity.remote_account_id}")


def show_text(b: BindingFacts, grant: Mapping[str, object] | None, now_us: int) -> str:
    """``binding show`` for people: times as UTC wall time and how long ago or ahead."""
    ident = b.identity
    lines = [
        binding_line(b),
        f"  app installation {b.app_installation_id}"
        + (f", user {b.user_id}" if b.user_id else ""),
        f"  issuer {ident.issuer}, subject {ident.remote_subject}"
        + (f", installation {ident.installation_id}" if ident.installation_id else "")
        + f", scopes {' '.join(ident.scopes) or '-'}",
    ]
    if grant is None:
        lines.append("  grant: none for this generation")
    else:
        lines.append(f"  grant: {grant['state']}, token version {grant['token_version']},"
                     f" sealed with key {grant['key_id']}")
        lines.append(f"  expires {wall_time(grant['expires_at_us'], now_us)}")
        lines.append(f"  last refresh {wall_time(grant['last_refresh_at_us'], now_us)}")
        reason = grant["reason"]
        if isinstance(reason, dict):
            lines.append(f"  needs attention: {reason['code']}: {reason['text']}")
    return "\n".join(lines) + "\n"


def wall_time(us: object, now_us: int) -> str:
    """``2026-12-04 18:00:00Z (in 5 min)``; ``never`` for no value."""
    if not isinstance(us, int) or us <= 0:
        return "never"
    delta = (us - now_us) / 1_000_000
    return (f"{wall_text(us)}"
            f" ({'in ' + span_text(delta) if delta >= 0 else span_text(-delta) + ' ago'})")


def status_line(b: BindingSettings, facts: BindingFacts | None) -> str:
    """One line: the durable generation, state and account of a configured binding, and
    each field where its TOML entry disagrees with the durable fact (never a secret)."""
    if facts is None:
        return (f"{b.binding_id}: no durable row yet (bootstrapped from the configuration at"
                " start or first admission)")
    head = (f"{b.binding_id}: generation {facts.generation} {facts.state.value}, account"
            f" {facts.identity.remote_account_id}")
    drift = config_drift(bootstrap_facts(b), facts)
    if not drift:
        return f"{head}; the configuration agrees"
    return f"{head}; drift (the durable value wins): " + ", ".join(
        f"{d.field} configured {d.configured} durable {d.durable}" for d in drift)


def _print(doc: object) -> None:
    sys.stdout.write(json.dumps(doc, indent=2) + "\n")
