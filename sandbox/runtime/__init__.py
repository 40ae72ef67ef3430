"""A reference CRM Runtime: a real HTTP server that hands intents to integrationd.

It owns Leads, immutable outbound intents, a post-commit outbox and exact terminal result
receipts, all in memory. See ``docs/sandbox-runtime.md`` for routes and the wire contract.
"""

from sandbox.runtime.runtime import DEFAULT_OPERATION, ReferenceRuntime
from sandbox.runtime.server import create_app, serve

__all__ = ["DEFAULT_OPERATION", "ReferenceRuntime", "create_app", "serve"]
