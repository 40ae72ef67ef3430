-- The quota key a held item waits on (issue 23: the Quota page and the quota gauges at
-- 1M open rows). The per-key waiting count read every held item's operator summary
-- (50,000 rows, 1.6 s) to parse the key out of it ("quota key K has no send slot ...",
-- daemon/services/effect_quota.py's waiting_summary). This column is that key, computed
-- by the database from the row itself (VIRTUAL: nothing is written for it, and no writer
-- can forget it), NULL unless the item is pending on quota_wait; its index makes a key's
-- count an index range of that key's held items alone. Not a queue authority: it is the
-- row's own state and summary, read another way. (A key over 255 characters is left
-- NULL rather than failing the item's write: quota keys are at most 255.)
ALTER TABLE work_items ADD COLUMN quota_wait_key {KEY}(255) GENERATED ALWAYS AS (CASE WHEN state = 'pending' AND failure_class = 'quota_wait' AND operator_summary LIKE 'quota key % has no send slot%' AND INSTR(operator_summary, ' has no send slot') BETWEEN 12 AND 266 THEN SUBSTR(operator_summary, 11, INSTR(operator_summary, ' has no send slot') - 11) END) VIRTUAL;
-- Ending with the work id: a key's oldest held items are read in index order (SQLite's
-- entries end with the rowid, not the primary key, so it sorted them without it).
CREATE INDEX work_items_quota_wait ON work_items (quota_wait_key, work_id);
