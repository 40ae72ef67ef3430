"""Receipts carried to the Runtime many to a request: one fence proof and one POST a batch.

A Runtime that serves ``results_batch_url`` takes ``{"results": [CommitResultRequest,
...]}`` and answers 200 with ``{"results": [{"status": S, "error": E, ...}, ...]}``: one
answer per request, in order, each the status and error code its single route
(``results_url``) would have answered that request alone (docs/runtime-handoff.md). The
batch is only a carrier: each request is the exact, immutable one its receipt WorkItem
holds, judged alone by the Runtime, and each delivery is settled by its own answer as if it
had been sent alone, so nothing about a receipt changes with the company it travels in.

Deliveries of one replica to one Runtime queue in a :class:`Batcher`: the first goes at
once, and those submitted while a batch is in flight go together next (a claimed batch of
receipts is proven and answered together, so its finalizations commit together too). A
batch first proves every delivery's claim live in one transaction (the fence of
``ReceiptSender``); a delivery whose claim is lost gets its ``LostLease`` and is not sent.
An answer that cannot be read as one result per request (another status for the whole
batch, a transport error, a malformed or short answer) settles every delivery of the batch
as that failure, to be retried: a resend is a ``DUPLICATE`` at the Runtime, never a second
result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import attrs
import httpx

from config.settings import RuntimeClient
from daemon.core.work import Fence
from daemon.providers.executor import Answer, BoundedHttp
from daemon.services.batcher import Batcher
from storage.port import StorageError

# A batch's bounds: requests, and bytes of their JSON (the reference Runtime takes 256
# requests and 64 KiB bodies; a Runtime that serves the batch route must take these).
MAX_DELIVERIES = 64
MAX_BATCH_BYTES = 32 * 1024
# The error of every delivery of a batch whose 200 answer was not one result per request
# (counted as an HTTP error, retried; status 502 as a gateway would say it).
MALFORMED_BATCH_ANSWER = "malformed_batch_answer"


@attrs.frozen
class Delivery:
    """One receipt's exact request and the claim that must be live when it leaves."""

    runtime: RuntimeClient  # where it goes: the settings the sender read for it
    fence: Fence
    request: Mapping[str, object]
    size: int  # at least the bytes of the request's JSON (bounds a batch's body)


@attrs.frozen
class RuntimeAnswer:
    """What the Runtime answered to one request; status 0: no answer (``error`` names the
    transport failure's class)."""

    status: int
    error: str = ""


def batch_answers(answer: Answer, count: int) -> list[RuntimeAnswer]:
    """Each request's answer from the batch route's answer (pure)."""
    if answer.status_code != 200:
        return [RuntimeAnswer(answer.status_code, error_code(answer))] * count
    try:
        doc = answer.json()
    except ValueError:
        doc = None
    results = doc.get("results") if isinstance(doc, dict) else None
    if not isinstance(results, list) or len(results) != count:
        return [RuntimeAnswer(502, MALFORMED_BATCH_ANSWER)] * count
    out: list[RuntimeAnswer] = []
    for result in results:
        status = result.get("status") if isinstance(result, dict) else None
        if not isinstance(status, int) or isinstance(status, bool) or not 100 <= status <= 599:
            return [RuntimeAnswer(502, MALFORMED_BATCH_ANSWER)] * count
        out.append(RuntimeAnswer(status, _code(result.get("error"))))
    return out


def error_code(answer: Answer) -> str:
    """The ``error`` code of a JSON error answer (at most 64 characters), or ""."""
    try:
        doc = answer.json()
    except ValueError:
        return ""
    return _code(doc.get("error") if isinstance(doc, dict) else None)


def _code(value: Any) -> str:
    return value[:64] if isinstance(value, str) else ""


Prove = Callable[[Sequence[Fence]], Awaitable[Sequence[StorageError | None]]]


@attrs.define(eq=False)
class ReceiptBatches:
    """One :class:`Batcher` of deliveries per Runtime that serves the batch route."""

    client: BoundedHttp
    prove: Prove
    timeout_s: float = 10.0
    on_split: Callable[[], None] = lambda: None
    _batchers: dict[str, Batcher[Delivery, RuntimeAnswer]] = attrs.field(factory=dict)

    def add(self, runtime: RuntimeClient) -> Batcher[Delivery, RuntimeAnswer]:
        """The batcher of this Runtime's deliveries (its ``run`` is the caller's to start)."""
        batcher: Batcher[Delivery, RuntimeAnswer] = Batcher(
            self._flush, max_batch=MAX_DELIVERIES, weigh=lambda d: d.size,
            max_bytes=lambda: MAX_BATCH_BYTES, on_split=self.on_split)
        self._batchers[runtime.name] = batcher
        return batcher

    def serves(self, runtime: RuntimeClient) -> bool:
        return runtime.name in self._batchers and bool(runtime.results_batch_url)

    async def send(self, item: Delivery) -> RuntimeAnswer:
        """This delivery's answer; raises ``LostLease`` (not sent) or the proof's error."""
        return await self._batchers[item.runtime.name].submit(item)

    async def _flush(self, batch: Sequence[Delivery]) -> list[RuntimeAnswer | StorageError]:
        proofs = await self.prove([d.fence for d in batch])
        live = [d for d, proof in zip(batch, proofs, strict=True) if proof is None]
        # One batcher per Runtime name: every delivery of the batch names the same one.
        answers = iter(await self._post(live[0].runtime, live) if live else [])
        return [next(answers) if proof is None else proof for proof in proofs]

    async def _post(self, runtime: RuntimeClient,
                    live: Sequence[Delivery]) -> list[RuntimeAnswer]:
        assert runtime.results_token is not None  # the sender checked it
        try:
            answer = await self.client.request(
                "POST", runtime.results_batch_url,
                json={"results": [d.request for d in live]},
                headers={"Authorization": f"Bearer {runtime.results_token.reveal()}"},
                timeout_s=self.timeout_s)
        except httpx.HTTPError as exc:
            return [RuntimeAnswer(0, type(exc).__name__)] * len(live)
        return batch_answers(answer, len(live))
