"""The Catalog revisions a replica serves: every published one, parsed once.

Theory of operation
-------------------
The configuration describes one Catalog (``config/catalog.py``): the shipped
L1 definitions plus this deployment's L2 bindings, numbered
``catalog.revision``. That is the *current* revision: what a replay or a
repair resolves to. Work does not run against it. Admission pins a command to
the published revision the command names (revision and digest), and every
later step (dispatch, automatic retries, reconciliation, replay) runs
against exactly that revision's stored content, parsed back through the same
parser. A revision is an immutable fact, so a parsed one is cached for the
life of the process, keyed by (revision, digest); only *whether* a revision
is still published is read again, at admission.

Tokens are not part of a revision: a pinned binding carries the token the
current settings hold for the same binding id.
"""

from __future__ import annotations

import attrs
import trio

from config.catalog import Catalog, CatalogError
from config.catalog_revisions import catalog_from_content
from daemon.services import logs
from storage.port import CatalogRevision, CatalogRevisionPort, PublishParams


@attrs.define(eq=False)
class CatalogView:
    store: CatalogRevisionPort
    current: Catalog
    _parsed: dict[tuple[int, str], Catalog] = attrs.field(factory=dict, init=False)
    # One read and parse per revision: the handlers that want it at once wait for it.
    _loading: dict[tuple[int, str], trio.Lock] = attrs.field(factory=dict, init=False)

    def _parse(self, row: CatalogRevision) -> Catalog | None:
        key = (row.revision, row.digest)
        found = self._parsed.get(key)
        if found is not None:
            return found
        try:
            catalog = catalog_from_content(row.revision, row.digest, row.content,
                                           self.current.bindings)
        except CatalogError as exc:
            logs.error("catalog_revision_unusable", revision=row.revision, error=str(exc))
            return None
        self._parsed[key] = catalog
        return catalog

    async def published(self, revision: int) -> Catalog | None:
        """The published revision ``revision`` (None if it is not published now).
        Admission uses this: one short read says whether it is still published."""
        digest = await self.store.catalog_digest(revision)
        if digest is None:
            return None
        return await self.pinned(revision, digest)

    async def pinned(self, revision: int, digest: str) -> Catalog | None:
        """Exactly the revision a command pinned; None if no such content is stored.

        A command admitted before revisions were stored (migration 0007) has no
        digest: it was admitted because its revision number was the one served,
        so it runs under the revision published under that number."""
        key = (revision, digest)
        found = self._parsed.get(key)
        if found is not None:
            return found
        async with self._loading.setdefault(key, trio.Lock()):
            found = self._parsed.get(key)  # parsed while this task waited
            if found is not None:
                return found
            row = await self.store.catalog_get(revision)
            if row is None or (digest and row.digest != digest):
                return None
            return self._parse(row)


async def publish_current(store: CatalogRevisionPort, catalog: Catalog, *, actor: str,
                          role: str, reason: str, now_us: int) -> tuple[CatalogRevision, bool]:
    """Publish ``catalog`` (what a configuration describes) as its revision number."""
    return await store.catalog_publish(PublishParams(
        revision=catalog.revision, digest=catalog.digest, content=catalog.content,
        actor=actor, role=role, reason=reason), now_us)


def serving_refusal(catalog: Catalog, published_digest: str | None) -> str | None:
    """Why a replica must not start serving ``catalog`` as current (None: it may).

    The configuration's revision must be published, and with exactly the
    content the configuration describes: otherwise a replay or repair would
    resolve "current" to definitions nobody published."""
    if published_digest is None:
        return (f"revision {catalog.revision} is not published"
                " (integrationd catalog publish)")
    if published_digest != catalog.digest:
        return (f"revision {catalog.revision} is published with digest {published_digest},"
                f" but this configuration describes {catalog.digest}: publish it under a new"
                " revision number")
    return None
