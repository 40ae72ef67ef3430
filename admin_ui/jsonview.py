"""Show a JSON value on a page: pretty-printed, with work ids as links.

:func:`json_tokens` pretty-prints a value (sorted keys, two-space indent,
non-ASCII kept) and cuts the text into pieces: plain text, every string
that is a work id (a ULID), which the ``json_block`` macro renders as a link
to that item, and every microsecond value (a key ending in ``_us``), which
keeps its exact digits and reads as people read it on hover (a moment as UTC
wall time, a span as ``10 s``). Jinja escapes every piece, so a value can never
inject markup.
"""

from __future__ import annotations

import json
import re
from typing import Any

from daemon.core.human_time import span_text, wall_text
from daemon.core.ids import is_ulid

_PIECE = re.compile(r'"([0-9A-HJKMNP-TV-Z]{26})"|"[A-Za-z0-9_]*_us": (\d+)')
# A microsecond value this large is a moment (after 2001-09-09), smaller ones are spans.
_EPOCH_FROM_US = 10**15


def _reading(us: int) -> str:
    if us >= _EPOCH_FROM_US:
        return wall_text(us)
    return span_text(us / 1_000_000) if us >= 1_000_000 else f"{us / 1000:g} ms"


def json_tokens(value: Any) -> list[dict[str, str | None]]:
    """``[{"text": ..., "work_id": id-or-None, "title": reading-or-None}, ...]`` that
    join to the pretty JSON."""
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    tokens: list[dict[str, str | None]] = []
    at = 0
    for found in _PIECE.finditer(text):
        work_id, micros = found.group(1), found.group(2)
        if work_id is not None and not is_ulid(work_id):
            continue
        group = 1 if work_id is not None else 2
        tokens.append({"text": text[at:found.start(group)], "work_id": None, "title": None})
        tokens.append({"text": found.group(group), "work_id": work_id,
                       "title": None if micros is None else _reading(int(micros))})
        at = found.end(group)
    tokens.append({"text": text[at:], "work_id": None, "title": None})
    return [t for t in tokens if t["text"]]
