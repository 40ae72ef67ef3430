-- The execution journal shows every execution: a lease that expired unfinished is
-- journaled as outcome 'lease_lost' when it is reclaimed, naming the reclaiming
-- replica. The audit log records where an operator action came from (for the CLI:
-- the OS user, and SUDO_USER, beside --actor), as JSON text.

ALTER TABLE work_executions ADD COLUMN reclaimed_by {KEY}(128) NULL;

ALTER TABLE audit_log ADD COLUMN origin_json {TEXT} NULL;
