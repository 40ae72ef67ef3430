"""The legacy owner's executor for the HubSpot ``Lead.Title -> contact.jobtitle`` slice
(the old ConnectorPush shape, seed 11.2), the parity oracle for integrationd's path.

One event is one sparse PATCH of ``jobtitle`` on the linked contact, attempted
once (no retry: a failure is terminal, as the old claimant's was), then local
completion with operator evidence: the method, the target path, the status and
the remote id the provider answered with. No credential, header or body is
kept in the evidence.
"""

from __future__ import annotations

import json

import attrs
import httpx

from sandbox.legacy.store import LegacyEvent, claim_one, finish
from storage.work_store import WorkStore

CONTACTS_PATH = "/crm/v3/objects/contacts"


@attrs.frozen
class PushEvidence:
    method: str
    target_path: str
    status: int | None
    remote_id: str | None

    def to_json(self) -> str:
        return json.dumps(attrs.asdict(self), sort_keys=True)


def title_event(lead_id: str, contact_id: str, title: str) -> str:
    """An event payload of the slice (what the old owner stored per change)."""
    return json.dumps({"lead_id": lead_id, "contact_id": contact_id, "title": title},
                      sort_keys=True)


async def push_one(http: httpx.AsyncClient, base_url: str, token: str,
                   event: LegacyEvent) -> PushEvidence:
    doc = json.loads(event.payload)
    path = f"{CONTACTS_PATH}/{doc['contact_id']}"
    body = json.dumps({"properties": {"jobtitle": doc["title"]}}, separators=(",", ":"))
    try:
        r = await http.patch(base_url + path, content=body.encode(), headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    except httpx.HTTPError:
        return PushEvidence("PATCH", path, None, None)
    remote_id = None
    if r.status_code == 200:
        remote_id = str(r.json().get("id"))
    return PushEvidence("PATCH", path, r.status_code, remote_id)


async def run_pushes(store: WorkStore, family: str, worker: str, http: httpx.AsyncClient,
                     base_url: str, token: str, now_us: int) -> int:
    """Claim and push until the legacy owner may claim nothing more; how many ran."""
    done = 0
    while (event := await claim_one(store, family, worker, 60_000_000, now_us)) is not None:
        evidence = await push_one(http, base_url, token, event)
        outcome = "succeeded" if evidence.status == 200 else "dead"
        await finish(store, event, worker, outcome, now_us, evidence.to_json())
        done += 1
    return done
