"""The kernel's storage, written once over any :class:`storage.port.Database`."""

from __future__ import annotations

from storage.dialect import Dialect
from storage.port import Database
from storage.work_admin import WorkAdmin
from storage.work_claims import WorkClaims
from storage.work_rollback import WorkRollback


class WorkStore(WorkClaims, WorkAdmin, WorkRollback):
    """Implements :class:`storage.port.WorkStorePort` for every adapter."""

    def __init__(self, db: Database, dialect: Dialect) -> None:
        self.db = db
        self.dialect = dialect
