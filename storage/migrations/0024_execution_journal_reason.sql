-- A deferral (work given back unstarted until a known time, e.g. the next free
-- provider quota slot) is journaled as an execution with outcome 'deferred'; its
-- reason ('quota_wait') says why. Other executions carry their failure class here
-- (NULL when there is none).

ALTER TABLE work_executions ADD COLUMN reason {KEY}(64) NULL;
