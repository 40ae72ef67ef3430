"""The reference Runtime's state: Leads, intents, outbox, receipts, per-user grants. In
memory only (a grant record holds integrationd's binding id, generation and token
version; never a token).

Every method is synchronous and never awaits, so under trio (one thread) each call is one
atomic step: no other task can observe or change the state half-way through. That is this
Runtime's transaction and its owner fence: admitting an intent, committing a result,
deleting a Lead and transferring its identity each happen inside one call. Restarting the
process loses everything (this is a sandbox, not a CRM).

Decisions come from :mod:`sandbox.runtime.model` and :mod:`sandbox.runtime.receipts`; this
module applies them and raises :class:`Refused` (an HTTP status, a stable error code, a
message) when it must not.
"""

from __future__ import annotations

import collections
import datetime
import hashlib
import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from daemon.core.canonical import canonical_bytes
from daemon.core.handoff import RESULT_FORMAT_SUCCESS, TrustedRuntimeWorkScope
from sandbox.runtime.grants import (
    PROVIDER_RE,
    USER_ID_RE,
    FlowAnswer,
    FlowInputError,
    FlowName,
    FlowRefused,
    GrantMismatch,
    UserGrant,
    apply_flow_answer,
    binding_id_for,
    flow_request,
)
from sandbox.runtime.model import (
    SUPPORTED_FIELDS,
    CommandAccepted,
    ContractViolation,
    FenceRefusal,
    HandoffQuarantined,
    HandoffRejected,
    Intent,
    IntentState,
    IntentStatus,
    RemoteIdentity,
    apply_admission,
    decide_delete,
    decide_transfer,
)
from sandbox.runtime.receipts import (
    BadInput,
    CommitResult,
    DuplicateResult,
    RefuseResult,
    apply_commit,
    decide_result,
    parse_result_request,
)

LEAD_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
MAX_TITLE_CHARS = 1024


class Refused(Exception):
    """The request cannot be done; carries the JSON error answer."""

    def __init__(
        self, http_status: int, error: str, message: str, extra: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(f"{error}: {message}")
        self.http_status = http_status
        self.error = error
        self.message = message
        self.extra = dict(extra or {})

    def body(self) -> dict[str, Any]:
        return {"error": self.error, "message": self.message, **self.extra}

    @classmethod
    def from_fence(cls, refusal: FenceRefusal) -> Refused:
        extra = {"intent_ids": list(refusal.intent_ids)} if refusal.intent_ids else {}
        return cls(refusal.http_status, refusal.error, refusal.message, extra)


@attrs.frozen
class Lead:
    lead_id: str
    title: str
    remote_identity: RemoteIdentity | None = None
    # Fields an inbound source (integrationd) may change, and the Email a remote record
    # created elsewhere is matched by. Title is not one: the CRM owns it.
    fields: Mapping[str, str | None] = attrs.field(factory=dict)
    # The CRM user who owns the Lead: its commands carry ``user_id`` (run under that
    # user's per-user binding); "" runs them under the shared principal.
    owner: str = ""


# The Lead fields an inbound mutation may set (integrationd's L2 binding decides which of
# them a provider owns; the Runtime refuses any other name).
INBOUND_FIELDS = ("FirstName", "LastName", "Company", "Email")
MAX_MUTATIONS_KEPT = 100_000


@attrs.frozen
class InboundMutation:
    """One applied inbound mutation: its key's body digest and what it changed."""

    mutation_key: str
    digest: str
    lead_id: str
    applied_at_us: int


@attrs.frozen
class OutboxEntry:
    """A post-commit handoff waiting for a definitive answer from integrationd."""

    outbox_id: str
    intent_id: str
    lead_id: str
    body: bytes = attrs.field(repr=False)


@attrs.frozen
class PendingFlow:
    """A flow request sent without a definitive answer yet: a resend of the same request
    reuses its idempotency key (integrationd applies it once)."""

    idempotency_key: str
    digest: str


@attrs.frozen
class PreparedFlow:
    binding_id: str
    flow: FlowName
    body: bytes = attrs.field(repr=False)  # may hold a token: never logged or kept


@attrs.define
class _Schedule:
    attempts: int = 0
    next_at: float = 0.0  # trio clock seconds
    last_error: str | None = None


def iso_us(epoch_us: int) -> str:
    """RFC 3339 UTC text for epoch microseconds."""
    seconds, micros = divmod(epoch_us, 1_000_000)
    moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC).replace(microsecond=micros)
    return moment.isoformat().replace("+00:00", "Z")


