"""The console's per-app state, reachable from any request handler."""

from __future__ import annotations

import secrets

import attrs
from quart import current_app

from admin_ui.access import action_table
from admin_ui.actions import Operations
from admin_ui.extensions import ConsoleExtensions
from admin_ui.passwords import PasswordVerifier
from admin_ui.sessions import SessionCodec
from admin_ui.view import ReplicaView

EXTENSION_KEY = "integrationd.console"


@attrs.define(eq=False)
class Console:
    """Everything the console's handlers share (one per app)."""

    view: ReplicaView
    codec: SessionCodec
    extensions: ConsoleExtensions
    actions: dict[str, frozenset[str]]
    verifier: PasswordVerifier

    @classmethod
    def build(cls, view: ReplicaView, extensions: ConsoleExtensions | None) -> Console:
        admin = view.settings.admin
        secret = (admin.session_secret.reveal().encode() if admin.session_secret
                  else secrets.token_bytes(32))
        ext = extensions or ConsoleExtensions()
        return cls(
            view=view,
            codec=SessionCodec(secret, admin.session_ttl,
                               lambda: view.clock.now_us() / 1_000_000),
            extensions=ext,
            actions=action_table(ext.actions),
            verifier=PasswordVerifier(),
        )

    @property
    def ops(self) -> Operations:
        v = self.view
        return Operations(v.store, v.settings, v.registry, v.clock)

    @property
    def proxy_mode(self) -> bool:
        return self.view.settings.admin.auth == "proxy"


def console() -> Console:
    found = current_app.extensions[EXTENSION_KEY]
    assert isinstance(found, Console)
    return found
