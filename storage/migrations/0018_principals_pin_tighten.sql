-- Step 4 of 4 (seed 11.3): tighten. Every command now pins a durable generation: NOT NULL
-- from here on. SQLite cannot add NOT NULL to an existing column without rebuilding the
-- table (which would race every other column added beside it), so there the rule is the
-- code's: every writer names the column, and a NULL is refused before any call.

{MYSQL} ALTER TABLE external_commands MODIFY principal_generation BIGINT NOT NULL DEFAULT 0;
