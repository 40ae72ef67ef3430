"""Extension points for later console pages (the effect journal's repair pages...).

Theory of operation
-------------------
The console knows WorkItems; later services own receipts, commands, effect
attempts, remote links and binding summaries (seed section 10's DLQ read:
"terminal WorkItem + immutable event or command + external effect attempts +
receipt, remote-link and binding summaries"). They plug in here without
editing the console:

* ``lineage``: async providers called for a work item's detail page and its
  JSON; each returns a :class:`LineageSection` (or ``None`` when it has
  nothing for that item). A provider's ``key`` that matches one of
  :data:`PLANNED_SECTIONS` replaces that section's placeholder: "not
  applicable" (nothing of that kind belongs to the item), or, for an item
  written by a newer build, that this console shows only what it knows.
* ``blueprints``: extra Quart blueprints (pages under ``/admin/``, JSON under
  ``/admin/api/``), mounted after the console's own.
* ``nav``: navigation entries, shown to roles allowed ``action``.
* ``actions``: extra action -> roles rows for :func:`admin_ui.auth.require`.
* ``openapi_paths``: OpenAPI path items for the extension's API routes (the
  coverage test holds every API route to the document).

Providers must never return payloads, tokens or secrets: they render as text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
from quart import Blueprint

from admin_ui.view import ReplicaView
from daemon.core.capability import newer_build_version
from daemon.core.work import WorkItem

NOT_APPLICABLE = "not applicable"


def newer_build_text(version: int) -> str:
    return f"written by a newer build (v{version}); this console shows what it knows"


PLANNED_SECTIONS: tuple[tuple[str, str], ...] = (
    ("receipts", "Ingress receipts"),
    ("commands", "External commands"),
    ("effect_attempts", "Effect attempts"),
    ("remote_links", "Remote links"),
    ("bindings", "Binding summary"),
)


@attrs.frozen
class LineageRow:
    label: str
    value: str
    href: str | None = None


@attrs.frozen
class LineageSection:
    key: str
    title: str
    rows: tuple[LineageRow, ...] = ()
    empty_text: str = "nothing recorded"


LineageProvider = Callable[[ReplicaView, WorkItem], Awaitable[LineageSection | None]]


@attrs.frozen
class NavItem:
    href: str
    label: str
    action: str = "console.read"


@attrs.define
class ConsoleExtensions:
    lineage: list[LineageProvider] = attrs.field(factory=list)
    blueprints: list[Blueprint] = attrs.field(factory=list)
    nav: list[NavItem] = attrs.field(factory=list)
    actions: dict[str, frozenset[str]] = attrs.field(factory=dict)
    openapi_paths: dict[str, dict[str, Any]] = attrs.field(factory=dict)


async def lineage_sections(
    view: ReplicaView, item: WorkItem, providers: list[LineageProvider]
) -> list[LineageSection]:
    """Every provider's section, then a placeholder for each planned one nobody provided:
    it does not apply to the item, or (an item a newer build wrote) this build may not
    know how it applies."""
    sections: list[LineageSection] = []
    for provider in providers:
        section = await provider(view, item)
        if section is not None:
            sections.append(section)
    provided = {s.key for s in sections}
    newer = newer_build_version(item.engine_capability_version)
    placeholder = NOT_APPLICABLE if newer is None else newer_build_text(newer)
    sections.extend(
        LineageSection(key, title, (), placeholder)
        for key, title in PLANNED_SECTIONS
        if key not in provided
    )
    return sections


def section_json(section: LineageSection) -> dict[str, Any]:
    return {
        "key": section.key,
        "title": section.title,
        "rows": [attrs.asdict(r) for r in section.rows],
        "empty_text": section.empty_text,
    }


def combine(*parts: ConsoleExtensions) -> ConsoleExtensions:
    """Several capabilities' extensions as one, in order (the CLI composes the console
    from them)."""
    out = ConsoleExtensions()
    for part in parts:
        out.lineage.extend(part.lineage)
        out.blueprints.extend(part.blueprints)
        out.nav.extend(part.nav)
        out.actions.update(part.actions)
        out.openapi_paths.update(part.openapi_paths)
    return out
