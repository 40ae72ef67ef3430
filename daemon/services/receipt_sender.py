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
from daemon.providers.executor import Answer, BoundedHttp
from daemon.services import logs
from daemon.services.batcher import Batcher
from daemon.services.families import Handler, WorkContext
from daemon.services.metrics import receipt_result
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
        runtime = self._runtime(runtime_name)
        if runtime is None or not runtime.results_url or runtime.results_token is None:
            self.on_result("not_configured")
            return RetryLater("runtime_not_configured",
                              f"no results_url/token for runtime {runtime_name}")
        # A fenced step like any other: a claimant whose lease was reclaimed (or
        # whose trust horizon passed while it was paused) delivers nothing; this
        # raises LostLease and the row belongs to whoever holds it now.
        if self.fences is not None:
            await self.fences.submit(ctx.fence)
        else:
            await ctx.check_fence()
        try:
            response = await self.client.request(
                "POST", runtime.results_url,
                json=request,
                headers={"Authorization": f"Bearer {runtime.results_token.reveal()}"},
                timeout_s=self.timeout_s,
            )
        except httpx.HTTPError as exc:
            self.on_result("unreachable")
            await self._note(ctx, command_id, f"transport:{type(exc).__name__}")
            return RetryLater("runtime_unreachable", type(exc).__name__)
        status = response.status_code
        error = _error_code(response)
        self.on_result(receipt_result(status))
        if status == 200:
            self._mark(ctx, command_id, confirmed=True, error=None)
            logs.debug("receipt_confirmed", command_id=command_id, work_id=ctx.item.work_id,
                       format=request.get("result_format_version"))
            return Succeeded("receipt confirmed by the Runtime")
        await self._note(ctx, command_id, f"http_{status}:{error}")
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
        return RetryLater(f"runtime_{status}", f"the Runtime answered {status}")

    async def _note(self, ctx: WorkContext, command_id: str, error: str) -> None:
        self._mark(ctx, command_id, confirmed=False, error=error)

    @staticmethod
    def _mark(ctx: WorkContext, command_id: str, *, confirmed: bool, error: str | None) -> None:
        """Record the delivery result with the item's finalization (one commit)."""
        now = ctx.clock.now_us()

        async def write(tx: SqlTx) -> None:
            await mark_receipt(tx, command_id, confirmed=confirmed, error=error, now_us=now)

        ctx.on_finalize(write)


def _error_code(response: Answer) -> str:
    try:
        doc = response.json()
    except ValueError:
        return ""
    value = doc.get("error") if isinstance(doc, dict) else None
    return value[:64] if isinstance(value, str) else ""


def receipt_handler(sender: ReceiptSender) -> Handler:
    async def handle(ctx: WorkContext) -> Outcome:
        return await sender.handle(ctx)

    return handle
