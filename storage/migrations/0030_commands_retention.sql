-- Retention prunes settled external commands (issue 12): its keyset scan walks each
-- settlement's (updated_at_us, command_id) range, which this index serves on every
-- engine. The handoff quarantine's scan walks its primary key (a ULID of its time).
CREATE INDEX external_commands_retention ON external_commands (settlement, updated_at_us, command_id);
