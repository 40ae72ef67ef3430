-- "Find anything" (issue 23 item 2): the console's lists of attempts, commands, Runtime
-- receipts and audit entries, each newest first by its ULID (a time filter is a range
-- of that id), filtered by one column. Each index leads with the filter column and ends
-- with the id, so a filtered page is one index range read backwards, stopping at the
-- page size, however many rows the table holds (no OFFSET, no sort).
CREATE INDEX effect_attempts_find_outcome ON effect_attempts (outcome, attempt_id);

CREATE INDEX effect_attempts_find_status ON effect_attempts (response_status, attempt_id);

CREATE INDEX external_commands_find_settlement ON external_commands (settlement, command_id);

CREATE INDEX external_commands_find_operation ON external_commands (operation, command_id);

CREATE INDEX external_commands_find_binding
    ON external_commands (binding_id, principal_generation, command_id);

CREATE INDEX external_commands_find_catalog ON external_commands (catalog_revision, command_id);

CREATE INDEX external_commands_find_intent ON external_commands (intent_id);

CREATE INDEX result_receipts_find_state ON result_receipts (state, command_id);

CREATE INDEX result_receipts_find_remote ON result_receipts (remote_id);

CREATE INDEX remote_links_find_remote ON remote_links (remote_id);

CREATE INDEX audit_log_find_actor ON audit_log (actor, audit_id);

CREATE INDEX audit_log_find_action ON audit_log (action, audit_id);
