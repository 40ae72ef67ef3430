"""The outbox dispatcher and the Runtime's client for integrationd's service API.

Theory of operation
-------------------
Each outbox entry holds the exact bytes of one ``POST /v1/commands`` body, fixed when the
intent was created. The dispatcher sends the oldest entry of each Lead (so one Lead's
handoffs are admitted in order), up to ``dispatch_batch`` entries per request (``POST
/v1/commands/batch``, the entries' bytes verbatim inside ``{"commands": [...]}``) and up to
``dispatch_concurrency`` requests at once. A definitive answer (accepted, rejected,
quarantined) is applied to the intent and ends the entry; anything else (a transport error,
5xx, 408/429, an unreadable 2xx) keeps it and schedules the same bytes again after capped
exponential backoff with full jitter. It never gives up. An integrationd without the batch
route (404/405) is sent single commands from then on.

The dispatcher sleeps until the next entry is due, at most ``poll_interval_s``, and wakes
early when the Runtime adds an entry (:class:`~sandbox.runtime.runtime.Wakeup`).
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Protocol

import attrs
import httpx
import trio

from daemon.services import logs
from sandbox.runtime.grants import FlowAnswer, FlowRefused, classify_flow_answer
from sandbox.runtime.model import (
    AdmissionAnswer,
    ContractViolation,
    IntentState,
    IntentStatus,
    RejectAnswer,
    RetryLater,
    WithdrawRefused,
    classify_batch_answer,
    classify_command_answer,
    classify_reject_answer,
)
from sandbox.runtime.runtime import ReferenceRuntime
from sandbox.runtime.store import OutboxEntry, Refused

BINDINGS_PATH = "/v1/bindings"
COMMANDS_PATH = "/v1/commands"
BATCH_PATH = "/v1/commands/batch"
REJECT_PATH = "/v1/handoffs/reject"


class IntegrationPort(Protocol):
    """What the dispatcher and withdraw need from integrationd (tests may substitute it)."""

    async def send_command(self, body: bytes) -> AdmissionAnswer: ...

    async def send_commands(self, bodies: list[bytes]) -> list[AdmissionAnswer] | RetryLater:
        """One answer per body, in order; or one RetryLater for the whole batch."""
        ...

    async def reject_if_unaccepted(self, body: bytes) -> RejectAnswer: ...


@attrs.define(eq=False)
class IntegrationClient:
    """Posts handoffs to integrationd; turns every outcome into a classified answer."""

    _http: httpx.AsyncClient
    _batch_route: bool = True

    @classmethod
    @asynccontextmanager
    async def open(cls, runtime: ReferenceRuntime) -> AsyncIterator[IntegrationClient]:
        http = httpx.AsyncClient(
            base_url=runtime.integration_url,
            headers={
                "authorization": f"Bearer {runtime.integration_token.reveal()}",
                "content-type": "application/json",
            },
            timeout=runtime.request_timeout_s,
            follow_redirects=False,
        )
        try:
            yield cls(http)
        finally:
            with trio.CancelScope(shield=True):
                await http.aclose()

    async def _post(self, path: str, body: bytes) -> tuple[int, bytes] | RetryLater:
        try:
            response = await self._http.post(path, content=body)
        except httpx.TransportError as exc:
            return RetryLater(f"transport error: {type(exc).__name__}")
        return response.status_code, response.content

    async def send_command(self, body: bytes) -> AdmissionAnswer:
        """``POST /v1/commands`` with ``body`` exactly as given."""
        answer = await self._post(COMMANDS_PATH, body)
        return answer if isinstance(answer, RetryLater) else classify_command_answer(*answer)

    async def send_commands(self, bodies: list[bytes]) -> list[AdmissionAnswer] | RetryLater:
        """``POST /v1/commands/batch`` with each body verbatim as one entry."""
        if self._batch_route:
            answer = await self._post(BATCH_PATH, b'{"commands":[' + b",".join(bodies) + b"]}")
            if isinstance(answer, RetryLater):
                return answer
            status = answer[0]
            if status in (404, 405):
                self._batch_route = False  # an integrationd from before the batch route
            elif not 400 <= status < 500 or status in (408, 429):
                return classify_batch_answer(*answer, expected=len(bodies))
            # Otherwise the batch as a whole was refused (too large, say): each entry
            # gets its own answer from the single route.
        return [await self.send_command(body) for body in bodies]

    async def reject_if_unaccepted(self, body: bytes) -> RejectAnswer:
        """``POST /v1/handoffs/reject`` (integrationd's idempotent RejectIfUnaccepted)."""
        answer = await self._post(REJECT_PATH, body)
        return answer if isinstance(answer, RetryLater) else classify_reject_answer(*answer)

    async def binding_flow(self, binding_id: str, flow: str,
                           body: bytes) -> FlowAnswer | FlowRefused | RetryLater:
        """``POST /v1/bindings/{binding_id}/{flow}`` with ``body`` exactly as given."""
        answer = await self._post(f"{BINDINGS_PATH}/{binding_id}/{flow}", body)
        return answer if isinstance(answer, RetryLater) else classify_flow_answer(*answer)

    async def binding_read(self, binding_id: str) -> FlowAnswer | FlowRefused | RetryLater:
        """``GET /v1/bindings/{binding_id}``: the binding's current generation."""
        try:
            response = await self._http.get(f"{BINDINGS_PATH}/{binding_id}")
        except httpx.TransportError as exc:
            return RetryLater(f"transport error: {type(exc).__name__}")
        return classify_flow_answer(response.status_code, response.content)


@attrs.define(eq=False)
class OutboxDispatcher:
    """Sends outbox entries to integrationd until each gets a definitive answer."""

    runtime: ReferenceRuntime
    client: IntegrationPort
    _in_flight: set[str] = attrs.field(factory=set, init=False)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        runtime = self.runtime
        store = runtime.store
        capacity = runtime.dispatch_concurrency * runtime.dispatch_batch
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                now = trio.current_time()
                due = store.due_entries(now, exclude=self._in_flight,
                                        limit=capacity - len(self._in_flight))
                for i in range(0, len(due), runtime.dispatch_batch):
                    batch = due[i:i + runtime.dispatch_batch]
                    self._in_flight.update(e.outbox_id for e in batch)
                    nursery.start_soon(self._deliver, batch)
                timeout = runtime.poll_interval_s
                if len(self._in_flight) < capacity:
                    next_at = store.next_due_at(exclude=self._in_flight)
                    if next_at is not None:
                        timeout = min(timeout, next_at - now)
                await runtime.wakeup.wait(timeout)

    async def _deliver(self, batch: list[OutboxEntry]) -> None:
        store = self.runtime.store
        try:
            store.counters["dispatch_sent"] += len(batch)
            answers: list[AdmissionAnswer] | RetryLater
            if len(batch) == 1:
                answers = [await self.client.send_command(batch[0].body)]
            else:
                answers = await self.client.send_commands([e.body for e in batch])
            if isinstance(answers, RetryLater):
                answers = [answers] * len(batch)
            for entry, answer in zip(batch, answers, strict=True):
                self._apply(entry, answer)
        finally:
            self._in_flight.difference_update(e.outbox_id for e in batch)
            self.runtime.wakeup.set()

    def _apply(self, entry: OutboxEntry, answer: AdmissionAnswer) -> None:
        store = self.runtime.store
        if isinstance(answer, RetryLater):
            attempts = store.attempts(entry.outbox_id) + 1
            delay = self.runtime.dispatch_backoff.delay_s(attempts, random.random())
            store.schedule_retry(
                entry.outbox_id, next_at=trio.current_time() + delay, reason=answer.reason
            )
            logs.warn("runtime_dispatch_retry", intent_id=entry.intent_id,
                      attempts=attempts, reason=answer.reason, delay_s=round(delay, 3))
            return
        store.counters["dispatch_answered"] += 1
        try:
            state = store.record_answer(entry.intent_id, answer)
        except ContractViolation as exc:
            logs.error("runtime_contract_violation", intent_id=entry.intent_id,
                       detail=str(exc))
            return
        # A routine success, one per intent: DEBUG, as the daemon's own (it buried the
        # console address `make run` prints under two lines a second).
        logs.debug("runtime_dispatch_answer", intent_id=entry.intent_id,
                   status=state.status.value, command_id=state.command_id)


async def withdraw_intent(
    runtime: ReferenceRuntime, client: IntegrationPort, lead_id: str, intent_id: str
) -> IntentState:
    """Ask integrationd to reject the intent's handoff unless it was already accepted.

    Returns the intent once REJECTED (proven by a ``HANDOFF_REJECTED`` receipt). Raises
    :class:`Refused`: 409 ``already_accepted`` when the command was accepted (the withdraw
    lost the race, or came too late), 503 when integrationd gave no definitive answer (call
    again: RejectIfUnaccepted is idempotent), 502 when integrationd refused the request.
    """
    store = runtime.store
    state = store.intent_of(lead_id, intent_id)
    if state.status == IntentStatus.REJECTED:
        return state
    if state.status in (IntentStatus.ACCEPTED, IntentStatus.COMMITTED):
        raise _already_accepted(state)
    store.counters["withdrawals_requested"] += 1
    answer = await client.reject_if_unaccepted(state.intent.reject_body())
    if isinstance(answer, RetryLater):
        logs.warn("runtime_withdraw_unanswered", intent_id=intent_id, reason=answer.reason)
        raise Refused(503, "integration_unavailable",
                      "integrationd gave no definitive answer; the intent is unchanged, "
                      "withdraw again")
    if isinstance(answer, WithdrawRefused):
        logs.warn("runtime_withdraw_refused", intent_id=intent_id,
                  http_status=answer.http_status, error=answer.error)
        raise Refused(502, "withdraw_refused", "integrationd refused the rejection",
                      {"upstream_status": answer.http_status, "upstream_error": answer.error})
    try:
        state = store.record_answer(intent_id, answer)
    except ContractViolation as exc:
        logs.error("runtime_contract_violation", intent_id=intent_id, detail=str(exc))
        raise Refused(502, "contract_violation", str(exc)) from None
    logs.event("runtime_withdraw_answer", intent_id=intent_id, status=state.status.value)
    if state.status == IntentStatus.REJECTED:
        store.counters["withdrawals_rejected"] += 1
        return state
    store.counters["withdrawals_lost_race"] += 1
    raise _already_accepted(state)


def _already_accepted(state: IntentState) -> Refused:
    return Refused(409, "already_accepted", "integrationd accepted the command; it stays "
                   "outstanding until its result receipt",
                   {"status": state.status.value, "command_id": state.command_id})
