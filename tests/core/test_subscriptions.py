"""RemoteSubscription reconciliation's decisions, table-driven, negative rows included."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from daemon.core.subscriptions import (
    Create,
    Delete,
    Desired,
    Health,
    Observed,
    Remote,
    decide,
    delete_allowed,
)

URL = "https://hooks.example/hooks/outreach"
D = Desired(name="prospects", resource="prospect", action="*", payload_version=2, url=URL,
            secret_generation=1)
OBS = Observed(name="prospects", provider_id="11", generation=3, secret_generation=1,
             resource="prospect", action="*", url=URL, payload_version=2)
R = Remote(provider_id="11", resource="prospect", action="*", url=URL, payload_version=2)
OURS = frozenset({URL})

ROWS: list[tuple[str, dict[str, Any], tuple[Any, ...]]] = [
    ("in sync: nothing", {}, ()),
    ("never created", {"observed": [], "remote": []}, (Create("prospects", 1, "missing"),)),
    ("reinstalled: the old installation's subscription is an orphan",
     {"observed": []}, (Create("prospects", 1, "missing"), Delete("11", None, None, "orphan"))),
    ("deleted behind our back: recreated under the next generation", {"remote": []},
     (Create("prospects", 4, "deleted_behind_our_back"),)),
    ("disabled by the provider: reported, not recreated",
     {"remote": [attrs.evolve(R, active=False)]}, (Health("prospects", False),)),
    ("shape drifted: replaced", {"remote": [attrs.evolve(R, payload_version=1)]},
     (Create("prospects", 4, "drifted"),)),
    ("secret rotation: a new one beside the old",
     {"desired": [attrs.evolve(D, secret_generation=2)]},
     (Create("prospects", 4, "secret_rotation"),)),
    ("rotation overlap: the old one stays until the new secret is seen",
     {"observed": [attrs.evolve(OBS, provider_id="12", retiring=("11",), rotating=True)],
      "remote": [R, attrs.evolve(R, provider_id="12")]}, ()),
    ("rotation proven: the old one goes",
     {"observed": [attrs.evolve(OBS, provider_id="12", retiring=("11",), rotating=True)],
      "remote": [R, attrs.evolve(R, provider_id="12")], "seen": {"prospects"}},
     (Delete("11", "prospects", 3, "rotated"),)),
    ("replacement active: the old one goes",
     {"observed": [attrs.evolve(OBS, provider_id="12", retiring=("11",))],
      "remote": [R, attrs.evolve(R, provider_id="12")]},
     (Delete("11", "prospects", 3, "replaced"),)),
    ("replacement not active yet: the old one stays",
     {"observed": [attrs.evolve(OBS, provider_id="12", retiring=("11",))],
      "remote": [R, attrs.evolve(R, provider_id="12", active=False)]},
     (Health("prospects", False),)),
    ("orphan on our route: deleted, fenced on no row",
     {"remote": [R, attrs.evolve(R, provider_id="99")]}, (Delete("99", None, None, "orphan"),)),
    ("someone else's subscription: left alone",
     {"remote": [R, attrs.evolve(R, provider_id="99", url="https://other.example/x")]}, ()),
    ("no longer desired: deleted",
     {"desired": []}, (Delete("11", "prospects", 3, "undesired"),)),
    ("no longer desired and already gone: nothing", {"desired": [], "remote": []}, ()),
]


@pytest.mark.parametrize(("name", "case", "expected"), ROWS, ids=[r[0] for r in ROWS])
def test_decide(name: str, case: dict[str, Any], expected: tuple[Any, ...]) -> None:
    steps = decide(case.get("desired", [D]), case.get("observed", [OBS]),
                   case.get("remote", [R]), our_urls=OURS,
                   new_secret_seen=case.get("seen", set()))
    assert steps == expected


def test_a_delete_is_fenced_by_the_generation_it_was_decided_under() -> None:
    step = Delete("11", "prospects", 3, "replaced")
    assert delete_allowed(step, 3)
    assert not delete_allowed(step, 4)  # a reinstall moved the row on: refused
    orphan = Delete("99", None, None, "orphan")
    assert delete_allowed(orphan, None) and not delete_allowed(orphan, 1)
