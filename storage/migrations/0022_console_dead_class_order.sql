-- The DLQ filtered by failure class, newest first, at a year of production (issue 12):
-- (state, failure_class, family, work_id) gives work_id order only when the family is
-- fixed too, so a class-only page sorted every dead item of the class (5 s at 800,000
-- dead items). (state, failure_class, work_id, family) reads a class newest first and
-- stops at the page; with a family as well, the family is filtered inside the index.
CREATE INDEX work_items_dead_class_recent ON work_items (state, failure_class, work_id, family);

DROP INDEX work_items_dead_class ON work_items;
