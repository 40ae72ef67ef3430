"""Structured logs: one JSON object per line on stderr (journald keeps them).

Every record has a stable ``event`` name and ids; callers never pass payload
bodies, tokens or signatures. Values whose type hides its secret (``Secret``)
render as their redacted ``repr``.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

LOGGER_NAME = "integrationd"


class JsonLineFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                plain = isinstance(value, str | int | float | bool | None)
                doc[key] = value if plain else repr(value)
        if record.exc_info and record.levelno >= logging.ERROR:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, separators=(",", ":"))


def configure(level: str = "INFO") -> None:
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(h.formatter, JsonLineFormatter) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(JsonLineFormatter())
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


_log = logging.getLogger(LOGGER_NAME)


def event(name: str, level: int = logging.INFO, **fields: Any) -> None:
    """Log one structured event."""
    if _log.isEnabledFor(level):
        _log.log(level, name, extra={"fields": fields})


def debug(name: str, **fields: Any) -> None:
    """A routine success: DEBUG (the replica's ``activity`` line counts them at INFO)."""
    event(name, logging.DEBUG, **fields)


def warn(name: str, **fields: Any) -> None:
    event(name, logging.WARNING, **fields)


def error(name: str, **fields: Any) -> None:
    event(name, logging.ERROR, **fields)
