"""What the admin listener may see of its replica.

The app never reaches into the work loop: it reads through this protocol,
which :class:`daemon.services.replica.Replica` implements, so the console can
be served (and tested) apart from the running replica.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Protocol

from config.settings import Settings
from daemon.services.clock import Clock
from daemon.services.families import FamilyRegistry
from storage.work_store import WorkStore

if TYPE_CHECKING:
    from daemon.services.replica import HistoryPoint, MetricSample


class ReplicaView(Protocol):
    """The read-only window (plus the shared store) the admin listener gets."""

    settings: Settings
    store: WorkStore
    registry: FamilyRegistry
    clock: Clock
    replica_id: str
    history: collections.deque[HistoryPoint]

    @property
    def state(self) -> str: ...

    def metrics_text(self) -> bytes: ...

    def readiness(self) -> tuple[bool, dict[str, object]]: ...

    def counter_samples(self, prefix: str = "integrationd_work_") -> list[MetricSample]: ...
