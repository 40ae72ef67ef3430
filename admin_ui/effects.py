"""The effect journal in the console: lineage, the unknown-outcome queue, repairs (seed 10).

Theory of operation
-------------------
Plugged in through :class:`admin_ui.extensions.ConsoleExtensions`:

* lineage sections on a work item's page (its command, its repair lineage,
  every effect attempt with its outcome class and disposition, the Runtime
  receipt or why the Runtime intent still blocks, the remote link and the
  binding summary), never a payload or a token;
* ``/admin/effects``: attempts awaiting a disposition (outcome unknown, or
  left with no outcome after their dispatch checkpoint), and the form that
  binds a local record to an existing remote record (adopt, or rebind naming
  the link generation seen: the CLI's ``link bind``, admins only);
* repairs, each authorized at request time, CSRF-checked and audited in the
  transaction that makes it: record a disposition on an unresolved attempt
  (attach provider evidence, mark applied or absent), adopt an existing
  remote record after uniqueness checks, retire a blocked command, or issue a
  new command with repair lineage. None edits an attempt's request or
  reopens terminal work. Which of them is allowed from the command's effect
  state, and what receipt it leads to, is the operator-path table's
  (:mod:`daemon.core.operator_paths`): the page shows only the forms it
  allows and the one action it advises (after a disposition of applied,
  retire settles the success; of absent, retire settles no effect or a
  replay dispatches anew), and the store refuses from the same table. A
  disposition is fenced by the store (not while the command's work is
  processing, not within the provider's in-flight window, computed here from
  the catalog); retire and repair decide their evidence in their own
  transaction (``storage/command_repair.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from quart import Blueprint, redirect, request
from quart.wrappers import Response
from werkzeug.wrappers import Response as WerkzeugResponse

from admin_ui.api import json_body
from admin_ui.auth import current_principal, require
from admin_ui.context import console
from admin_ui.errors import BadInput, DatabaseDown, NotFound, classify
from admin_ui.extensions import ConsoleExtensions, LineageRow, LineageSection, NavItem
from admin_ui.filters import reason_from
from admin_ui.render import page
from admin_ui.view import ReplicaView
from config.catalog import Catalog
from daemon.core.effects import DEFAULT_MAX_IN_FLIGHT_S
from daemon.core.identity import BadCoordinate
from daemon.core.ids import is_ulid
from daemon.core.operator_paths import Action, Allowed, verdict
from daemon.core.principals import scope_digest
from daemon.core.work import WorkItem
from daemon.services.command_actions import repair_command, retire_command
from daemon.services.link_operations import bind_remote_record, bound_json
from daemon.services.operator_api import BadRequest, NotAuthorized
from storage.command_operator import FactsRead
from storage.command_repair import RepairActor
from storage.effect_values import (
    Command,
    Disposition,
    EffectAttempt,
    RemoteLink,
    ResultReceipt,
)
from storage.effects import UNRESOLVED_CAP
from storage.find_rows import attempt_exchange, request_headers
from storage.links import read_link
from storage.port import SqlTx

OPERATE = frozenset({"operator", "admin"})
ADMIN = frozenset({"admin"})
ACTIONS = {
    "effect.read": frozenset({"viewer", "operator", "admin"}),
    "effect.repair": OPERATE,
    "command.repair": OPERATE,
    "link.adopt": ADMIN,  # binds an identity: admins only
}
DISPOSITIONS = {"applied": Disposition.OPERATOR_APPLIED, "absent": Disposition.OPERATOR_ABSENT}


def _attempt_json(a: EffectAttempt) -> dict[str, Any]:
    doc = attrs.asdict(a)
    doc["unresolved"] = a.unresolved
    # Why it awaits a disposition: classified unknown, or left with no outcome.
    doc["awaiting"] = ("outcome_unknown" if a.outcome == "OUTCOME_UNKNOWN" else
                       "no_outcome" if a.outcome is None and a.unresolved else None)
    return doc


def _command_json(c: Command) -> dict[str, Any]:
    doc = attrs.asdict(c)
    doc["scope"] = c.scope.as_json()
    doc["settlement"] = c.settlement.value
    doc.pop("frozen_request", None)  # the request body is not shown to operators
    return doc


@attrs.frozen
class RuntimeStatus:
    """Where a command's Runtime intent stands: the lineage root the Runtime
    knows, its receipt, the repair issued for this command, the command's operator
    path (its effect state, which actions the table allows, the one it advises) and
    why the intent still blocks ("" once a receipt exists)."""

    root: Command
    receipt: ResultReceipt | None
    repaired_by: str | None
    blocking: str
    path: FactsRead | None = None

    def allows(self, action: str) -> bool:
        """Whether the operator-path table allows ``action`` now (the forms shown)."""
        if self.path is None:
            return False
        return isinstance(verdict(self.path.facts, Action(action)), Allowed)

    def intent_json(self) -> dict[str, Any]:
        path = self.path.as_json() if self.path is not None else {}
        return {"answered_by_lineage_of": self.root.command_id,
                "repaired_by": self.repaired_by, "blocking": self.blocking or None,
                "effect_state": path.get("effect_state"),
                "next_action": path.get("next_action"), "advice": path.get("advice")}


async def runtime_status(view: ReplicaView, command: Command,
                         current: tuple[int, str]) -> RuntimeStatus:
    """``current``: the Catalog revision (and digest) this replica serves, against
    which the table judges the command's pins."""
    lineage = await view.store.command_lineage(command.command_id)
    root = lineage[0] if lineage else command
    receipt = await view.store.receipt_get(root.command_id)
    path = await view.store.command_operator_path(command.command_id, current)
    blocking = ""
    if receipt is None and path is not None:
        blocking = f"{path.state}; next: {path.advice}"
    return RuntimeStatus(root, receipt, path.repaired_by if path else None, blocking, path)


