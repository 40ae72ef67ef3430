"""The kernel's storage, written once over any :class:`storage.port.Database`."""

from __future__ import annotations

from storage.binding_flows import BindingFlows
from storage.catalog_revisions import CatalogRevisions
from storage.command_operator import CommandOperator
from storage.command_repair import CommandRepair
from storage.commands import CommandInbox
from storage.cutover.legacy import LegacyOutcomes
from storage.cutover.steps import CutoverSteps
from storage.dialect import Dialect
from storage.effects import EffectJournal
from storage.flow import FlowReads
from storage.grants import AuthorizationGrants
from storage.history import HistoryStore
from storage.history_flow import HistoryFlowStore
from storage.history_pressure import HistoryPressureStore
from storage.history_quota import HistoryQuotaStore
from storage.ingress.receipts import IngressReceipts
from storage.links import RemoteLinks
from storage.port import Database
from storage.principals import PrincipalBindings
from storage.quota import QuotaLedger
from storage.refresh_leases import RefreshLeases
from storage.retention.prune import RetentionStore
from storage.work_admin import WorkAdmin
from storage.work_claims import WorkClaims
from storage.work_executions import WorkExecutions
from storage.work_rollback import WorkRollback


class WorkStore(
    WorkClaims, WorkAdmin, WorkExecutions, WorkRollback, CommandInbox, EffectJournal,
    RemoteLinks, CommandRepair, CommandOperator, QuotaLedger, AuthorizationGrants,
    PrincipalBindings,
    RefreshLeases, CatalogRevisions, FlowReads, CutoverSteps, LegacyOutcomes,
    IngressReceipts, RetentionStore, BindingFlows, HistoryStore, HistoryFlowStore,
    HistoryQuotaStore, HistoryPressureStore,
):
    """Implements :class:`storage.port.WorkStorePort` for every adapter."""

    def __init__(self, db: Database, dialect: Dialect) -> None:
        self.db = db
        self.dialect = dialect
