"""Show a JSON value on a page: pretty-printed, with work ids as links.

:func:`json_tokens` pretty-prints a value (sorted keys, two-space indent,
non-ASCII kept) and cuts the text into pieces: plain text, and every string
that is a work id (a ULID), which the ``json_block`` macro renders as a link
to that item. Jinja escapes every piece, so a value can never inject markup.
"""

from __future__ import annotations

import json
import re
from typing import Any

from daemon.core.ids import is_ulid

_QUOTED_ID = re.compile(r'"([0-9A-HJKMNP-TV-Z]{26})"')


def json_tokens(value: Any) -> list[dict[str, str | None]]:
    """``[{"text": ..., "work_id": id-or-None}, ...]`` that join to the pretty JSON."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    tokens: list[dict[str, str | None]] = []
    at = 0
    for found in _QUOTED_ID.finditer(text):
        work_id = found.group(1)
        if not is_ulid(work_id):
            continue
        tokens.append({"text": text[at:found.start(1)], "work_id": None})
        tokens.append({"text": work_id, "work_id": work_id})
        at = found.end(1)
    tokens.append({"text": text[at:], "work_id": None})
    return [t for t in tokens if t["text"]]