def _string(doc: Mapping[str, Any], name: str, *, pattern: re.Pattern[str] | None = None) -> str:
    value = doc.get(name)
    if not isinstance(value, str):
        raise BadInput(f"{name} must be a string")
    if pattern is not None and not pattern.fullmatch(value):
        raise BadInput(f"{name} must match {pattern.pattern}")
    if len(value) > MAX_TITLE_CHARS:
        raise BadInput(f"{name} is longer than {MAX_TITLE_CHARS} characters")
    return value


MUTATION_KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]{0,127}")


def _inbound_fields(value: object) -> dict[str, str | None]:
    if not isinstance(value, dict):
        raise BadInput("fields must be an object")
    unsupported = sorted(set(value) - set(INBOUND_FIELDS))
    if unsupported:
        raise Refused(400, "unsupported_field",
                      f"only {', '.join(INBOUND_FIELDS)} can change inbound; "
                      f"not {', '.join(unsupported)}")
    for name, item in value.items():
        if item is not None and (not isinstance(item, str) or len(item) > MAX_TITLE_CHARS):
            raise BadInput(f"fields.{name} must be a string of at most {MAX_TITLE_CHARS}"
                           " characters, or null")
    return dict(value)


def rejection_reason(answer: HandoffRejected) -> str:
    """The stable reason of a ``HANDOFF_REJECTED`` receipt ("" when it names none)."""
    try:
        doc = json.loads(answer.receipt_json)
    except ValueError:
        return ""
    reason = doc.get("reason") if isinstance(doc, dict) else None
    return reason if isinstance(reason, str) else ""


def _object(doc: object) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise BadInput("the body must be a JSON object")
    return doc


