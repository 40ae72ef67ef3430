-- The console at a year of production (issue 12, bench/bigtables.py).
--
-- The DLQ's class counts read the newest dead items' (family, failure class): with
-- (state, work_id) alone the engine preferred work_items_dead_class and sorted every dead
-- item (at 800,000 dead items, seconds). The same index carrying family and failure
-- class serves the ordered read from the index alone, and replaces (state, work_id) for
-- every listing by state, newest first (same prefix), and the retention scans.
CREATE INDEX work_items_state_recent ON work_items (state, work_id, family, failure_class);

DROP INDEX work_items_state_id ON work_items;
