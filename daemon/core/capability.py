"""Which work this build may run (pure).

Every WorkItem records the ``engine_capability_version`` and the
``payload_schema_version`` it was written for. A replica claims only work it
can run: an item written for a newer engine, or with a payload schema newer
than its family's handler reads, is left in the queue for a replica that can
(a rolling upgrade drains it as soon as one runs). The claim statement applies
the same two bounds (``storage/work_claims.py``); :func:`hold_reason` is what
operators see on the item (``work show``, the console) when this build would
leave it.
"""

from __future__ import annotations

# The engine capability this build implements. Raise it when a change means older
# replicas must not run the work a newer one writes (and write such work with it).
ENGINE_CAPABILITY_VERSION = 1
# The payload schema a family's handler reads unless the family declares another.
DEFAULT_PAYLOAD_SCHEMA_VERSION = 1


def hold_reason(
    *,
    item_engine: int,
    item_schema: int,
    engine: int = ENGINE_CAPABILITY_VERSION,
    schema: int = DEFAULT_PAYLOAD_SCHEMA_VERSION,
) -> str | None:
    """Why a replica running ``engine`` (whose handler reads payload schema up to
    ``schema``) leaves an item written for (``item_engine``, ``item_schema``);
    ``None`` when it may run it."""
    if item_engine > engine:
        return (f"written for engine capability v{item_engine}; this build runs v{engine}:"
                " left for a replica that can run it")
    if item_schema > schema:
        return (f"payload schema v{item_schema} is newer than this build's handler reads"
                f" (v{schema}): left for a replica that can run it")
    return None


def newer_build_version(item_engine: int, engine: int = ENGINE_CAPABILITY_VERSION) -> int | None:
    """The engine capability of the newer build that wrote an item (``None``: this build
    or an older one wrote it). Terminal or not: a console page of such an item shows
    what this build knows and says the rest is the newer build's."""
    return item_engine if item_engine > engine else None
