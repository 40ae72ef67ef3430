"""A minimal JSON:API Prospect endpoint on a real loopback HTTP/1.1 server (h11).

Just enough of Outreach's API v2 to prove that its L1 definition is data alone:
``GET`` and ``PATCH /api/v2/prospects/{id}`` with ``application/vnd.api+json``,
bearer auth, the resource object ``{"data": {"type", "id", "attributes"}}`` with
an integer id, and ``updatedAt`` in the attributes. Strict about what it is sent
(a PATCH whose body is not that shape, or names another id, is refused), so a
test passing against it means the executor built the right request. The full
Outreach simulator comes with the ingress issue.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Final

import attrs
import trio

from sandbox.h11_server import H11Server, Request, Response

PREFIX: Final = "/api/v2/prospects/"
MEDIA: Final = "application/vnd.api+json"


def _stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _doc(status: int, doc: Any) -> Response:
    return Response(status, json.dumps(doc).encode(), (("content-type", MEDIA),
                                                       ("x-request-id", f"req-{status}")))


def _error(status: int, title: str) -> Response:
    return _doc(status, {"errors": [{"status": str(status), "title": title}]})


@attrs.define(eq=False)
class ProspectApi:
    token: str = attrs.field(repr=False)
    prospects: dict[int, dict[str, Any]] = attrs.field(factory=dict)
    # (method, path, content type, body) of every request, oldest first.
    seen: list[tuple[str, str, str, bytes]] = attrs.field(factory=list)
    patches_applied: int = 0
    # When set, a PATCH answers 200 naming this id instead (and applies nothing).
    answer_with_id: int | None = None

    def add(self, prospect_id: int, **attributes: str | None) -> None:
        self.prospects[prospect_id] = {**attributes, "updatedAt": _stamp()}

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
                  ) -> None:
        await H11Server(self.handle).run("127.0.0.1", 0, task_status=task_status)

    def _resource(self, prospect_id: int) -> dict[str, Any]:
        return {"data": {"type": "prospect", "id": prospect_id,
                         "attributes": dict(self.prospects[prospect_id])}}

    async def handle(self, request: Request) -> Response:
        self.seen.append((request.method, request.path,
                          request.headers.get("content-type", ""), request.body))
        if request.headers.get("authorization") != f"Bearer {self.token}":
            return _error(401, "Unauthorized")
        rest = request.path.removeprefix(PREFIX)
        if rest == request.path or not rest.isdigit():
            return _error(404, "no such route")
        prospect_id = int(rest)
        if prospect_id not in self.prospects:
            return _error(404, "Prospect not found")
        if request.method == "GET":
            return _doc(200, self._resource(prospect_id))
        if request.method != "PATCH":
            return _error(405, "method not allowed")
        if request.headers.get("content-type") != MEDIA:
            return _error(415, f"Content-Type must be {MEDIA}")
        try:
            data = json.loads(request.body)["data"]
            attributes = data["attributes"]
        except (ValueError, KeyError, TypeError):
            return _error(400, "a JSON:API resource object is required")
        if set(data) != {"type", "id", "attributes"} or data["type"] != "prospect":
            return _error(400, "the resource object must be a prospect")
        if not isinstance(data["id"], int) or data["id"] != prospect_id:
            return _error(409, "the resource id does not match the URL")
        if not isinstance(attributes, dict) or not attributes:
            return _error(400, "attributes must be a non-empty object")
        if self.answer_with_id is not None:
            doc = self._resource(prospect_id)
            doc["data"]["id"] = self.answer_with_id
            return _doc(200, doc)
        self.prospects[prospect_id].update(attributes, updatedAt=_stamp())
        self.patches_applied += 1
        return _doc(200, self._resource(prospect_id))
