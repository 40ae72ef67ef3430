"""An Outreach API v2 simulator (JSON:API Prospects and Webhooks) on a real loopback
HTTP/1.1 server, with a control API, fault injection and a signing webhook sender.

Theory of operation
-------------------
* ``sandbox.h11_server`` moves bytes (and can reset a connection, which an ASGI server
  cannot); faults are ``sandbox.hubspot_sim``'s ``Fault`` values (one FIFO; a provider
  request takes one shot from the first fault it matches).
* ``model`` holds what the provider knows: Prospects, subscriptions, the per-token rate
  window, the ``page[after]`` cursor codec, the request and delivery journals.
* ``simulator`` is the provider: the Prospects API (GET, PATCH, POST, DELETE, list with
  ``filter[updatedAt]``, ``sort=updatedAt``, ``page[size]``, ``links.next``), the
  Webhooks API (``POST/GET/DELETE /api/v2/webhooks``, a cleanup token per subscription),
  and the sender that signs and posts version-2 payloads for every announced change.
* ``control`` is the ``/_sim/`` API, so another process can seed Prospects, change them
  "inside Outreach", bulk-update many to one ``updatedAt``, drop deliveries, arm faults.
* ``python -m sandbox.outreach_sim`` runs it standalone.

See docs/sandbox-outreach.md for what is modelled and what is not.
"""

from sandbox.outreach_sim.model import DeliveryRecord, Prospect, RequestRecord, Subscription
from sandbox.outreach_sim.simulator import (
    CLEANUP_TOKEN_HEADER,
    JSONAPI,
    PROSPECTS_PATH,
    REQUEST_ID_HEADER,
    SIGNATURE_HEADER,
    WEBHOOKS_PATH,
    OutreachSimulator,
    sign,
)

__all__ = [
    "CLEANUP_TOKEN_HEADER",
    "JSONAPI",
    "PROSPECTS_PATH",
    "REQUEST_ID_HEADER",
    "SIGNATURE_HEADER",
    "WEBHOOKS_PATH",
    "DeliveryRecord",
    "OutreachSimulator",
    "Prospect",
    "RequestRecord",
    "Subscription",
    "sign",
]
