"""bench.admin_ui's reading of an answer: the search box's single hit is a redirect to
that hit's page, a timed answer, not an error; every other non-200 is an error."""

from __future__ import annotations

import httpx
import pytest

from bench.admin_ui import answered


@pytest.mark.parametrize(("status", "location", "redirect_ok", "expected"), [
    (200, None, False, True),
    (200, None, True, True),
    (302, "/admin/effects/attempts/01ABC", True, True),
    (303, "/admin/work/01ABC", True, True),
    # negative rows
    (302, "/admin/effects/attempts/01ABC", False, False),  # not a search target
    (302, "/admin/sign-in?next=/admin/find", True, False),  # signed out
    (302, "https://elsewhere.example/admin/", True, False),  # off the console
    (301, "/admin/work/01ABC", True, False),
    (404, None, True, False),
    (500, None, True, False),
])
def test_which_answers_are_the_pages(status: int, location: str | None, redirect_ok: bool,
                                     expected: bool) -> None:
    headers = {"location": location} if location else {}
    response = httpx.Response(status, headers=headers)
    assert answered(response, redirect_ok=redirect_ok) is expected
