"""The reference Runtime's inbound-mutation endpoint over real HTTP: only the named
inbound fields change, once per mutation key; the same key with another body is a 409;
bad input is a clear error that changes nothing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.sandbox_runtime import (
    RESULTS_TOKEN,
    FakeIntegration,
    RunningRuntime,
    running_fake,
    running_runtime,
)

AUTH = {"Authorization": f"Bearer {RESULTS_TOKEN}"}


@pytest.fixture
async def rt() -> AsyncIterator[RunningRuntime]:
    pair: tuple[FakeIntegration, str]
    async with running_fake() as pair, running_runtime(pair[1]) as running:
        yield running


async def mutate(rt: RunningRuntime, key: str, fields: dict[str, Any],
                 lead_id: str = "lead-1", **headers: str) -> Any:
    body = {"mutation_key": key, "lead_id": lead_id, "fields": fields,
            "source": {"remote_object": "prospect", "remote_id": "7"}}
    return await rt.http.post("/runtime/v1/inbound-mutations", json=body,
                              headers=headers or AUTH)


async def fields_of(rt: RunningRuntime, lead_id: str = "lead-1") -> dict[str, Any]:
    response = await rt.http.get(f"/_runtime/leads/{lead_id}/fields")
    doc: dict[str, Any] = response.json()["fields"]
    return doc


async def test_a_mutation_applies_once_and_a_resend_is_a_duplicate(rt: RunningRuntime) -> None:
    await rt.create_lead("lead-1", "Engineer")
    first = await mutate(rt, "inb:k1", {"FirstName": "Ada", "Company": "ACME"})
    assert first.status_code == 200
    assert first.json()["status"] == "APPLIED"
    again = await mutate(rt, "inb:k1", {"FirstName": "Ada", "Company": "ACME"})
    assert again.json()["status"] == "DUPLICATE"
    second = await mutate(rt, "inb:k2", {"LastName": "Lovelace"})
    assert second.json()["status"] == "APPLIED"
    # A partial mutation never blanks what it did not name; the title is untouched.
    assert await fields_of(rt) == {"FirstName": "Ada", "Company": "ACME", "LastName": "Lovelace"}
    assert (await rt.http.get("/leads/lead-1")).json()["title"] == "Engineer"
    stats = (await rt.http.get("/_runtime/stats")).json()
    assert (stats["mutations_applied"], stats["mutation_duplicates"]) == (2, 1)


async def test_the_same_key_with_another_body_is_refused(rt: RunningRuntime) -> None:
    await rt.create_lead("lead-1", "Engineer")
    await mutate(rt, "inb:k1", {"FirstName": "Ada"})
    conflict = await mutate(rt, "inb:k1", {"FirstName": "Grace"})
    assert (conflict.status_code, conflict.json()["error"]) == (409, "mutation_conflict")
    assert await fields_of(rt) == {"FirstName": "Ada"}


@pytest.mark.parametrize(("fields", "status", "error"), [
    ({"Title": "CTO"}, 400, "unsupported_field"),
    ({}, 400, "bad_request"),
    ({"FirstName": 7}, 400, "bad_request"),
])
async def test_bad_mutations_change_nothing(rt: RunningRuntime, fields: dict[str, Any],
                                            status: int, error: str) -> None:
    await rt.create_lead("lead-1", "Engineer")
    response = await mutate(rt, "inb:k1", fields)
    assert (response.status_code, response.json()["error"]) == (status, error)
    assert response.json()["message"]
    assert await fields_of(rt) == {}
    assert (await rt.http.get("/leads/lead-1")).json()["title"] == "Engineer"


async def test_unknown_or_deleted_lead_and_missing_token(rt: RunningRuntime) -> None:
    assert (await mutate(rt, "inb:k1", {"FirstName": "A"}, "nope")).status_code == 404
    await rt.create_lead("lead-2", "Engineer")
    assert (await rt.http.delete("/leads/lead-2")).status_code == 204
    gone = await mutate(rt, "inb:k2", {"FirstName": "A"}, "lead-2")
    assert (gone.status_code, gone.json()["error"]) == (410, "lead_deleted")
    await rt.create_lead("lead-1", "Engineer")
    unauthorized = await mutate(rt, "inb:k3", {"FirstName": "A"},
                                Authorization="Bearer wrong")
    assert unauthorized.status_code == 401
    assert await fields_of(rt) == {}


async def test_leads_are_matched_by_email_case_insensitively(rt: RunningRuntime) -> None:
    for lead_id, email in (("lead-1", "ada@example.com"), ("lead-2", "ADA@example.com"),
                           ("lead-3", "grace@example.com")):
        made = await rt.http.post("/leads", json={"lead_id": lead_id, "title": "x",
                                                  "fields": {"Email": email}})
        assert made.status_code == 201
    found = await rt.http.get("/runtime/v1/leads", params={"field": "Email",
                                                           "value": "Ada@Example.com"},
                              headers=AUTH)
    assert found.json() == {"lead_ids": ["lead-1", "lead-2"]}
    bad = await rt.http.get("/runtime/v1/leads", params={"field": "Title", "value": "x"},
                            headers=AUTH)
    assert bad.status_code == 400
    assert (await rt.http.get("/runtime/v1/leads", params={"field": "Email", "value": "x"})
            ).status_code == 401
