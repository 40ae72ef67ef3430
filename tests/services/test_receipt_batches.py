"""Receipts carried many to a request (``results_batch_url``): one fence proof and one POST
for a claimed batch, each delivery settled by its own answer as if sent alone, a lost claim
never carried, and an answer that is not one result per request retried for every delivery.

Real storage on every backend, a real HTTP server on loopback standing in for the Runtime's
batch route (the reference Runtime's own route is tests/sandbox_runtime/test_results_batch.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pytest
import trio

from config.settings import RuntimeClient, Secret, Settings
from daemon.core.outcomes import DeadLetter, Outcome, RetryLater, Succeeded
from daemon.core.work import Fence, WorkItem
from daemon.providers.executor import BoundedHttp
from daemon.providers.http_client import Answer, AnswerHeaders
from daemon.services.families import WorkContext
from daemon.services.metrics import Metrics
from daemon.services.receipt_batches import (
    MALFORMED_BATCH_ANSWER,
    MAX_DELIVERIES,
    ReceiptBatches,
    RuntimeAnswer,
    batch_answers,
)
from daemon.services.receipt_sender import ReceiptSender
from sandbox.h11_server import H11Server, Request, Response
from sandbox.ports import free_port
from storage.effects import RECEIPT_FAMILY
from storage.port import LostLease, StorageError
from storage.work_store import WorkStore
from tests.support.work import SEC, T0, FixedClock, claim, spec

TOKEN = "results-token-0000"
JSON = (("content-type", "application/json"),)

# What the stand-in answers to one request of a batch, by its command id.
PerRequest = Callable[[dict[str, Any]], dict[str, Any]]
# Or what it answers to the whole batch: (status, body).
WholeBatch = Callable[[list[dict[str, Any]]], tuple[int, bytes]]


@attrs.define
class BatchRuntime:
    whole: WholeBatch
    batches: list[list[dict[str, Any]]] = attrs.field(factory=list)
    singles: int = 0

    async def handle(self, request: Request) -> Response:
        assert request.headers["authorization"] == f"Bearer {TOKEN}"
        if request.path != "/batch":
            self.singles += 1
            return Response(200, b'{"status":"COMMITTED"}', JSON)
        doc = json.loads(request.body)
        assert set(doc) == {"results"}
        self.batches.append(doc["results"])
        status, body = self.whole(doc["results"])
        return Response(status, body, JSON)


def per_request(answer: PerRequest) -> WholeBatch:
    return lambda results: (200, json.dumps({"results": [answer(r) for r in results]}).encode())


def _runtime(port: int, *, batch: bool = True) -> RuntimeClient:
    base = f"http://127.0.0.1:{port}"
    return RuntimeClient(name="crm", org_id="org-1", app_installation_id="i-1",
                         runtime_capability_id="cap", runtime_work_binding_digest="sha256:b",
                         results_url=f"{base}/r", results_batch_url=f"{base}/batch" if batch
                         else "", token=Secret("t"), results_token=Secret(TOKEN))


def _request(command_id: str) -> dict[str, Any]:
    return {"command_id": command_id, "intent_id": f"int-{command_id}",
            "result_format_version": 1, "remote_id": "101"}


async def _claimed(store: WorkStore, commands: Sequence[str], owner: str = "A",
                   now: int = T0) -> list[WorkItem]:
    await store.work_enqueue(
        [spec(family=RECEIPT_FAMILY, subject_kind="receipt", subject_id=c,
              payload=json.dumps({"command_id": c, "runtime": "crm", "request": _request(c)}))
         for c in commands], now)
    result = await claim(store, owner=owner, now=now, ttl=SEC, family=RECEIPT_FAMILY,
                         limit=len(commands))
    assert len(result.claimed) == len(commands)
    return list(result.claimed)


def _context(store: WorkStore, item: WorkItem, now: int, replica: str = "A") -> WorkContext:
    assert item.fence is not None
    return WorkContext(item=item, fence=item.fence, store=store, clock=FixedClock(now),
                       replica_id=replica)


def _count(metrics: Metrics, result: str) -> float:
    found = re.search(rf'^integrationd_receipt_deliveries_total\{{result="{result}"\}} '
                      r"([0-9.]+)$", metrics.render().decode(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def _deliver(store: WorkStore, runtime: BatchRuntime, contexts: Sequence[WorkContext],
                   now: int, *, metrics: Metrics | None = None, port: int | None = None,
                   batch: bool = True) -> dict[str, Outcome | BaseException]:
    """Hand every context to a replica's sender at once; each one's outcome or error."""
    outcomes: dict[str, Outcome | BaseException] = {}
    http = BoundedHttp.open(4)
    async with trio.open_nursery() as nursery:
        if port is None:
            port = await nursery.start(H11Server(runtime.handle).run)
        rc = _runtime(port, batch=batch)

        async def prove(fences: Sequence[Fence]) -> list[StorageError | None]:
            return await store.work_fences_live(fences, lambda: now)

        batches = ReceiptBatches(client=http, prove=prove, timeout_s=5.0)
        await nursery.start(batches.add(rc).run)
        sender = ReceiptSender(Settings(runtimes=(rc,)), http, batches=batches, timeout_s=5.0)
        if metrics is not None:
            sender.on_result = metrics.count_receipt

        async def one(ctx: WorkContext) -> None:
            try:
                outcomes[ctx.item.subject_id] = await sender.handle(ctx)
            except (LostLease, StorageError) as exc:
                outcomes[ctx.item.subject_id] = exc

        async with trio.open_nursery() as handlers:
            for ctx in contexts:
                handlers.start_soon(one, ctx)
        nursery.cancel_scope.cancel()
    await http.aclose()
    return outcomes


async def test_a_claimed_batch_is_one_request_and_each_receipt_is_settled_by_its_own_answer(
        store: WorkStore) -> None:
    answers = {"c-ok": {"status": 200, "result": "COMMITTED"},
               "c-dup": {"status": 200, "result": "DUPLICATE"},
               "c-conflict": {"status": 409, "error": "conflicting_result"},
               "c-pending": {"status": 503, "error": "handoff_answer_pending"},
               "c-old": {"status": 422, "error": "unsupported_result_format"}}
    runtime = BatchRuntime(per_request(lambda r: answers[r["command_id"]]))
    items = await _claimed(store, list(answers))
    contexts = [_context(store, item, T0 + 1) for item in items]
    metrics = Metrics()
    outcomes = await _deliver(store, runtime, contexts, T0 + 1, metrics=metrics)

    # One request carried every receipt, each the exact request its item holds.
    assert runtime.singles == 0
    (sent,) = runtime.batches
    assert sorted(sent, key=lambda r: r["command_id"]) == \
        sorted((_request(c) for c in answers), key=lambda r: r["command_id"])
    assert isinstance(outcomes["c-ok"], Succeeded)
    assert isinstance(outcomes["c-dup"], Succeeded)
    assert outcomes["c-conflict"] == DeadLetter(
        "runtime_conflict", "the Runtime refused the result (conflicting_result); failing closed")
    assert isinstance(outcomes["c-pending"], RetryLater)
    assert outcomes["c-pending"].failure_class == "runtime_503"
    assert isinstance(outcomes["c-old"], RetryLater)
    assert outcomes["c-old"].failure_class == "runtime_rejects_format"
    # Each delivery's result is recorded with its own finalization, and counted once.
    assert all(len(ctx.side_writes) == 1 for ctx in contexts)
    assert (_count(metrics, "confirmed"), _count(metrics, "conflict"),
            _count(metrics, "http_error"), _count(metrics, "format_refused")) == (2, 1, 1, 1)


async def test_a_delivery_whose_claim_was_lost_is_not_carried(store: WorkStore) -> None:
    runtime = BatchRuntime(per_request(lambda r: {"status": 200, "result": "COMMITTED"}))
    items = await _claimed(store, ["c-1", "c-2", "c-3"])
    # Replica A's leases (1 s) expire and B reclaims one of the three: A's claim of it is
    # lost (its epoch moved on), while its other two are still its own when proven.
    (stolen,) = (await claim(store, owner="B", now=T0 + 5 * SEC, ttl=SEC,
                             family=RECEIPT_FAMILY, limit=1)).claimed
    kept = [i for i in items if i.work_id != stolen.work_id]
    outcomes = await _deliver(store, runtime, [_context(store, i, T0 + 1) for i in items],
                              T0 + 1)
    assert isinstance(outcomes[stolen.subject_id], LostLease)
    (carried,) = runtime.batches
    assert sorted(r["command_id"] for r in carried) == sorted(i.subject_id for i in kept)
    assert all(isinstance(outcomes[i.subject_id], Succeeded) for i in kept)


async def test_a_batch_of_lost_claims_sends_nothing(store: WorkStore) -> None:
    runtime = BatchRuntime(per_request(lambda r: {"status": 200}))
    items = await _claimed(store, ["c-1", "c-2"])
    later = T0 + 5 * SEC
    await claim(store, owner="B", now=later, ttl=SEC, family=RECEIPT_FAMILY, limit=2)
    outcomes = await _deliver(store, runtime, [_context(store, i, later + 1) for i in items],
                              later + 1)
    assert all(isinstance(o, LostLease) for o in outcomes.values())
    assert runtime.batches == [] and runtime.singles == 0


@pytest.mark.parametrize(
    ("whole", "reason", "result"),
    [
        # The whole batch refused: every delivery retried as if each had been refused.
        (lambda rs: (503, b'{"error":"unavailable"}'), "runtime_503", "http_error"),
        (lambda rs: (401, b'{"error":"unauthorized"}'), "runtime_401", "unauthorized"),
        # 200, but not one result per request: retried, never taken as confirmed.
        (lambda rs: (200, json.dumps({"results": [{"status": 200}]}).encode()),
         MALFORMED_BATCH_ANSWER, "http_error"),
        (lambda rs: (200, json.dumps({"results": [{"status": "200"}] * len(rs)}).encode()),
         MALFORMED_BATCH_ANSWER, "http_error"),
        (lambda rs: (200, b"not json"), MALFORMED_BATCH_ANSWER, "http_error"),
    ],
)
async def test_an_answer_that_is_not_one_result_per_request_retries_every_delivery(
        store: WorkStore, whole: WholeBatch, reason: str, result: str) -> None:
    runtime = BatchRuntime(whole)
    items = await _claimed(store, ["c-1", "c-2", "c-3"])
    metrics = Metrics()
    outcomes = await _deliver(store, runtime, [_context(store, i, T0 + 1) for i in items],
                              T0 + 1, metrics=metrics)
    assert len(runtime.batches) == 1
    assert [o.failure_class for o in outcomes.values()
            if isinstance(o, RetryLater)] == [reason] * 3
    assert _count(metrics, result) == 3
    assert _count(metrics, "confirmed") == 0


async def test_a_runtime_that_cannot_be_reached_retries_every_delivery(
        store: WorkStore) -> None:
    runtime = BatchRuntime(per_request(lambda r: {"status": 200}))
    items = await _claimed(store, ["c-1", "c-2"])
    metrics = Metrics()
    outcomes = await _deliver(store, runtime, [_context(store, i, T0 + 1) for i in items],
                              T0 + 1, metrics=metrics, port=free_port())  # nothing listens
    assert [o.failure_class for o in outcomes.values() if isinstance(o, RetryLater)] == \
        ["runtime_unreachable"] * 2
    assert _count(metrics, "unreachable") == 2


async def test_a_runtime_without_the_batch_route_gets_one_post_per_receipt(
        store: WorkStore) -> None:
    runtime = BatchRuntime(per_request(lambda r: {"status": 200}))
    items = await _claimed(store, ["c-1", "c-2"])
    outcomes = await _deliver(store, runtime, [_context(store, i, T0 + 1) for i in items],
                              T0 + 1, batch=False)
    assert all(isinstance(o, Succeeded) for o in outcomes.values())
    assert (runtime.batches, runtime.singles) == ([], 2)


async def test_a_batch_holds_at_most_its_bound_of_deliveries(store: WorkStore) -> None:
    runtime = BatchRuntime(per_request(lambda r: {"status": 200, "result": "COMMITTED"}))
    commands = [f"c-{n:03d}" for n in range(MAX_DELIVERIES + 6)]
    items = await _claimed(store, commands)
    outcomes = await _deliver(store, runtime, [_context(store, i, T0 + 1) for i in items],
                              T0 + 1)
    assert all(isinstance(o, Succeeded) for o in outcomes.values())
    assert max(len(b) for b in runtime.batches) == MAX_DELIVERIES
    assert sorted(r["command_id"] for b in runtime.batches for r in b) == commands


def _answer(status: int, body: bytes) -> Answer:
    return Answer(status_code=status, headers=AnswerHeaders({}), content=body)


@pytest.mark.parametrize(
    ("status", "body", "count", "expected"),
    [
        (200, b'{"results":[{"status":200},{"status":409,"error":"conflicting_result"}]}', 2,
         [RuntimeAnswer(200), RuntimeAnswer(409, "conflicting_result")]),
        (200, b'{"results":[{"status":200,"error":"' + b"e" * 80 + b'"}]}', 1,
         [RuntimeAnswer(200, "e" * 64)]),
        (503, b'{"error":"busy"}', 2, [RuntimeAnswer(503, "busy")] * 2),
        (500, b"oops", 1, [RuntimeAnswer(500)]),
        # Negative rows: anything but one well-formed result per request.
        (200, b'{"results":[{"status":200}]}', 2,
         [RuntimeAnswer(502, MALFORMED_BATCH_ANSWER)] * 2),
        (200, b'{"results":[{"status":true}]}', 1, [RuntimeAnswer(502, MALFORMED_BATCH_ANSWER)]),
        (200, b'{"results":[{"status":99}]}', 1, [RuntimeAnswer(502, MALFORMED_BATCH_ANSWER)]),
        (200, b'{"results":[7]}', 1, [RuntimeAnswer(502, MALFORMED_BATCH_ANSWER)]),
        (200, b'{"results":{}}', 1, [RuntimeAnswer(502, MALFORMED_BATCH_ANSWER)]),
        (200, b"[]", 1, [RuntimeAnswer(502, MALFORMED_BATCH_ANSWER)]),
        (200, b"\xff", 1, [RuntimeAnswer(502, MALFORMED_BATCH_ANSWER)]),
    ],
)
def test_batch_answers(status: int, body: bytes, count: int,
                       expected: list[RuntimeAnswer]) -> None:
    assert batch_answers(_answer(status, body), count) == expected
