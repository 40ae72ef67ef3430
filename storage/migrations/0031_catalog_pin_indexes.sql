-- Catalog list and delete ask whether unsettled work is pinned to a revision (issue 12:
-- they counted every command and WorkItem of the revision, a scan of millions of rows
-- for an old one). (catalog_revision, settlement) and (catalog_revision, state) serve
-- "open commands of this revision" and "live WorkItems of this revision" (an IN list of
-- the live states) as ranges that skip the settled and terminal history; they replace
-- the single-column indexes of 0007, their prefixes.
CREATE INDEX external_commands_revision_settlement ON external_commands (catalog_revision, settlement);

CREATE INDEX work_items_revision_state ON work_items (catalog_revision, state);

DROP INDEX external_commands_revision ON external_commands;

DROP INDEX work_items_revision ON work_items;
