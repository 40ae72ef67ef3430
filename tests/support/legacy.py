"""The sandbox's legacy claimant as the cutover sees it."""

from __future__ import annotations

from sandbox.legacy.store import ReferenceLegacyProbe


def sandbox_claimant() -> ReferenceLegacyProbe:
    return ReferenceLegacyProbe()
