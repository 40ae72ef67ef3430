"""The ``runtime_receipt`` work family: deliver a persisted result to the Runtime.

The receipt (``CommitResultRequest``) was persisted when the command settled,
in the result_receipts row and, verbatim, in this WorkItem's immutable
payload (so sending needs no read); this handler sends exactly that request
until the Runtime confirms it, with the kernel's backoff between tries. The
Runtime treats an identical commit as a duplicate, so a resend after a lost
response (or a replayed receipt item) is safe (replay-safe by the Runtime's
contract). Delivery is fenced: the live claim is proven in the database just
before the request leaves, so a stale claimant delivers nothing. Nothing here
ever changes the result: an old Runtime that
rejects result format 2 gets the same receipt again later, never a fallback;
a conflicting-result answer fails closed (dead, for an operator).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import attrs
import httpx

from config.settings import RuntimeClient, Settings
from daemon.core.handoff import commit_result_request
from daemon.core.outcomes import DeadLetter, Outcome, RetryLater, Succeeded
from daemon.core.work import Fence
from daemon.providers.executor import BoundedHttp
from daemon.services import logs
from daemon.services.batcher import Batcher
from daemon.services.families import Handler, WorkContext
from daemon.services.metrics import receipt_result
from daemon.services.receipt_batches import (
    MALFORMED_BATCH_ANSWER,
    Delivery,
    ReceiptBatches,
    RuntimeAnswer,
    error_code,
)
from storage.commands import read_command
from storage.effect_values import Command, ReceiptState, ResultReceipt
from storage.effects import mark_receipt, read_receipt
from storage.port import SqlTx


def receipt_request(command: Command, receipt: ResultReceipt) -> dict[str, object]:
    return commit_result_request(
        scope=command.scope, intent_id=command.intent_id, command_id=command.command_id,
        payload_digest=command.payload_digest, catalog_revision=command.catalog_revision,
        result_format_version=receipt.result_format_version, remote_id=receipt.remote_id,
        canonical_result=receipt.canonical_result, result_digest=receipt.result_digest)


@attrs.define(eq=False)
class ReceiptSender:
    settings: Settings
    client: BoundedHttp
    timeout_s: float = 10.0
    # Group commit for the fence proofs; None proves each one on its own.
    fences: Batcher[Fence, None] | None = None
    # Deliveries to Runtimes that serve results_batch_url, many to a request (each Runtime
    # there has its batcher); None, or a Runtime without one: one POST per receipt.
    batches: ReceiptBatches | None = None
    # Called once per delivery with its result label (metrics.RECEIPT_RESULTS).
    on_result: Callable[[str], None] = lambda result: None

    def _runtime(self, name: str) -> RuntimeClient | None:
        for rc in self.settings.runtimes:
            if rc.name == name:
                return rc
        return None

    async def handle(self, ctx: WorkContext) -> Outcome:
        payload = json.loads(ctx.item.payload)
        command_id = str(payload["command_id"])
        request = payload.get("request")
        runtime_name = payload.get("runtime")
        size = len(ctx.item.payload)  # at least the request's JSON
        if not isinstance(request, dict) or not isinstance(runtime_name, str):
            # A receipt queued without its request in the payload: read it.
            async def read(tx: SqlTx) -> tuple[ResultReceipt | None, Command | None]:
                return await read_receipt(tx, command_id), await read_command(tx, command_id)

            receipt, command = await ctx.store.db.transact(read, name="receipt.context",
                                                           write=False)
            if receipt is None or command is None:
                self.on_result("missing")
                return DeadLetter("missing_receipt", f"no receipt for command {command_id}")
            if receipt.state is ReceiptState.CONFIRMED:
                self.on_result("already_confirmed")
                return Succeeded("already confirmed")
            request, runtime_name = receipt_request(command, receipt), command.runtime_name
            size = len(json.dumps(request)) + 1
        runtime = self._runtime(runtime_name)
        if runtime is None or not runtime.results_url or runtime.results_token is None:
            self.on_result("not_configured")
            return RetryLater("runtime_not_configured",
                              f"no results_url/token for runtime {runtime_name}")
        # A fenced step like any other: a claimant whose lease was reclaimed (or
        # whose trust horizon passed while it was paused) delivers nothing; this
        # raises LostLease and the row belongs to whoever holds it now. A batch
        # proves its deliveries' claims together, just before its request leaves.
        if self.batches is not None and self.batches.serves(runtime):
            answer = await self.batches.send(Delivery(runtime, ctx.fence, request, size))
        else:
            if self.fences is not None:
                await self.fences.submit(ctx.fence)
            else:
                await ctx.check_fence()
            answer = await self._post(runtime, request)
        return self._settle(ctx, command_id, request, answer)

    async def _post(self, runtime: RuntimeClient, request: dict[str, object]) -> RuntimeAnswer:
        assert runtime.results_token is not None  # handle() checked it
        try:
            response = await self.client.request(
                "POST", runtime.results_url,
                json=request,
                headers={"Authorization": f"Bearer {runtime.results_token.reveal()}"},
                timeout_s=self.timeout_s,
            )
        except httpx.HTTPError as exc:
            return RuntimeAnswer(0, type(exc).__name__)
        return RuntimeAnswer(response.status_code, error_code(response))

    def _settle(self, ctx: WorkContext, command_id: str, request: dict[str, object],
                answer: RuntimeAnswer) -> Outcome:
        """The delivery's outcome from the Runtime's answer to its request."""
        status, error = answer.status, answer.error
        if status == 0:
            self.on_result("unreachable")
            self._mark(ctx, command_id, confirmed=False, error=f"transport:{error}")
            return RetryLater("runtime_unreachable", error)
        self.on_result(receipt_result(status))
        if status == 200:
            self._mark(ctx, command_id, confirmed=True, error=None)
            logs.debug("receipt_confirmed", command_id=command_id, work_id=ctx.item.work_id,
                       format=request.get("result_format_version"))
            return Succeeded("receipt confirmed by the Runtime")
        self._mark(ctx, command_id, confirmed=False, error=f"http_{status}:{error}")
        if status == 422:
            # An old Runtime: keep the exact result and try again after its upgrade.
            return RetryLater("runtime_rejects_format",
                              f"the Runtime rejected result format"
                              f" {request.get('result_format_version')}"
                              f" ({error}); kept, retrying")
        if status == 409:
            return DeadLetter("runtime_conflict", f"the Runtime refused the result ({error});"
                              " failing closed")
        if status in (401, 403, 404):
            return RetryLater(f"runtime_{status}", f"the Runtime answered {status} ({error})")
        if error == MALFORMED_BATCH_ANSWER:
            return RetryLater(MALFORMED_BATCH_ANSWER, "the Runtime's batch answer did not hold"
                              " one result per request; retrying")
        return RetryLater(f"runtime_{status}", f"the Runtime answered {status}")

    @staticmethod
    def _mark(ctx: WorkContext, command_id: str, *, confirmed: bool, error: str | None) -> None:
        """Record the delivery result with the item's finalization (one commit)."""
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            await mark_receipt(tx, command_id, confirmed=confirmed, error=error, now_us=now)

        ctx.on_finalize(write)


def receipt_handler(sender: ReceiptSender) -> Handler:
    async def handle(ctx: WorkContext) -> Outcome:
        return await sender.handle(ctx)

    return handle
