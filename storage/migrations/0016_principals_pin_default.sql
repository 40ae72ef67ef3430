-- Step 2 of 4 (seed 11.3): a default for writers that do not name the column. 0 is never
-- a binding generation (they start at 1), so such a command pins nothing that can be
-- current and is refused before any call. SQLite cannot change a column's default in
-- place; every writer in this build names the column, and NULL is refused the same way.

{MYSQL} ALTER TABLE external_commands ALTER COLUMN principal_generation SET DEFAULT 0;
