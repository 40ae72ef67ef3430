"""Issue 21, item 2: the materializer quarantines with the reasons the docs give
(docs/inbound-flow.md "Bad bodies"), each with a sentence of ours, never an exception's
text. Before: a 100,000-digit number was ``malformed``; a lone surrogate escape was
normalized, then failed building the WorkItem as ``missing_field`` with Python's
"'utf-8' codec can't encode character..." as its detail; a NUL inside a string was
stored and applied to the Lead."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest

from config.catalog import load_catalog
from daemon.core.ingress import QUARANTINE_REASONS, QUARANTINE_SENTENCES
from daemon.services.clock import WallClock
from daemon.services.materializer import Materializer
from daemon.services.metrics import Metrics
from storage.ingress.receipts import QuarantineParams
from storage.work_store import WorkStore
from tests.support.ingress import receipt
from tests.support.webhooks import ingress_settings, prospect_body


def _with(field: bytes) -> bytes:
    return prospect_body().replace(b'"title"', field + b', "title"')


@pytest.mark.parametrize(("name", "body", "reason", "detail"), [
    ("a 100,000-digit number", _with(b'"score": ' + b"1" * 100_000), "unsupported_number",
     "the body holds a number too long to write out exactly"),
    ("a lone surrogate escape", _with(b'"note": "a\\ud800b"'), "not_utf8",
     "a string in the body holds a lone UTF-16 surrogate escape, which is not text"),
    ("a NUL inside a string", _with(b'"note": "a\\u0000b"'), "control_character",
     "a string in the body holds a NUL character (\\u0000)"),
])
@pytest.mark.parametrize("backend", ["sqlite"])  # plan() reads only the catalog
async def test_bad_bodies_are_quarantined_with_the_documented_reason(
        store: WorkStore, tmp_path: Path, name: str, body: bytes, reason: str,
        detail: str) -> None:
    cfg = ingress_settings(tmp_path)
    materializer = Materializer(max_attempts=8, store=store, catalog=load_catalog(cfg),
                                routes={r.route: r for r in cfg.webhook_routes},
                                clock=WallClock(), metrics=Metrics())
    r = attrs.evolve(receipt(1, body=body), route="outreach-main",
                     binding_id="outreach-main", webhook="outreach.prospect_events")
    plan = materializer.plan(r)
    assert plan == QuarantineParams(receipt_id=r.receipt_id, reason=reason, detail=detail)
    assert "codec" not in detail, name


def test_the_docs_name_every_quarantine_reason() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "inbound-flow.md").read_text()
    assert set(QUARANTINE_SENTENCES) == QUARANTINE_REASONS
    assert sorted(r for r in QUARANTINE_REASONS if f"`{r}`" not in docs) == []
