"""The service API (``/v1/``) the CRM Runtime calls: command admission and its fence.

* ``POST /v1/commands``: accept a command exactly once (or answer from the
  existing admission fact);
* ``POST /v1/commands/batch``: many commands in one request and one transaction (what an
  outbox relay sends), answered entry by entry exactly as ``/v1/commands`` would;
* ``POST /v1/handoffs/reject``: ``RejectIfUnaccepted``;
* ``GET /v1/handoffs?effect_handoff_key=...``: read the admission fact (404 is *not* evidence
  of rejection);
* ``POST /v1/bindings/{binding_id}/{flow}`` and ``GET /v1/bindings/{binding_id}``: the
  Runtime's connect flows (:mod:`daemon.api.connect_routes`);
* ``GET /v1/openapi.json``.

A command names the Catalog revision it was built against; it is validated
against that *published* revision's definitions and pinned to its
(revision, digest), whatever revision the configuration serves as current
(409 ``catalog_revision_not_published`` when none is published under that
number).

Callers authenticate with a bearer token bound, in the configuration, to one
``TrustedRuntimeWorkScope``. Bodies are validated in
:mod:`daemon.api.validation`; errors are JSON ``{"error", "message"}`` with a
stable code. Nothing is written for a malformed, unauthenticated or
cross-scope request, except that a malformed body under an already admitted
key (with another digest or outbox identity) is also quarantined.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from typing import Any

import attrs
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, InternalServerError, MethodNotAllowed

from config.catalog import Catalog
from config.settings import RuntimeClient, Settings
from daemon.api.connect_routes import add_connect_routes
from daemon.api.openapi import OPENAPI
from daemon.api.validation import (
    ApiError,
    HandoffFields,
    command_body,
    handoff_fields,
    only_fields,
    ownership_refusal,
    requested_revision,
    requested_user,
)
from daemon.core.canonical import NotCanonical, canonical_digest
from daemon.core.field_ownership import OwnershipRefusal
from daemon.core.handoff import EffectHandoffKey, TrustedRuntimeWorkScope
from daemon.core.identity import integration_link_key_v2
from daemon.core.json_input import BadJson, parse_json
from daemon.core.principals import BindingFacts, BindingState, PrincipalKind, scope_digest
from daemon.core.token_bundle import TokenKey
from daemon.services import logs
from daemon.services.catalog_view import CatalogView
from daemon.services.clock import Clock
from daemon.services.http_guard import guard_app
from daemon.services.principal_bootstrap import bootstrap_facts
from storage.commands import EFFECT_FAMILY
from storage.effect_values import Admission, AdmissionResult, CommandDraft
from storage.port import StorageError
from storage.work_store import WorkStore

NO_USER_BINDING = "no_user_binding"


@attrs.define(eq=False)
class ApiContext:
    settings: Settings
    store: WorkStore
    catalog: Catalog
    clock: Clock
    # The published revisions; a command is validated against, and pinned to,
    # the one it names.
    catalogs: CatalogView
    # Called after a command is accepted, so the local scheduler claims it at once.
    wake: Callable[[str], None] = lambda family: None
    # Called for every answered admission: (request "command" or "reject", admission, created).
    on_admission: Callable[[str, str, bool], None] = lambda request, admission, created: None
    # The key that seals the grants the connect flows hand over (None: no [keys] active,
    # so a flow that carries a grant is refused with 409 no_token_keys).
    token_key: TokenKey | None = None


def _scope(rc: RuntimeClient) -> TrustedRuntimeWorkScope:
    return TrustedRuntimeWorkScope(rc.org_id, rc.app_installation_id, rc.runtime_capability_id,
                                   rc.runtime_work_binding_digest)


def _json(doc: dict[str, Any], status: int) -> Response:
    return Response(json.dumps(doc), status=status, content_type="application/json")


class _Refused(Exception):
    """A valid command integrationd refuses for good, with a stable code: a field the
    pinned revision may not send, a user with no binding in the scope. It is answered with
    a rejection tombstone, so its key is answered the same way from then on."""

    def __init__(self, handoff: HandoffFields, code: str, sentence: str,
                 field: str = "") -> None:
        super().__init__(code)
        self.handoff = handoff
        self.code = code
        self.sentence = sentence
        self.field = field

    @classmethod
    def of_ownership(cls, handoff: HandoffFields, refusal: OwnershipRefusal) -> _Refused:
        return cls(handoff, refusal.code, refusal.sentence, refusal.field)


def _admission_json(result: AdmissionResult, key: str) -> tuple[dict[str, Any], int]:
    if result.admission is Admission.COMMAND_ACCEPTED:
        return {"admission": result.admission.value, "command_id": result.command_id,
                "effect_handoff_key": key}, 200
    if result.admission is Admission.HANDOFF_REJECTED:
        return {"admission": result.admission.value,
                "receipt": json.loads(result.receipt or "{}")}, 409
    return {"error": "quarantined",
            "message": "this handoff key is already admitted with a different payload digest"
                       " or runtime outbox identity; the conflict was recorded"}, 409


def create_api_app(ctx: ApiContext) -> QuartTrio:
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = ctx.settings.api.max_body_bytes

    def caller() -> RuntimeClient:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() == "bearer" and token:
            for rc in ctx.settings.runtimes:
                if rc.token is not None and hmac.compare_digest(
                        rc.token.reveal().encode(), token.encode()):
                    return rc
        # RFC 6750: name the scheme; error="invalid_token" only when a token was offered.
        challenge = 'Bearer realm="integrationd"'
        if header:
            challenge += ', error="invalid_token"'
        raise ApiError(401, "unauthenticated", "a valid bearer token is required",
                       {"WWW-Authenticate": challenge})

    async def json_body() -> Any:
        if request.mimetype != "application/json":
            raise ApiError(415, "unsupported_media_type", "send application/json")
        raw = await request.get_data(as_text=False)
        assert isinstance(raw, bytes)
        try:
            return parse_json(raw)
        except BadJson as exc:
            raise ApiError(400, "malformed_json", exc.message) from None

    async def resolve(docs: list[Any]) -> dict[int, Catalog | None]:
        """The published revisions these bodies name: one read per distinct revision."""
        wanted = {r for r in map(requested_revision, docs) if r is not None}
        return {r: await ctx.catalogs.published(r) for r in sorted(wanted)}

    async def principals(rc: RuntimeClient, revisions: dict[int, Catalog | None],
                         docs: list[Any]) -> dict[str, BindingFacts]:
        """The durable PrincipalBinding of every binding this scope may use (one read),
        and the per-user bindings of the users ``docs`` name; a configured binding with
        no row yet is bootstrapped from its TOML entry."""
        configured = [b for b in ctx.settings.bindings
                      if (b.org_id, b.app_installation_id)
                      == (rc.org_id, rc.app_installation_id)]
        ids = {b.binding_id for b in configured}
        for catalog in revisions.values():
            ids.update(b.binding_id for b in (catalog.bindings if catalog else ())
                       if (b.org_id, b.app_installation_id)
                       == (rc.org_id, rc.app_installation_id))
        found = await ctx.store.binding_get_many(sorted(ids))
        for user in sorted({u for u in map(requested_user, docs) if u}):
            for facts in await ctx.store.binding_find_user(
                    rc.org_id, rc.app_installation_id, None, user):
                found[facts.binding_id] = facts
        for b in configured:
            if b.binding_id not in found:
                found[b.binding_id] = await ctx.store.binding_bootstrap(
                    bootstrap_facts(b), ctx.clock.now_us())
        return found

    def draft_for(rc: RuntimeClient, doc: Any, revisions: dict[int, Catalog | None],
                  principals: dict[str, BindingFacts]) -> CommandDraft:
        revision = requested_revision(doc)
        pinned = revisions.get(revision) if revision is not None else None
        valid = command_body(doc, _scope(rc), pinned)
        assert pinned is not None
        refusal = ownership_refusal(pinned, valid)
        if refusal is not None:
            raise _Refused.of_ownership(valid.handoff, refusal)
        op = valid.operation
        binding = pinned.binding_for(rc.org_id, rc.app_installation_id, op.provider)
        if binding is None:
            raise ApiError(422, "no_binding", f"no {op.provider} binding for this scope")
        # The command pins the durable binding's generation (seed 8.1), never the TOML's;
        # a per-user command, its user's binding (the L2 binding gives the endpoint).
        principal = principals.get(binding.binding_id)
        if valid.user_id:
            mine = sorted((p for p in principals.values()
                           if p.kind is PrincipalKind.PER_USER and p.user_id == valid.user_id
                           and p.provider == op.provider
                           and (p.org_id, p.app_installation_id)
                           == (rc.org_id, rc.app_installation_id)),
                          key=lambda p: p.binding_id)
            if not mine:
                raise _Refused(valid.handoff, NO_USER_BINDING,
                               f"user {valid.user_id!r} has no {op.provider} binding in"
                               " this scope")
            if binding.auth != "grant":
                raise ApiError(422, "per_user_needs_grants",
                               f"binding {binding.binding_id} authenticates with a static"
                               " token: it cannot carry a per-user principal")
            principal = mine[0]
        if principal is None or principal.state is not BindingState.CONNECTED:
            raise ApiError(409, "binding_not_connected",
                           f"binding {(principal or binding).binding_id} is not connected;"
                           " an operator or the Runtime's connect flow"
                           " connects or reconnects it (integrationd binding)")
        handoff = valid.handoff
        return CommandDraft(
            scope=_scope(rc), runtime_name=rc.name, handoff_key=handoff.key_text,
            payload_digest=handoff.payload_digest, runtime_outbox_id=handoff.runtime_outbox_id,
            intent_id=handoff.key.handoff_id, intent_kind=valid.intent_kind,
            operation=op.name, local_object=op.local_object, local_id=valid.local_id,
            binding_id=principal.binding_id, binding_generation=principal.generation,
            catalog_revision=pinned.revision, catalog_digest=pinned.digest,
            frozen_request=valid.frozen_request,
            max_attempts=ctx.settings.family(EFFECT_FAMILY).max_attempts,
            lane=f"{rc.org_id}:{op.local_object}:{valid.local_id}",
            # The links of the durable principal's remote account (docs/identity.md):
            # never the TOML's bootstrap account, which a rebind leaves behind.
            link_key=integration_link_key_v2(scope_digest(principal), op.local_object,
                                             valid.local_id),
        )

    async def quarantine_invalid(rc: RuntimeClient, doc: Any, error: ApiError) -> None:
        """A body that failed validation, under a key that is already admitted with
        another body, is quarantined as well as refused (seed 6.1)."""
        try:
            handoff = handoff_fields(doc, _scope(rc), also=("command",))
        except ApiError:
            return  # no usable key in scope: nothing it could conflict with
        try:
            matches = canonical_digest(doc.get("command")) == handoff.payload_digest
        except (NotCanonical, TypeError, ValueError):
            matches = False
        if await ctx.store.command_quarantine_invalid(
            handoff_key=handoff.key_text, runtime_name=rc.name,
            payload_digest=handoff.payload_digest, runtime_outbox_id=handoff.runtime_outbox_id,
            body_matches_digest=matches, reason=f"invalid_body:{error.code}",
            now_us=ctx.clock.now_us(),
        ):
            logs.warn("handoff_quarantined", runtime=rc.name, reason=f"invalid_body:{error.code}")

    async def checked_draft(rc: RuntimeClient, doc: Any, revisions: dict[int, Catalog | None],
                            bound: dict[str, BindingFacts]) -> CommandDraft:
        try:
            return draft_for(rc, doc, revisions, bound)
        except ApiError as exc:
            await quarantine_invalid(rc, doc, exc)
            raise

    async def rejected(rc: RuntimeClient, refused: _Refused) -> tuple[dict[str, Any], int]:
        """A command integrationd refuses for good: a rejection tombstone naming the
        reason (or the command already accepted under its key), so the same key is
        answered the same way from now on."""
        handoff = refused.handoff
        result = await ctx.store.command_reject_if_unaccepted(
            scope=_scope(rc), runtime_name=rc.name, handoff_key=handoff.key_text,
            payload_digest=handoff.payload_digest, runtime_outbox_id=handoff.runtime_outbox_id,
            now_us=ctx.clock.now_us(), reason=refused.code)
        ctx.on_admission("command", result.admission.value, result.created)
        if result.created:
            logs.warn("command_rejected", runtime=rc.name, reason=refused.code,
                      **({"field": refused.field} if refused.field else {}))
        elif result.admission is Admission.QUARANTINED:
            logs.warn("handoff_quarantined", runtime=rc.name, reason=result.reason)
        body, status = _admission_json(result, handoff.key_text)
        if result.admission is Admission.HANDOFF_REJECTED:
            body = {**body, "error": refused.code, "message": refused.sentence}
        return body, status

    def answered(rc: RuntimeClient, draft: CommandDraft,
                 result: AdmissionResult) -> tuple[dict[str, Any], int]:
        ctx.on_admission("command", result.admission.value, result.created)
        if result.created:
            logs.debug("command_accepted", command_id=result.command_id, work_id=result.work_id,
                       runtime=rc.name, operation=draft.operation)
        elif result.admission is Admission.QUARANTINED:
            logs.warn("handoff_quarantined", runtime=rc.name, reason=result.reason)
        return _admission_json(result, draft.handoff_key)

    @app.post("/v1/commands")
    async def accept_command() -> Response:
        rc = caller()
        doc = await json_body()
        revisions = await resolve([doc])
        try:
            draft = await checked_draft(rc, doc, revisions,
                                        await principals(rc, revisions, [doc]))
        except _Refused as refused:
            return _json(*await rejected(rc, refused))
        result = await ctx.store.command_accept(draft, ctx.clock.now_us())
        if result.created:
            ctx.wake(EFFECT_FAMILY)
        return _json(*answered(rc, draft, result))

    @app.post("/v1/commands/batch")
    async def accept_commands() -> Response:
        """Many commands in one request and one transaction; one answer per entry, in order.

        Each answer is what ``POST /v1/commands`` would answer for that entry
        alone, with its HTTP status in ``status``; an entry that fails
        validation is answered with its error and nothing is written for it.
        """
        rc = caller()
        doc = await json_body()
        if isinstance(doc, dict):
            only_fields(doc, ("commands",), "the body")
        entries = doc.get("commands") if isinstance(doc, dict) else None
        limit = ctx.settings.api.max_batch_commands
        if not isinstance(entries, list) or not entries:
            raise ApiError(400, "invalid_request", "commands must be a non-empty array")
        if len(entries) > limit:
            raise ApiError(400, "batch_too_large", f"at most {limit} commands per batch")
        answers: list[dict[str, Any] | None] = []
        drafts: list[CommandDraft] = []
        revisions = await resolve(entries)
        bound = await principals(rc, revisions, entries)
        for entry in entries:
            try:
                drafts.append(await checked_draft(rc, entry, revisions, bound))
                answers.append(None)
            except ApiError as exc:
                answers.append({"status": exc.status, "error": exc.code, "message": exc.message})
            except _Refused as refused:
                body, status = await rejected(rc, refused)
                answers.append({"status": status, **body})
        results = iter(await ctx.store.command_accept_many(drafts, ctx.clock.now_us()))
        valid = iter(drafts)
        created = False
        for i, answer in enumerate(answers):
            if answer is None:
                draft, result = next(valid), next(results)
                created = created or result.created
                body, status = answered(rc, draft, result)
                answers[i] = {"status": status, **body}
        if created:
            ctx.wake(EFFECT_FAMILY)
        return _json({"results": answers}, 200)

    @app.post("/v1/handoffs/reject")
    async def reject_if_unaccepted() -> Response:
        rc = caller()
        handoff = handoff_fields(await json_body(), _scope(rc))
        result = await ctx.store.command_reject_if_unaccepted(
            scope=_scope(rc), runtime_name=rc.name, handoff_key=handoff.key_text,
            payload_digest=handoff.payload_digest, runtime_outbox_id=handoff.runtime_outbox_id,
            now_us=ctx.clock.now_us(),
        )
        ctx.on_admission("reject", result.admission.value, result.created)
        if result.admission is Admission.QUARANTINED:
            logs.warn("handoff_quarantined", runtime=rc.name, reason=result.reason)
        body, status = _admission_json(result, handoff.key_text)
        # Answering a reject request, a tombstone is the successful outcome.
        return _json(body, 200 if result.admission is Admission.HANDOFF_REJECTED else status)

    @app.get("/v1/handoffs")
    async def read_admission() -> Response:
        rc = caller()
        key = request.args.get("effect_handoff_key", "")
        try:
            parsed = EffectHandoffKey.parse(key)
        except ValueError as exc:
            raise ApiError(400, "bad_handoff_key", str(exc)) from None
        if parsed.scope != _scope(rc):
            raise ApiError(403, "scope_mismatch",
                           "the handoff key does not belong to the authenticated work scope")
        found = await ctx.store.admission_read(key)
        if found is None:
            return _json({"admission": "UNKNOWN",
                          "message": "no admission fact; this is not evidence of rejection"},
                         404)
        body, _ = _admission_json(found[1], key)
        return _json(body, 200)

    add_connect_routes(app, store=ctx.store, clock=ctx.clock, token_key=lambda: ctx.token_key,
                       caller=caller, json_body=json_body)

    @app.get("/v1/openapi.json")
    async def openapi() -> Response:
        return _json(OPENAPI, 200)

    @app.errorhandler(ApiError)
    async def api_error(exc: ApiError) -> Response:
        response = _json({"error": exc.code, "message": exc.message}, exc.status)
        response.headers.update(exc.headers)
        return response

    @app.errorhandler(StorageError)
    async def storage_error(exc: StorageError) -> Response:
        logs.warn("api_storage_error", error=type(exc).__name__)
        return _json({"error": "unavailable", "message": "storage is unavailable; retry"}, 503)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        if isinstance(exc, InternalServerError):  # a bug: the traceback is in the log only
            return _json({"error": "internal_error",
                          "message": "the request failed inside integrationd; see its log"}, 500)
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.code or 500, "http_error")
        response = _json({"error": code, "message": exc.description or code}, exc.code or 500)
        if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
            # RFC 9110 section 15.5.6: a 405 names the methods the target supports.
            response.headers["Allow"] = ", ".join(sorted(exc.valid_methods))
        return response

    guard_app(app, ctx.settings.api.max_body_bytes)
    return app