@attrs.define(eq=False, kw_only=True)
class RuntimeStore:
    """All of the reference Runtime's state, changed only by atomic synchronous calls."""

    scope: TrustedRuntimeWorkScope
    catalog_revision: int
    operation: str
    accept_no_effect_format: bool
    # Every title change makes one intent per operation, in this order (the first is
    # ``operation``): e.g. the HubSpot contact and the Outreach Prospect of one Lead.
    also_operations: tuple[str, ...] = ()
    now_us: Callable[[], int]
    new_id: Callable[[str], str]
    leads: dict[str, Lead] = attrs.field(factory=dict)
    deleted_leads: set[str] = attrs.field(factory=set)
    intents: dict[str, IntentState] = attrs.field(factory=dict)
    outbox: dict[str, OutboxEntry] = attrs.field(factory=dict)  # insertion = creation order
    schedule: dict[str, _Schedule] = attrs.field(factory=dict)
    counters: collections.Counter[str] = attrs.field(factory=collections.Counter)
    mutations: dict[str, InboundMutation] = attrs.field(factory=dict)
    # Per-user grants as integrationd last reported them, by (user_id, provider); and the
    # flow request each is waiting on (its idempotency key, reused by a resend).
    grants: dict[tuple[str, str], UserGrant] = attrs.field(factory=dict)
    pending_flows: dict[tuple[str, str], PendingFlow] = attrs.field(factory=dict)

    # -- leads and intents --------------------------------------------------------------------

    def create_lead(self, doc: object) -> Lead:
        body = _object(doc)
        lead_id = _string(body, "lead_id", pattern=LEAD_ID_RE)
        title = _string(body, "title")
        unknown = sorted(set(body) - {"lead_id", "title", "fields", "owner"})
        if unknown:
            raise BadInput(f"unknown fields {', '.join(unknown)}")
        fields = _inbound_fields(body.get("fields", {}))
        owner = _string(body, "owner", pattern=USER_ID_RE) if "owner" in body else ""
        if lead_id in self.leads or lead_id in self.deleted_leads:
            raise Refused(409, "lead_exists", f"lead {lead_id} exists or was deleted")
        lead = self.leads[lead_id] = Lead(lead_id, title, fields=fields, owner=owner)
        return lead

    # -- inbound mutations (integrationd -> Runtime) -----------------------------------------

    def inbound_mutation(self, doc: object) -> tuple[str, Lead]:
        """Apply ``{"mutation_key", "lead_id", "fields"}`` once per key: the same key with
        the same body again is a ``DUPLICATE`` (nothing changes), with another body a 409.
        Returns ("APPLIED" | "DUPLICATE", the Lead)."""
        body = _object(doc)
        unknown = sorted(set(body) - {"mutation_key", "lead_id", "fields", "source"})
        if unknown:
            raise BadInput(f"unknown fields {', '.join(unknown)}")
        key = _string(body, "mutation_key", pattern=MUTATION_KEY_RE)
        lead_id = _string(body, "lead_id", pattern=LEAD_ID_RE)
        fields = _inbound_fields(body.get("fields"))
        if not fields:
            raise BadInput("fields must name at least one field")
        source = body.get("source", {})
        if not isinstance(source, dict):
            raise BadInput("source must be an object")
        digest = hashlib.sha256(json.dumps(
            {"lead_id": lead_id, "fields": fields}, sort_keys=True).encode()).hexdigest()
        seen = self.mutations.get(key)
        if seen is not None:
            if seen.digest != digest:
                self.counters["mutation_conflicts"] += 1
                raise Refused(409, "mutation_conflict",
                              "this mutation_key was applied with another body")
            self.counters["mutation_duplicates"] += 1
            return "DUPLICATE", self.lead(seen.lead_id)
        if lead_id in self.deleted_leads:
            raise Refused(410, "lead_deleted", "the lead was deleted here")
        lead = self.lead(lead_id)
        lead = self.leads[lead_id] = attrs.evolve(lead, fields={**lead.fields, **fields})
        if len(self.mutations) >= MAX_MUTATIONS_KEPT:
            self.mutations.pop(next(iter(self.mutations)))
        self.mutations[key] = InboundMutation(key, digest, lead_id, self.now_us())
        self.counters["mutations_applied"] += 1
        return "APPLIED", lead

    def leads_matching(self, field: str, value: str) -> list[str]:
        """The ids of live Leads whose ``field`` equals ``value`` (case-insensitive for
        Email), for matching a remote record created elsewhere."""
        if field not in INBOUND_FIELDS:
            raise BadInput(f"field must be one of {', '.join(INBOUND_FIELDS)}")
        wanted = value.casefold() if field == "Email" else value
        found = []
        for lead in self.leads.values():
            have = lead.fields.get(field)
            if have is not None and (have.casefold() if field == "Email" else have) == wanted:
                found.append(lead.lead_id)
        return sorted(found)

    def lead(self, lead_id: str) -> Lead:
        try:
            return self.leads[lead_id]
        except KeyError:
            raise Refused(404, "lead_not_found", "no such lead") from None

    def intents_of(self, lead_id: str) -> list[IntentState]:
        return [s for s in self.intents.values() if s.intent.lead_id == lead_id]

    def intent_of(self, lead_id: str, intent_id: str) -> IntentState:
        self.lead(lead_id)
        state = self.intents.get(intent_id)
        if state is None or state.intent.lead_id != lead_id:
            raise Refused(404, "intent_not_found", "no such intent for this lead")
        return state

    def update_lead(self, lead_id: str, doc: object) -> IntentState:
        """Change the Lead and create its immutable intent and outbox entry, in one step
        (the first of :meth:`update_lead_intents`)."""
        return self.update_lead_intents(lead_id, doc)[0]

    def update_lead_intents(self, lead_id: str, doc: object) -> list[IntentState]:
        """Change the Lead and create one immutable intent and outbox entry per
        operation (``operation``, then ``also_operations``), in one step."""
        lead = self.lead(lead_id)
        body = _object(doc)
        unsupported = sorted(set(body) - set(SUPPORTED_FIELDS))
        if unsupported:
            raise Refused(400, "unsupported_field",
                          f"only {', '.join(SUPPORTED_FIELDS)} can change; "
                          f"not {', '.join(unsupported)}")
        if not body:
            raise BadInput("nothing to change")
        return self._title_intents(lead, _string(body, "title"))

    def _title_intents(self, lead: Lead, title: str) -> list[IntentState]:
        made = []
        now = self.now_us()
        for operation in (self.operation, *self.also_operations):
            intent = Intent.create(
                scope=self.scope,
                intent_id=self.new_id("int"),
                lead_id=lead.lead_id,
                field="title",
                value=title,
                catalog_revision=self.catalog_revision,
                operation=operation,
                created_at_us=now,
                runtime_outbox_id=self.new_id("obx"),
                user_id=lead.owner,
            )
            made.append(self.add_intent(intent))
            self.counters["intents_created"] += 1
        self.leads[lead.lead_id] = attrs.evolve(lead, title=title)
        return made

    def add_intent(self, intent: Intent) -> IntentState:
        """Admit an already built intent (tests use it for kinds PATCH cannot create)."""
        state = self.intents[intent.intent_id] = IntentState(intent)
        self.outbox[intent.runtime_outbox_id] = OutboxEntry(
            intent.runtime_outbox_id, intent.intent_id, intent.lead_id, intent.handoff_body()
        )
        self.schedule[intent.runtime_outbox_id] = _Schedule()
        return state

    # -- per-user grants (connect flows) ------------------------------------------------

    def grant(self, user_id: str, provider: str) -> UserGrant | None:
        return self.grants.get((user_id, provider))

    def prepare_flow(self, user_id: str, provider: str, flow_name: str,
                     doc: object) -> PreparedFlow:
        """The exact ``/v1/bindings/{id}/{flow}`` request for a user's action; the same
        action again (same flow, generation and body) reuses the idempotency key."""
        if not USER_ID_RE.fullmatch(user_id):
            raise BadInput(f"user_id must match {USER_ID_RE.pattern}")
        if not PROVIDER_RE.fullmatch(provider):
            raise BadInput(f"provider must match {PROVIDER_RE.pattern}")
        try:
            flow = FlowName(flow_name)
        except ValueError:
            raise Refused(404, "unknown_flow", f"no connect flow; one of"
                          f" {', '.join(f.value for f in FlowName)}") from None
        before = self.grants.get((user_id, provider))
        try:
            body = flow_request(flow, idempotency_key="", user_id=user_id, provider=provider,
                                before=before, doc=_object(doc))
        except FlowInputError as exc:
            raise BadInput(str(exc)) from None
        binding_id = before.binding_id if before is not None else binding_id_for(
            user_id, provider)
        digest = hashlib.sha256(canonical_bytes(
            {"binding_id": binding_id, "flow": flow.value, "body": body})).hexdigest()
        pending = self.pending_flows.get((user_id, provider))
        if pending is None or pending.digest != digest:
            pending = PendingFlow(self.new_id("flow"), digest)
            self.pending_flows[(user_id, provider)] = pending
        body["idempotency_key"] = pending.idempotency_key
        self.counters["flows_requested"] += 1
        return PreparedFlow(binding_id, flow, canonical_bytes(body))

    def record_flow_answer(self, user_id: str, provider: str,
                           answer: FlowAnswer) -> UserGrant:
        """Record integrationd's definitive answer; the pending request is done."""
        self.pending_flows.pop((user_id, provider), None)
        try:
            grant = apply_flow_answer(self.grants.get((user_id, provider)), user_id=user_id,
                                      provider=provider, answer=answer)
        except GrantMismatch:
            self.counters["contract_violations"] += 1
            raise
        self.grants[(user_id, provider)] = grant
        self.counters["flows_applied" if not answer.replayed else "flows_replayed"] += 1
        return grant

    def record_flow_refusal(self, user_id: str, provider: str, refused: FlowRefused) -> None:
        """integrationd refused the flow: counted, the pending request dropped (the user's
        next action is a new request), never resent."""
        self.pending_flows.pop((user_id, provider), None)
        self.counters["flows_refused"] += 1
        if refused.error == "stale_generation":
            self.counters["stale_generation"] += 1
            grant = self.grants.get((user_id, provider))
            if grant is not None:
                self.grants[(user_id, provider)] = attrs.evolve(grant, stale=True)

    def record_binding_read(self, user_id: str, provider: str, answer: FlowAnswer) -> UserGrant:
        """The binding as integrationd holds it now (after a stale_generation refusal)."""
        before = self.grants.get((user_id, provider))
        grant = UserGrant(user_id=user_id, provider=provider, binding_id=answer.binding_id,
                          generation=answer.generation, status=answer.status,
                          token_version=answer.token_version)
        if before is not None and before.binding_id != answer.binding_id:
            self.counters["contract_violations"] += 1
            raise GrantMismatch(f"integrationd answered for binding {answer.binding_id!r},"
                                f" not {before.binding_id!r}")
        self.grants[(user_id, provider)] = grant
        return grant

    def user_view(self, user_id: str) -> dict[str, Any]:
        grants = [g.view() for (user, _), g in sorted(self.grants.items()) if user == user_id]
        leads = sorted(lead.lead_id for lead in self.leads.values() if lead.owner == user_id)
        return {"user_id": user_id, "grants": grants, "leads": leads}

    # -- admission answers --------------------------------------------------------------------

    def record_answer(
        self, intent_id: str, answer: CommandAccepted | HandoffRejected | HandoffQuarantined
    ) -> IntentState:
        """Apply a definitive admission answer; the intent's outbox entry is done either way.

        Raises :class:`ContractViolation` (state unchanged) when the answer contradicts a
        proven fact.
        """
        state = self.intents[intent_id]
        self._drop_outbox(state.intent.runtime_outbox_id)
        try:
            new = apply_admission(state, answer)
        except ContractViolation:
            self.counters["contract_violations"] += 1
            raise
        self.intents[intent_id] = new
        if (isinstance(answer, HandoffRejected) and new is not state
                and state.rejection_receipt is None
                and rejection_reason(answer) == "no_user_binding"):
            # The owner has no per-user binding for the operation's provider: a durable
            # contract answer (the same key is rejected forever), counted, never resent.
            self.counters["no_user_binding"] += 1
        return new

    def _drop_outbox(self, outbox_id: str) -> None:
        self.outbox.pop(outbox_id, None)
        self.schedule.pop(outbox_id, None)

    def schedule_retry(self, outbox_id: str, *, next_at: float, reason: str) -> int:
        """Keep the entry and try again at ``next_at``; returns the failed-attempt count."""
        schedule = self.schedule.get(outbox_id)
        if schedule is None:  # answered meanwhile (e.g. withdrawn)
            return 0
        schedule.attempts += 1
        schedule.next_at = next_at
        schedule.last_error = reason
        self.counters["dispatch_retries"] += 1
        return schedule.attempts

    def attempts(self, outbox_id: str) -> int:
        schedule = self.schedule.get(outbox_id)
        return schedule.attempts if schedule else 0

    def _heads(self, exclude: set[str]) -> Iterator[OutboxEntry]:
        """The oldest entry of each Lead (handoffs for one Lead go out in order)."""
        seen: set[str] = set()
        for entry in self.outbox.values():
            if entry.lead_id in seen:
                continue
            seen.add(entry.lead_id)
            if entry.outbox_id not in exclude:
                yield entry

    def due_entries(self, now: float, *, exclude: set[str], limit: int) -> list[OutboxEntry]:
        due: list[OutboxEntry] = []
        for entry in self._heads(exclude):
            if len(due) >= limit:
                break
            if self.schedule[entry.outbox_id].next_at <= now:
                due.append(entry)
        return due

    def next_due_at(self, *, exclude: set[str]) -> float | None:
        times = [self.schedule[e.outbox_id].next_at for e in self._heads(exclude)]
        return min(times, default=None)

    # -- result receipts ----------------------------------------------------------------------

    def commit_result(self, doc: object) -> CommitResult | DuplicateResult:
        """Validate and record a ``CommitResultRequest``; raises :class:`Refused`/`BadInput`."""
        try:
            request = parse_result_request(doc)
        except BadInput:
            self.counters["results_malformed"] += 1
            raise
        state = self.intents.get(request.intent_id) if request.scope == self.scope else None
        decision = decide_result(
            request, state, scope=self.scope,
            accept_no_effect_format=self.accept_no_effect_format,
        )
        if isinstance(decision, RefuseResult):
            self.counters[_REFUSAL_COUNTERS.get(decision.error, "results_refused")] += 1
            raise Refused(decision.http_status, decision.error, decision.message)
        if isinstance(decision, DuplicateResult):
            self.counters["duplicates"] += 1
            return decision
        assert state is not None
        self.intents[request.intent_id] = apply_commit(state, decision, self.now_us())
        receipt = decision.receipt
        lead = self.leads.get(state.intent.lead_id)
        if lead is not None and receipt.result_format_version == RESULT_FORMAT_SUCCESS:
            identity = RemoteIdentity(receipt.remote_id, receipt.intent_id)
            self.leads[lead.lead_id] = attrs.evolve(lead, remote_identity=identity)
        if receipt.result_format_version != RESULT_FORMAT_SUCCESS:
            self.counters["results_no_effect"] += 1
        self.counters["receipts_committed"] += 1
        return decision

    # -- owner fence --------------------------------------------------------------------------

    def delete_lead(self, lead_id: str) -> None:
        self.lead(lead_id)
        refusal = decide_delete(self.intents_of(lead_id))
        if refusal is not None:
            self.counters["fence_refusals"] += 1
            raise Refused.from_fence(refusal)
        del self.leads[lead_id]
        self.deleted_leads.add(lead_id)
        self.counters["leads_deleted"] += 1

    def transfer(self, lead_id: str, doc: object) -> tuple[Lead, Lead]:
        """Move the Lead's proven remote identity to another Lead; returns (source, target)."""
        source = self.lead(lead_id)
        body = _object(doc)
        target_id = _string(body, "to_lead_id", pattern=LEAD_ID_RE)
        if target_id == lead_id:
            raise BadInput("to_lead_id must name another lead")
        target = self.leads.get(target_id)
        if target is None:
            raise Refused(404, "target_not_found", "no such target lead")
        identity = source.remote_identity
        refusal = decide_transfer(
            source_states=self.intents_of(lead_id),
            target_states=self.intents_of(target_id),
            source_identity=identity,
            proof=self.intents.get(identity.proof_intent_id) if identity else None,
            target_identity=target.remote_identity,
        )
        if refusal is not None:
            self.counters["fence_refusals"] += 1
            raise Refused.from_fence(refusal)
        source = self.leads[lead_id] = attrs.evolve(source, remote_identity=None)
        target = self.leads[target_id] = attrs.evolve(target, remote_identity=identity)
        self.counters["transfers"] += 1
        return source, target

    # -- views --------------------------------------------------------------------------------

    def lead_view(self, lead_id: str) -> dict[str, Any]:
        lead = self.lead(lead_id)
        states = self.intents_of(lead_id)
        return {
            **self.lead_summary(lead),
            "intents": [self.intent_view(s) for s in states],
            "receipts": [receipt_view(s) for s in states if s.receipt is not None],
        }

    @staticmethod
    def lead_summary(lead: Lead) -> dict[str, Any]:
        identity = lead.remote_identity
        return {
            "lead_id": lead.lead_id,
            "title": lead.title,
            "remote_id": identity.remote_id if identity else None,
            "remote_id_proof_intent_id": identity.proof_intent_id if identity else None,
            "owner": lead.owner or None,
        }

    def intent_view(self, state: IntentState) -> dict[str, Any]:
        intent = state.intent
        quarantine = state.quarantine
        return {
            "intent_id": intent.intent_id,
            "lead_id": intent.lead_id,
            "kind": intent.kind,
            "field": intent.field,
            "value": intent.value,
            "catalog_revision": intent.catalog_revision,
            "operation": intent.operation,
            "user_id": intent.user_id or None,
            "created_at": iso_us(intent.created_at_us),
            "status": state.status.value,
            "command_id": state.command_id,
            "effect_handoff_key": intent.effect_handoff_key,
            "payload_digest": intent.payload_digest,
            "runtime_outbox_id": intent.runtime_outbox_id,
            "in_outbox": intent.runtime_outbox_id in self.outbox,
            "dispatch_failures": self.attempts(intent.runtime_outbox_id),
            "rejection_receipt": (
                json.loads(state.rejection_receipt) if state.rejection_receipt else None
            ),
            "quarantine": (
                {"http_status": quarantine.http_status, "error": quarantine.error}
                if quarantine else None
            ),
        }

    def list_intents(self, status: str | None) -> list[dict[str, Any]]:
        if status is not None:
            try:
                wanted = IntentStatus(status)
            except ValueError:
                known = ", ".join(s.value for s in IntentStatus)
                raise BadInput(f"unknown status {status!r} (known: {known})") from None
        return [
            self.intent_view(s) for s in self.intents.values()
            if status is None or s.status == wanted
        ]

    def stats(self) -> dict[str, Any]:
        by_status = collections.Counter(s.status.value for s in self.intents.values())
        return {
            "leads": len(self.leads),
            "intents_by_status": {s.value: by_status[s.value] for s in IntentStatus},
            "outbox": len(self.outbox),
            "receipts_committed": self.counters["receipts_committed"],
            "duplicates": self.counters["duplicates"],
            "conflicts": self.counters["conflicts"],
            "rejected_formats": self.counters["rejected_formats"],
            **{name: self.counters[name] for name in _OTHER_COUNTERS},
        }


_REFUSAL_COUNTERS: Mapping[str, str] = {
    "conflicting_result": "conflicts",
    "unsupported_result_format": "rejected_formats",
}
_OTHER_COUNTERS = (
    "results_refused",
    "results_malformed",
    "intents_created",
    "dispatch_sent",
    "dispatch_answered",
    "dispatch_retries",
    "withdrawals_requested",
    "withdrawals_rejected",
    "withdrawals_lost_race",
    "fence_refusals",
    "leads_deleted",
    "transfers",
    "contract_violations",
    "mutations_applied",
    "mutation_duplicates",
    "mutation_conflicts",
    "flows_requested",
    "flows_applied",
    "flows_replayed",
    "flows_refused",
    "flows_unanswered",
    "stale_generation",
    "no_user_binding",
    "results_no_effect",
)


def receipt_view(state: IntentState) -> dict[str, Any]:
    receipt = state.receipt
    assert receipt is not None and state.committed_at_us is not None
    return {
        **attrs.asdict(receipt),
        "committed_at": iso_us(state.committed_at_us),
    }
