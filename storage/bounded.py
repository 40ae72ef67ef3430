"""Counts whose cost does not grow with the table (issue 23: the console at 1M open and
20M terminal rows).

A console count that read every matching row took seconds at size (the unknown-outcome
backlog 12.7 s, the Ingress totals 3.1 s). An operator needs the exact figure while it is
small enough to act on one by one, and "more than N" past that: a count stops after
``cap + 1`` rows read from an index range, so it costs at most ``cap`` index entries
whatever the table holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from storage.port import SqlTx


@attrs.frozen
class BoundedCount:
    """``n`` matching rows, or (``more``) more than ``n``: the count stopped at ``n``."""

    n: int
    more: bool = False

    def text(self) -> str:
        """As an operator reads it: "1,234" or "more than 10,000"."""
        return f"more than {self.n:,}" if self.more else f"{self.n:,}"

    def json(self) -> dict[str, Any]:
        return {"count": self.n, "more": self.more}


async def bounded_count(tx: SqlTx, select_rows: str, params: Sequence[Any],
                        cap: int) -> BoundedCount:
    """Count the rows of ``select_rows`` (a ``SELECT 1 FROM ... WHERE ...`` led by an
    index, without ORDER BY or LIMIT), reading at most ``cap + 1`` of them."""
    rows = await tx.fetchall(
        f"SELECT COUNT(*) FROM ({select_rows} LIMIT ?) bounded", (*params, cap + 1))
    found = int(rows[0][0])
    return BoundedCount(min(found, cap), found > cap)
