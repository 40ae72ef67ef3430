-- Newest-first pages filtered by org or by family alone (issue 12): (org_id, state,
-- work_id) orders by work_id only within one state, so an org's page sorted the org's
-- whole history (p95 442 ms at 9M items); a family alone had no index at all. Both
-- columns are immutable: a state change never touches these indexes.
CREATE INDEX work_items_org_recent ON work_items (org_id, work_id);

CREATE INDEX work_items_family_recent ON work_items (family, work_id);
