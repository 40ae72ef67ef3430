"""The effect flow per sample interval: commands accepted, provider answers, receipts.

Read by the replica's depth sampler (one call per ``work.depth_sample_interval``)
for the console's flow charts. Every query is a range on an indexed time column
(``0003_console.sql``) over one interval, so its cost follows the traffic
of that interval, not the size of the tables; the latency read is capped at
:data:`LATENCY_SAMPLE` rows per interval (the counts stay exact).

End-to-end latency is measured on receipts confirmed in the interval, from the
command's acceptance (``external_commands.created_at_us``) to the provider's
answer (the command settled and its receipt was queued:
``result_receipts.created_at_us``) and to the Runtime's confirmation
(``result_receipts.confirmed_at_us``). A repair command has no receipt and is
not measured.
"""

from __future__ import annotations

import attrs

from daemon.core.latency import LatencyHistogram
from storage.port import Database, SqlTx

LATENCY_SAMPLE = 5000


@attrs.frozen
class FlowSample:
    """What the effect path did in one interval (cluster-wide)."""

    accepted: int = 0
    effects: tuple[tuple[str, int], ...] = ()  # (outcome class, attempts answered)
    receipts_confirmed: int = 0
    to_response: LatencyHistogram = attrs.field(factory=LatencyHistogram)
    to_receipt: LatencyHistogram = attrs.field(factory=LatencyHistogram)


class FlowReads:
    db: Database

    async def flow_sample(self, since_us: int, until_us: int) -> FlowSample:
        """The flow in ``[since_us, until_us)``."""
        window = (since_us, until_us)

        async def body(tx: SqlTx) -> FlowSample:
            accepted = await tx.fetchall(
                "SELECT COUNT(*) FROM external_commands"
                " WHERE created_at_us >= ? AND created_at_us < ?", window)
            effects = await tx.fetchall(
                "SELECT outcome, COUNT(*) FROM effect_attempts"
                " WHERE finished_at_us >= ? AND finished_at_us < ? GROUP BY outcome", window)
            confirmed = await tx.fetchall(
                "SELECT COUNT(*) FROM result_receipts"
                " WHERE confirmed_at_us >= ? AND confirmed_at_us < ?", window)
            latencies = await tx.fetchall(
                "SELECT r.created_at_us - c.created_at_us, r.confirmed_at_us - c.created_at_us"
                " FROM result_receipts r JOIN external_commands c"
                " ON c.command_id = r.command_id"
                f" WHERE r.confirmed_at_us >= ? AND r.confirmed_at_us < ? LIMIT {LATENCY_SAMPLE}",
                window)
            return FlowSample(
                accepted=int(accepted[0][0]),
                effects=tuple(sorted((str(o), int(n)) for o, n in effects if o is not None)),
                receipts_confirmed=int(confirmed[0][0]),
                to_response=LatencyHistogram.of(int(a) for a, _ in latencies),
                to_receipt=LatencyHistogram.of(int(b) for _, b in latencies),
            )

        return await self.db.transact(body, name="flow.sample", write=False)
