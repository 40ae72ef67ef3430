"""A repeated handoff key whose new body also fails validation is quarantined
(seed 6.1; issue 8, item 12), not only answered 4xx. Real HTTP, every backend."""

from __future__ import annotations

from typing import Any

import pytest

from storage.port import WorkQuery
from tests.e2e.test_service_api import Api, api, body  # noqa: F401  (fixture)


@pytest.mark.parametrize(("repeat", "status", "error"), [
    # Another body under the admitted key, and that body is itself invalid.
    (body(title="CEO", catalog_revision=6), 409, "catalog_revision_not_published"),
    (body(title="CEO", intent_kind="DELETE"), 422, "invalid_request"),
    (body(request={"properties": {"jobtitle": "x", "email": "y"}}), 422, "invalid_request"),
    # The admitted digest, but a body that is not the one it names.
    ({**body(), "command": {**body()["command"], "operation": "salesforce.nope"}}, 400,
     "payload_digest_mismatch"),
    # Another outbox identity with an invalid body.
    ({**body(outbox="ob-2", catalog_revision=6)}, 409, "catalog_revision_not_published"),
])
async def test_an_admitted_key_repeated_with_an_invalid_body_is_quarantined(
    api: Api, repeat: dict[str, Any], status: int, error: str  # noqa: F811
) -> None:
    first = await api.post("/v1/commands", body())
    assert first.status_code == 200, first.text
    key = body()["effect_handoff_key"]
    r = await api.post("/v1/commands", repeat)
    assert (r.status_code, r.json()["error"]) == (status, error), r.text
    assert await api.store.quarantine_count(key) == 1
    # ... and in a batch, entry by entry.
    r = await api.post("/v1/commands/batch", {"commands": [repeat]})
    assert r.status_code == 200
    assert [(e["status"], e["error"]) for e in r.json()["results"]] == [(status, error)]
    assert await api.store.quarantine_count(key) == 2
    # Nothing else changed: one command, one WorkItem.
    assert len(await api.store.work_list(WorkQuery(family="external_effect"))) == 1


async def test_an_invalid_body_for_a_fresh_key_is_only_refused(api: Api) -> None:  # noqa: F811
    doc = body(catalog_revision=6)
    r = await api.post("/v1/commands", doc)
    assert (r.status_code, r.json()["error"]) == (409, "catalog_revision_not_published")
    assert await api.store.quarantine_count(doc["effect_handoff_key"]) == 0
    assert await api.nothing_written()


async def test_the_same_admitted_body_repeated_is_not_quarantined(api: Api) -> None:  # noqa: F811
    assert (await api.post("/v1/commands", body())).status_code == 200
    assert (await api.post("/v1/commands", body())).status_code == 200
    assert await api.store.quarantine_count(body()["effect_handoff_key"]) == 0
