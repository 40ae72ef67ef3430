"""What differs between SQL backends, kept as small as it can be.

Statements are portable (see ``docs/architecture.md``); only DDL types, table
options and catalog lookups differ, and they are rendered here.
"""

from __future__ import annotations

import re

import attrs

_KEY = re.compile(r"\{KEY\}\((\d+)\)")
_ONLY = re.compile(r"\{(MYSQL|SQLITE)\}")
# ``DROP INDEX name ON table``: MySQL-family engines need the table, SQLite refuses it.
_DROP_INDEX = re.compile(r"^DROP INDEX (\w+) ON \w+$", re.IGNORECASE)


@attrs.frozen
class Dialect:
    name: str
    key_type: str  # format with the length
    text_type: str
    table_options: str
    table_exists_sql: str
    drop_index_names_table: bool = True

    def render_ddl(self, script: str) -> list[str]:
        """Split a migration script into statements with the macros expanded."""
        body = "\n".join(
            line for line in script.splitlines() if not line.lstrip().startswith("--")
        )
        body = _KEY.sub(lambda m: self.key_type.format(n=m.group(1)), body)
        body = body.replace("{TEXT}", self.text_type).replace("{OPTS}", self.table_options)
        out = []
        for stmt in (s.strip() for s in body.split(";")):
            # A statement may be one backend's only ({MYSQL} or {SQLITE} first): what
            # SQLite cannot do in place (ALTER COLUMN), it does not do.
            only = _ONLY.match(stmt)
            if only is not None:
                if only.group(1).lower() != self.name:
                    continue
                stmt = stmt[only.end():].strip()
            if stmt:
                out.append(stmt)
        if not self.drop_index_names_table:
            out = [_DROP_INDEX.sub(r"DROP INDEX \1", s) for s in out]
        return out


SQLITE = Dialect(
    name="sqlite",
    key_type="TEXT",
    text_type="TEXT",
    table_options="",
    table_exists_sql="SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?",
    drop_index_names_table=False,
)

MYSQL = Dialect(
    name="mysql",
    key_type="VARCHAR({n}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
    text_type="MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin",
    table_options="ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin",
    table_exists_sql=(
        "SELECT table_name FROM information_schema.tables"
        " WHERE table_schema = DATABASE() AND table_name = ?"
    ),
)
