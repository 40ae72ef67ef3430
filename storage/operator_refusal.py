"""An operator action refused: a stable code, a sentence, the action to take instead.

Its own module so that the effect journal (which the operator-path reads import)
can raise it too.
"""

from __future__ import annotations

from daemon.core.operator_paths import Action, Refused
from storage.port import WorkConflict


class ActionRefused(WorkConflict):
    """An operator action the table refuses: ``code`` is stable, ``instead`` names the
    one action that leads to the receipt (or None); nothing was written."""

    def __init__(self, command_id: str, action: Action, refused: Refused,
                 detail: str = "") -> None:
        more = f" ({detail})" if detail else ""
        super().__init__(f"command {command_id}: {refused.line(action)}{more}")
        self.code = refused.code
        self.instead = refused.instead
