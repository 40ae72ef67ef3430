"""Why a grant needs re-authorization: every code has one stable sentence, no secret."""

from __future__ import annotations

import pytest

from daemon.core.grant_reasons import REASONS, GrantReason, grant_reason, refused_refresh

ROWS: list[tuple[str, bool, str | None]] = [
    # (provider error, an earlier refresh from this version never finished, code or refusal)
    ("invalid_grant", False, "invalid_grant"),
    ("invalid_grant", True, "refresh_token_possibly_spent"),
    ("invalid_jwt", False, "invalid_jwt"),
    ("invalid_jwt", True, "invalid_jwt"),  # a mint spends no refresh token
    ("invalid_client", False, None),  # not a definitive grant refusal: no reason for it
    ("", True, None),
]


@pytest.mark.parametrize(("error", "spent", "code"), ROWS)
def test_a_refused_refresh_names_its_reason(error: str, spent: bool, code: str | None) -> None:
    if code is None:
        with pytest.raises(ValueError, match="no grant reason"):
            refused_refresh(error, spent)
        return
    assert refused_refresh(error, spent) == GrantReason(code, REASONS[code])


@pytest.mark.parametrize("code", sorted(REASONS))
def test_every_reason_is_one_line_and_bounded(code: str) -> None:
    reason = grant_reason(code)
    assert reason.code == code and len(code) <= 64
    assert reason.text.isprintable() and 0 < len(reason.text) <= 500
    assert "re-authorize" in reason.text or "reinstall" in reason.text


def test_an_unknown_code_is_refused() -> None:
    with pytest.raises(ValueError, match="no grant reason 'nope'"):
        grant_reason("nope")
