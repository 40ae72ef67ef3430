-- Refresh ownership (seed 8.2): one row per binding generation. While a refresh is in
-- flight it holds the owner's lease token, the token version it refreshes from and when it
-- started; the activation clears it in the same transaction that installs the next version.

CREATE TABLE refresh_leases (
    binding_id {KEY}(128) NOT NULL,
    generation BIGINT NOT NULL,
    lease_token {KEY}(32) NULL,
    owner_work_id {KEY}(32) NULL,
    owner_epoch BIGINT NULL,
    until_us BIGINT NOT NULL,
    from_version BIGINT NOT NULL,
    started_at_us BIGINT NOT NULL,
    refreshes_total BIGINT NOT NULL,
    PRIMARY KEY (binding_id, generation)
) {OPTS};
