"""Why an AuthorizationGrant needs re-authorization, as data (seed 8.2).

Every transition of a grant into ``needs_reauthorization`` writes one of these reasons on
the grant row (a stable code and its sentence, never a secret and never a provider's
free text), so the console, the admin JSON API and ``integrationd binding show`` say
*why* long after the work item that found it and the log line are gone. A new token
version (a refresh, a new grant of the generation) clears it.

===============================  ==========================================================
code                             when
===============================  ==========================================================
``invalid_grant``                the token endpoint refused the refresh token
                                 (``invalid_grant``) on the one attempt
``invalid_jwt``                  the mint endpoint refused the app's JWT (S2S)
``refresh_token_possibly_spent`` the token endpoint refused the refresh token after an
                                 earlier owner's refresh from the same version never
                                 finished (it may have spent the token)
``refresh_in_doubt``             an owner's refresh call left and no answer was activated
                                 (it is frozen, slow, or died): nobody presents that
                                 refresh token again; the owner's late answer heals the
                                 grant (so does its word that it never sent: valid at
                                 the same version), and if its process died the binding
                                 needs re-authorization (effects wait, they do not fail)
``no_refresh_token``             the access token expired (or was refused) and the grant
                                 holds no refresh token
===============================  ==========================================================
"""

from __future__ import annotations

import attrs

REASONS: dict[str, str] = {
    "invalid_grant": "the token endpoint refused the refresh token (invalid_grant):"
                     " re-authorize the binding",
    "invalid_jwt": "the token endpoint refused the app's signed JWT (invalid_jwt): check"
                   " the app's key and reinstall",
    "refresh_token_possibly_spent": "the token endpoint refused the refresh token,"
                                    " possibly spent by an unfinished refresh of an earlier"
                                    " owner: re-authorize the binding",
    "refresh_in_doubt": "a refresh of this token was sent and never finished, so the"
                        " refresh token is possibly spent by an unfinished refresh: it"
                        " heals if that refresh's answer arrives, else re-authorize the"
                        " binding",
    "no_refresh_token": "the access token expired and the grant has no refresh token:"
                        " re-authorize the binding",
}


# The in-doubt reason: a refresh call left and was never activated. Work waits on it (a
# retry, never a failure): the unfinished owner's late answer may still heal the grant.
IN_DOUBT = "refresh_in_doubt"


@attrs.frozen
class GrantReason:
    code: str
    text: str


def grant_reason(code: str) -> GrantReason:
    """The reason named ``code``; an unknown code is a programming error."""
    try:
        return GrantReason(code, REASONS[code])
    except KeyError:
        raise ValueError(f"no grant reason {code!r}") from None


def refused_refresh(provider_error: str, possibly_spent: bool) -> GrantReason:
    """Why the token endpoint's definitive refusal needs re-authorization."""
    if possibly_spent and provider_error == "invalid_grant":
        return grant_reason("refresh_token_possibly_spent")
    return grant_reason(provider_error)


def unusable_code(state: str, reason_code: str | None) -> str:
    """The stable code a caller is refused with for a grant that is not valid: its state,
    except an in-doubt refresh, which has its own (work waits for it, never fails)."""
    if state == "needs_reauthorization" and reason_code == IN_DOUBT:
        return IN_DOUBT
    return state