# The Catalog revision a command pinned, as stored (None: not stored any more).
PinnedCatalog = Callable[[int, str], Awaitable[Catalog | None]]


async def _no_pinned(revision: int, digest: str) -> Catalog | None:
    return None


@attrs.define(eq=False)
class EffectConsole:
    catalog: Catalog
    # The definitions a command runs under are its pinned revision's.
    pinned: PinnedCatalog = _no_pinned

    # ------------------------------------------------------------ lineage

    async def _command_of(self, view: ReplicaView, item: WorkItem) -> Command | None:
        if item.subject_kind not in ("command", "receipt") or not is_ulid(item.subject_id):
            return None
        return await view.store.command_get(item.subject_id)

    async def command_section(self, view: ReplicaView, item: WorkItem) -> LineageSection | None:
        command = await self._command_of(view, item)
        if command is None:
            return None
        rows = [
            LineageRow("Command", command.command_id,
                       f"/admin/effects/commands/{command.command_id}"),
            LineageRow("Intent", f"{command.intent_kind} {command.intent_id}"),
            LineageRow("Operation", command.operation),
            LineageRow("Target", f"{command.local_object} {command.local_id}"),
            LineageRow("Runtime", command.runtime_name),
            LineageRow("Settlement", command.settlement.value),
        ]
        if command.repair_of:
            rows.append(LineageRow("Repair of", command.repair_of,
                                   f"/admin/effects/commands/{command.repair_of}"))
        status = await runtime_status(view, command, self.current)
        receipt = status.receipt
        if status.repaired_by:
            rows.append(LineageRow("Repaired by", status.repaired_by,
                                   f"/admin/effects/commands/{status.repaired_by}"))
        if status.root.command_id != command.command_id:
            rows.append(LineageRow("Runtime intent of", status.root.command_id,
                                   f"/admin/effects/commands/{status.root.command_id}"))
        if receipt is not None:
            rows.append(LineageRow(
                "Runtime receipt",
                f"format {receipt.result_format_version}, {receipt.state.value}"
                + (f", remote {receipt.remote_id}" if receipt.remote_id else "")
                + (f", last error {receipt.last_error}" if receipt.last_error else ""),
            ))
        if status.blocking:
            rows.append(LineageRow("Runtime intent blocking", status.blocking))
        if status.path is not None:
            rows.append(LineageRow("Effect state", status.path.state))
            rows.append(LineageRow("Next action", status.path.advice))
        return LineageSection("commands", "External command", tuple(rows))

    async def attempts_section(self, view: ReplicaView,
                               item: WorkItem) -> LineageSection | None:
        command = await self._command_of(view, item)
        if command is None:
            return None
        attempts = await view.store.effect_attempts(command.command_id)
        rows = tuple(
            LineageRow(
                f"Attempt (epoch {a.ownership_epoch})",
                f"{a.method} {a.target_path}: {a.outcome or 'dispatched, no outcome recorded'}"
                + (f", HTTP {a.response_status}" if a.response_status else "")
                + (f", disposition {a.disposition} by {a.disposition_by}" if a.disposition
                   else ""),
                f"/admin/effects/attempts/{a.attempt_id}",
            )
            for a in attempts
        )
        return LineageSection("effect_attempts", "Effect attempts", rows,
                              "no external call was made")

    async def link_section(self, view: ReplicaView, item: WorkItem) -> LineageSection | None:
        command = await self._command_of(view, item)
        if command is None:
            return None
        # The link the command pinned at admission (its key names the remote account
        # of the durable binding then), as it is now.
        key = command.link_key
        if key is None:
            return LineageSection("remote_links", "Remote link", (), "no link pinned")

        async def body(tx: SqlTx) -> RemoteLink | None:
            return await read_link(tx, key)

        link = await view.store.db.transact(body, name="console.link", write=False)
        if link is None:
            return LineageSection("remote_links", "Remote link", (),
                                  f"no remote link {key} (none existed at admission)")
        return LineageSection("remote_links", "Remote link", (
            LineageRow("Link", link.link_key),
            LineageRow("Remote", f"{link.remote_object or '-'} {link.remote_id or '-'}"),
            LineageRow("State", f"{link.state.value}, generation {link.generation}"),
        ))

    async def binding_section(self, view: ReplicaView,
                              item: WorkItem) -> LineageSection | None:
        command = await self._command_of(view, item)
        if command is None:
            return None
        principal = await view.store.binding_get(command.binding_id)
        current = ("no durable binding" if principal is None
                   else f"{principal.generation} ({principal.state.value})")
        pinned = command.binding_generation
        return LineageSection("bindings", "Binding summary", (
            LineageRow("Binding", command.binding_id),
            LineageRow("Pinned generation", "none" if pinned is None else str(pinned)),
            LineageRow("Current generation", current),
            LineageRow("Catalog revision", f"{command.catalog_revision}"
                       f" {command.catalog_digest or '(no digest)'} (current:"
                       f" {self.catalog.revision})"),
        ))

    @property
    def current(self) -> tuple[int, str]:
        """The Catalog revision this replica serves (what a replay resolves)."""
        return self.catalog.revision, self.catalog.digest

    # ------------------------------------------------------------ actions

    async def dispose(self, attempt_id: str, disposition: str, note: str,
                      actor: str) -> EffectAttempt:
        operator = authorize_console(actor, "effect.repair")
        if disposition not in DISPOSITIONS:
            raise BadInput("disposition must be applied or absent")
        if not note.strip():
            raise BadInput("record the provider evidence in the note")
        view = console().view
        attempt = await view.store.effect_attempt_get(attempt_id)
        if attempt is None:
            raise NotFound(f"no effect attempt {attempt_id}")
        command = await view.store.command_get(attempt.command_id)
        return await view.store.effect_operator_disposition(
            attempt_id=attempt_id, disposition=DISPOSITIONS[disposition], note=note,
            actor=operator[0], role=operator[1],
            in_flight_window_us=await self.in_flight_window_us(command),
            now_us=view.clock.now_us(),
        )

    async def in_flight_window_us(self, command: Command | None) -> int:
        """How long a dispatched request of ``command`` may still be applied: the
        window reconciliation uses, from the command's pinned revision (the longer of
        L1's and the binding's, as L2 may only lengthen it); with the definition gone,
        the longest default, never a shorter one."""
        default = DEFAULT_MAX_IN_FLIGHT_S
        if command is None:
            return int(default * 1_000_000)
        source = await self.pinned(command.catalog_revision, command.catalog_digest) \
            or self.catalog
        op = source.operation(command.operation)
        binding = source.binding(command.binding_id)
        window = max(op.contract.max_in_flight_s if op is not None else default,
                     binding.max_in_flight if binding is not None else 0.0)
        return int(window * 1_000_000)

    async def retire(self, command_id: str, reason: str, actor: str) -> str:
        """Retire a blocked command; the store decides from the operator-path table
        and proves what it settles in its own transaction, over the whole lineage."""
        name, role = authorize_console(actor, "command.repair")
        view = console().view
        settlement = await retire_command(view.store, view.settings, command_id,
                                          RepairActor(actor=name, role=role, reason=reason),
                                          view.clock.now_us())
        return settlement.value

    async def repair(self, command_id: str, reason: str, actor: str) -> str:
        name, role = authorize_console(actor, "command.repair")
        view = console().view
        command = await view.store.command_get(command_id)
        if command is None:
            raise NotFound(f"no command {command_id}")
        try:
            return await repair_command(view.store, view.settings, self.catalog, command_id,
                                        RepairActor(actor=name, role=role, reason=reason),
                                        view.clock.now_us())
        except BadRequest as exc:
            raise BadInput(str(exc)) from None

    async def adopt(self, doc: dict[str, Any], actor: str) -> dict[str, Any]:
        name, role = authorize_console(actor, "link.adopt")
        binding = self.catalog.binding(str(doc.get("binding_id", "")))
        if binding is None:
            raise BadInput("binding_id must name a configured binding")
        fields = {}
        for key in ("local_object", "local_id", "remote_object", "remote_id"):
            value = doc.get(key)
            if not isinstance(value, str) or not value.strip() or len(value) > 255:
                raise BadInput(f"{key} must be a non-empty string")
            fields[key] = value
        view = console().view
        # Adopted into the durable binding's remote account: where new work looks.
        principal = await view.store.binding_get(binding.binding_id)
        if principal is None:
            raise BadInput(f"binding {binding.binding_id} has no durable row yet")
        try:
            link = await view.store.link_adopt(
                scope_digest(principal), fields["local_object"], fields["local_id"],
                fields["remote_object"], fields["remote_id"], actor=name, role=role,
                reason=reason_from(doc.get("reason")), now_us=view.clock.now_us(),
            )
        except BadCoordinate as exc:
            raise BadInput(str(exc)) from None
        return {"link_key": link.link_key, "state": link.state.value,
                "remote_object": link.remote_object, "remote_id": link.remote_id,
                "generation": link.generation}


    async def bind(self, doc: dict[str, Any], actor: str) -> dict[str, Any]:
        """An admin binds a local record to an existing remote record: the CLI's ``link
        bind`` (adopt, or rebind naming the generation seen; refusals with their code)."""
        view = console().view
        raw = doc.get("generation")
        expected: int | None = None
        if raw is not None and str(raw).strip():
            try:
                expected = int(str(raw).strip())
            except ValueError:
                raise BadInput("invalid_input: the generation you saw is a whole number"
                               " from 1") from None

        def text(key: str, default: str = "") -> str:
            value = doc.get(key, default)
            if not isinstance(value, str):
                raise BadInput(f"invalid_input: {key} must be a string")
            return value

        bound = await bind_remote_record(
            view.store, view.settings, view.clock, actor=actor,
            binding_id=text("binding_id"), local_object=text("local_object", "lead"),
            local_id=text("local_id"), remote_object=text("remote_object", "contact"),
            remote_id=text("remote_id"), expected_generation=expected,
            reason=reason_from(doc.get("reason")))
        return bound_json(bound)


