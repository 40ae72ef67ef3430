"""What the admin listener may see of its replica.

The app never reaches into the work loop: it reads through this protocol,
which :class:`daemon.services.replica.Replica` implements, so the console can
be served (and tested) apart from the running replica. The console does not
import the replica (nor the replica the console): the CLI, the composition
root, builds the app and hands the replica a factory for it. The history and
counter samples the console reads are described here by their shape.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from config.settings import Settings
from daemon.services.clock import Clock
from daemon.services.families import FamilyRegistry
from storage.flow import FlowSample
from storage.port import OutcomeCount, QueueDepth
from storage.work_store import WorkStore


class HistoryPoint(Protocol):
    """One depth sample, and what finished (cluster-wide) since the previous one."""

    @property
    def at_us(self) -> int: ...

    @property
    def interval_s(self) -> float: ...

    @property
    def depths(self) -> Sequence[QueueDepth]: ...

    @property
    def finished(self) -> Sequence[OutcomeCount]: ...

    @property
    def flow(self) -> FlowSample: ...  # the effect path over the same interval

    @property
    def claims(self) -> int: ...  # WorkItems this replica claimed over the interval


class MetricSample(Protocol):
    """One sample of the replica's metrics: name, labels, value."""

    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def value(self) -> float: ...


class ReplicaView(Protocol):
    """The read-only window (plus the shared store) the admin listener gets."""

    settings: Settings
    store: WorkStore
    registry: FamilyRegistry
    clock: Clock
    replica_id: str

    @property
    def history(self) -> Sequence[HistoryPoint]: ...

    @property
    def state(self) -> str: ...

    def metrics_text(self) -> bytes: ...

    def readiness(self) -> tuple[bool, dict[str, object]]: ...

    def counter_samples(self, prefix: str = "integrationd_work_") -> Sequence[MetricSample]: ...
