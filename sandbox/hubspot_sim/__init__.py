"""A HubSpot contacts API simulator on a real loopback HTTP/1.1 server, with faults.

Theory of operation
-------------------
integrationd's effect executor must tell apart outcomes that only a real network
shows: refused before sending (retry), reset or timed out after sending (outcome
unknown), 4xx (rejected), 429 (retry after the provider's delay). This package
produces each of them on demand, and counts every request so a duplicate PATCH
is visible.

* ``sandbox.h11_server`` moves bytes: trio sockets plus h11, one task per
  connection, keep-alive, and the ability to *abort* a connection with a TCP RST
  (which an ASGI server cannot do).
* ``model`` holds what the provider knows: contacts, armed faults (a FIFO; each
  provider request takes one shot from the first fault it matches) and the
  request journal (one ``RequestRecord`` per provider request, never credentials).
* ``simulator`` is the provider: ``HubSpotSimulator.handle`` takes a fault,
  handles the request (or not), journals it, and answers or aborts.
* ``control`` is the ``/_sim/`` API, so another process (an e2e test, the
  benchmark) can seed contacts, arm faults and read the journal.
* ``python -m sandbox.hubspot_sim`` runs it standalone (see ``__main__``).

All state lives in one trio thread; a state change and its journal record happen
with no await between them, so no locks are needed.
"""

from sandbox.hubspot_sim.model import FAULT_MODES, Fault, FaultMode, RequestRecord
from sandbox.hubspot_sim.simulator import CONTACTS_PATH, MAX_BODY, HubSpotSimulator

__all__ = [
    "CONTACTS_PATH",
    "FAULT_MODES",
    "MAX_BODY",
    "Fault",
    "FaultMode",
    "HubSpotSimulator",
    "RequestRecord",
]
