"""Helpers for command/effect conformance tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from config.settings import BindingSettings
from daemon.core.canonical import canonical_bytes, canonical_digest
from daemon.core.handoff import EffectHandoffKey, TrustedRuntimeWorkScope
from storage.effect_values import CommandDraft
from storage.port import PublishParams

if TYPE_CHECKING:
    from storage.work_store import WorkStore

SCOPE = TrustedRuntimeWorkScope("org-1", "install-1", "cap.leads", "sha256:binding")
OTHER_ORG = TrustedRuntimeWorkScope("org-2", "install-1", "cap.leads", "sha256:binding")
# The binding :func:`draft` names, as its [[bindings]] entry would configure it.
HUBSPOT_MAIN = BindingSettings(binding_id="hubspot-main", provider="hubspot", org_id="org-1",
                               app_installation_id="install-1", remote_account_id="portal-1",
                               base_url="http://127.0.0.1:1")


def command_doc(intent_id: str, title: str = "CTO", lead: str = "lead-1") -> dict[str, Any]:
    return {
        "intent_id": intent_id,
        "intent_kind": "UPSERT",
        "operation": "hubspot.contact.update_jobtitle",
        "logical_target": {"object": "lead", "lead_id": lead},
        "catalog_revision": 7,
        "request": {"properties": {"jobtitle": title}},
    }


def draft(intent_id: str = "int-1", *, scope: TrustedRuntimeWorkScope = SCOPE,
          outbox: str = "outbox-1", title: str = "CTO", lead: str = "lead-1",
          digest: str | None = None) -> CommandDraft:
    doc = command_doc(intent_id, title, lead)
    return CommandDraft(
        scope=scope, runtime_name="crm", handoff_key=EffectHandoffKey(scope, intent_id).encode(),
        payload_digest=digest or canonical_digest(doc), runtime_outbox_id=outbox,
        intent_id=intent_id, intent_kind="UPSERT", operation=doc["operation"],
        local_object="lead", local_id=lead, binding_id="hubspot-main", binding_generation=1,
        catalog_revision=7, catalog_digest="sha256:catalog",
        frozen_request=canonical_bytes(doc["request"]).decode(), max_attempts=8,
        lane=f"{scope.org_id}:lead:{lead}",
    )


async def publish_test_revision(store: WorkStore) -> None:
    """Publish revision 7 under the digest :func:`draft` pins ("sha256:catalog"), so a
    repair can resolve it as the current revision (idempotent)."""
    await store.catalog_publish(PublishParams(revision=7, digest="sha256:catalog",
                                              content="{}", actor="test", role="admin",
                                              reason="test setup"), 0)