def authorize_console(actor: str, action: str) -> tuple[str, str]:
    """The current settings decide, now: the operator must exist and hold the role."""
    operator = console().view.settings.operator(actor)
    if operator is None:
        raise NotAuthorized(f"{actor!r} is not a configured operator")
    if operator.role not in ACTIONS[action]:
        raise NotAuthorized(f"{actor!r} ({operator.role}) may not {action}")
    return operator.name, operator.role


# ------------------------------------------------------------------ HTTP

def _principal_name() -> str:
    principal = current_principal()
    assert principal is not None
    return principal.name


def _ulid(value: str) -> str:
    if not is_ulid(value):
        raise NotFound(f"no such id {value[:40]}")
    return value


def build_blueprint(ec: EffectConsole) -> Blueprint:
    bp = Blueprint("effects", __name__)

    async def effects_page(status: int = 200, error: str | None = None,
                           notice: str | None = None) -> Response:
        view = console().view
        unknown = await view.store.effect_unknown_list(200)
        outcome_unknown, no_outcome = await view.store.effect_unresolved_counts()
        return await page("effects.html", status=status, error=error, notice=notice,
                          unknown=unknown, bindings=view.settings.bindings,
                          outcome_unknown=outcome_unknown, no_outcome=no_outcome)

    async def refused(exc: Exception, render: Any) -> Response:
        err = classify(exc)
        if err is None or isinstance(err, DatabaseDown):
            raise exc
        result: Response = await render(err.status, err.message)
        return result

    @bp.get("/admin/effects")
    @require("effect.read")
    async def effects() -> Response:
        return await effects_page()

    @bp.get("/admin/effects/attempts/<attempt_id>")
    @require("effect.read")
    async def attempt_page(attempt_id: str, status: int = 200,
                           error: str | None = None) -> Response:
        attempt = await console().view.store.effect_attempt_get(_ulid(attempt_id))
        if attempt is None:
            raise NotFound(f"no effect attempt {attempt_id}")
        audit = await console().view.store.audit_list(target_id=attempt_id)
        exchange = await attempt_exchange(console().view.store, attempt_id)
        return await page("effect_attempt.html", status=status, error=error, attempt=attempt,
                          audit=audit, exchange=exchange,
                          request_headers=request_headers(attempt.safe_headers),
                          notice="Disposition recorded." if request.args.get(
                              "notice") == "disposed" else None)

    @bp.post("/admin/effects/attempts/<attempt_id>/disposition")
    @require("effect.repair")
    async def attempt_dispose(attempt_id: str) -> Response | WerkzeugResponse:
        form = await request.form
        try:
            await ec.dispose(_ulid(attempt_id), str(form.get("disposition", "")),
                             str(form.get("note", "")), _principal_name())
        except Exception as exc:
            return await refused(exc, lambda s, m: attempt_page(attempt_id, s, m))
        return redirect(f"/admin/effects/attempts/{attempt_id}?notice=disposed")

    @bp.get("/admin/effects/commands/<command_id>")
    @require("effect.read")
    async def command_page(command_id: str, status: int = 200, error: str | None = None,
                           notice: str | None = None) -> Response:
        view = console().view
        command = await view.store.command_get(_ulid(command_id))
        if command is None:
            raise NotFound(f"no command {command_id}")
        runtime = await runtime_status(view, command, ec.current)
        return await page(
            "effect_command.html", status=status, error=error, notice=notice,
            command=command, attempts=await view.store.effect_attempts(command_id),
            receipt=runtime.receipt, runtime=runtime,
            audit=await view.store.audit_list(target_id=command_id),
        )

    @bp.post("/admin/effects/commands/<command_id>/retire")
    @require("command.repair")
    async def command_retire(command_id: str) -> Response:
        form = await request.form
        try:
            settlement = await ec.retire(_ulid(command_id), reason_from(form.get("reason")),
                                         _principal_name())
        except Exception as exc:
            return await refused(exc, lambda s, m: command_page(command_id, s, m))
        return await command_page(command_id, notice=f"Retired: {settlement}.")

    @bp.post("/admin/effects/commands/<command_id>/repair")
    @require("command.repair")
    async def command_repair(command_id: str) -> Response | WerkzeugResponse:
        form = await request.form
        try:
            new_id = await ec.repair(_ulid(command_id), reason_from(form.get("reason")),
                                     _principal_name())
        except Exception as exc:
            return await refused(exc, lambda s, m: command_page(command_id, s, m))
        return redirect(f"/admin/effects/commands/{new_id}")

    @bp.post("/admin/effects/links/adopt")
    @require("link.adopt")
    async def link_adopt() -> Response:
        form = await request.form
        try:
            link = await ec.adopt(dict(form.items()), _principal_name())
        except Exception as exc:
            return await refused(exc, effects_page)
        return await effects_page(notice=f"Linked ({link['link_key']}).")

    @bp.post("/admin/effects/links/bind")
    @require("link.bind")
    async def link_bind() -> Response:
        form = await request.form
        try:
            bound = await ec.bind(dict(form.items()), _principal_name())
        except Exception as exc:
            return await refused(exc, effects_page)
        link = bound["link"]
        return await effects_page(notice=(
            f"Bound ({bound['outcome']}): {link['local_object']} {link['local_id']} is"
            f" {link['remote_object']} {link['remote_id']}, link generation"
            f" {link['generation']}."))

    # JSON API (the same actions)

    @bp.get("/admin/api/effects/unknown")
    @require("effect.read")
    async def api_unknown() -> dict[str, Any]:
        store = console().view.store
        attempts = await store.effect_unknown_list(200)
        unknown, left = await store.effect_unresolved_counts()
        # Each count stops at UNRESOLVED_CAP: "more" says there are more than it.
        return {"attempts": [_attempt_json(a) for a in attempts],
                "counts": {"outcome_unknown": unknown.n, "no_outcome": left.n},
                "more": {"outcome_unknown": unknown.more, "no_outcome": left.more},
                "counted_up_to": UNRESOLVED_CAP}

    @bp.get("/admin/api/effects/commands/<command_id>")
    @require("effect.read")
    async def api_command(command_id: str) -> dict[str, Any]:
        view = console().view
        command = await view.store.command_get(_ulid(command_id))
        if command is None:
            raise NotFound(f"no command {command_id}")
        runtime = await runtime_status(view, command, ec.current)
        receipt = runtime.receipt
        return {
            "command": _command_json(command),
            "attempts": [_attempt_json(a) for a in await view.store.effect_attempts(command_id)],
            "receipt": attrs.asdict(receipt) if receipt else None,
            "runtime_intent": runtime.intent_json(),
        }

    @bp.post("/admin/api/effects/attempts/<attempt_id>/disposition")
    @require("effect.repair")
    async def api_dispose(attempt_id: str) -> dict[str, Any]:
        body = await json_body()
        attempt = await ec.dispose(_ulid(attempt_id), str(body.get("disposition", "")),
                                   str(body.get("note", "")), _principal_name())
        return {"attempt": _attempt_json(attempt)}

    @bp.post("/admin/api/effects/commands/<command_id>/retire")
    @require("command.repair")
    async def api_retire(command_id: str) -> dict[str, Any]:
        body = await json_body()
        settlement = await ec.retire(_ulid(command_id), reason_from(body.get("reason")),
                                     _principal_name())
        return {"command_id": command_id, "settlement": settlement}

    @bp.post("/admin/api/effects/commands/<command_id>/repair")
    @require("command.repair")
    async def api_repair(command_id: str) -> dict[str, Any]:
        body = await json_body()
        new_id = await ec.repair(_ulid(command_id), reason_from(body.get("reason")),
                                 _principal_name())
        return {"repair_of": command_id, "command_id": new_id}

    @bp.post("/admin/api/effects/links/adopt")
    @require("link.adopt")
    async def api_adopt() -> dict[str, Any]:
        return await ec.adopt(await json_body(), _principal_name())

    @bp.post("/admin/api/effects/links/bind")
    @require("link.bind")
    async def api_bind() -> dict[str, Any]:
        return await ec.bind(await json_body(), _principal_name())

    return bp


