"""The admin listener's application: ``/metrics``, ``/healthz``, ``/readyz``.

``create_app`` takes a :class:`ReplicaView`, the read-only window the replica
gives its HTTP surface, so that the app can be served (and tested) apart from
the work loop.
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Protocol

from quart import Response
from quart_trio import QuartTrio

from config.settings import Settings
from daemon.services.clock import Clock
from daemon.services.families import FamilyRegistry
from storage.work_store import WorkStore

if TYPE_CHECKING:
    from daemon.services.replica import HistoryPoint


class ReplicaView(Protocol):
    """What the admin listener may see of its replica (``daemon.services.replica.Replica``)."""

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


METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def create_app(replica: ReplicaView) -> QuartTrio:
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = 64 * 1024

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(replica.metrics_text(), content_type=METRICS_CONTENT_TYPE)

    @app.get("/healthz")
    async def healthz() -> tuple[dict[str, object], int]:
        return {"status": "ok"}, 200

    @app.get("/readyz")
    async def readyz() -> tuple[dict[str, object], int]:
        ready, detail = replica.readiness()
        return {"ready": ready, **detail}, 200 if ready else 503

    @app.errorhandler(404)
    async def not_found(_: Exception) -> tuple[dict[str, object], int]:
        return {"error": "not_found", "message": "no such route"}, 404

    @app.errorhandler(405)
    async def not_allowed(_: Exception) -> tuple[dict[str, object], int]:
        return {"error": "method_not_allowed", "message": "method not allowed here"}, 405

    return app
