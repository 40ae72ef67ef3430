"""The kernel's storage, written once over any :class:`storage.port.Database`."""

from __future__ import annotations

from storage.command_repair import CommandRepair
from storage.commands import CommandInbox
from storage.dialect import Dialect
from storage.effects import EffectJournal
from storage.flow import FlowReads
from storage.links import RemoteLinks
from storage.port import Database
from storage.work_admin import WorkAdmin
from storage.work_claims import WorkClaims
from storage.work_rollback import WorkRollback


class WorkStore(
    WorkClaims, WorkAdmin, WorkRollback, CommandInbox, EffectJournal, RemoteLinks, CommandRepair,
    FlowReads,
):
    """Implements :class:`storage.port.WorkStorePort` for every adapter."""

    def __init__(self, db: Database, dialect: Dialect) -> None:
        self.db = db
        self.dialect = dialect