def _op(summary: str, method: str, *, body: bool = False, param: str | None = None
        ) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "summary": summary,
        "responses": {"200": {"description": "ok"}, "400": {"description": "bad input"},
                      "401": {"description": "sign in"}, "403": {"description": "role"},
                      "404": {"description": "not found"},
                      "409": {"description": "conflict"},
                      "503": {"description": "database unavailable"}},
    }
    if param:
        spec["parameters"] = [{"name": param, "in": "path", "required": True,
                               "schema": {"type": "string"}}]
    if body:
        spec["responses"].update({"413": {"description": "body over 64 KiB"},
                                  "415": {"description": "body is not JSON"}})
        spec["requestBody"] = {"required": True,
                               "content": {"application/json": {"schema": {"type": "object"}}}}
    return {method: spec}


OPENAPI_PATHS: dict[str, dict[str, Any]] = {
    "/admin/api/effects/unknown": _op(
        "Effect attempts awaiting a disposition (OUTCOME_UNKNOWN, or left with no outcome"
        " after their dispatch checkpoint), oldest first, with both counts; each count"
        " stops at counted_up_to (more: true says there are more)", "get"),
    "/admin/api/effects/commands/{command_id}": _op(
        "A command with its attempts and receipt", "get", param="command_id"),
    "/admin/api/effects/attempts/{attempt_id}/disposition": _op(
        "Record an operator disposition (applied|absent) with provider evidence", "post",
        body=True, param="attempt_id"),
    "/admin/api/effects/commands/{command_id}/retire": _op(
        "Retire a blocked command: settles what its lineage proves (success when an"
        " attempt is proven applied, no effect when every attempt is proven effect-free),"
        " else retired without a receipt; refused (409, with a code) as the operator-path"
        " table says", "post", body=True,
        param="command_id"),
    "/admin/api/effects/commands/{command_id}/repair": _op(
        "Issue a new command with repair lineage", "post", body=True, param="command_id"),
    "/admin/api/effects/links/adopt": _op(
        "Adopt an existing remote record for a local record that has no link", "post",
        body=True),
    "/admin/api/effects/links/bind": _op(
        "Bind a local record to an existing remote record: adopt it, or rebind an active"
        " link naming the generation seen (admins; refusals carry a stable code)", "post",
        body=True),
}


def effect_extensions(catalog: Catalog,
                      pinned: PinnedCatalog = _no_pinned) -> ConsoleExtensions:
    ec = EffectConsole(catalog, pinned)
    return ConsoleExtensions(
        lineage=[ec.command_section, ec.attempts_section, ec.link_section, ec.binding_section],
        blueprints=[build_blueprint(ec)],
        nav=[NavItem("/admin/effects", "Effects", "effect.read")],
        actions=dict(ACTIONS),
        openapi_paths=OPENAPI_PATHS,
    )
