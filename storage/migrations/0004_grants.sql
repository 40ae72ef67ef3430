-- AuthorizationGrant (seed 8.2): one row per principal binding generation. The secret
-- material exists only as an AEAD-sealed bundle; token_version moves on every refresh,
-- rotation, mint and key rewrap.

CREATE TABLE authorization_grants (
    binding_id {KEY}(128) NOT NULL,
    generation BIGINT NOT NULL,
    token_version BIGINT NOT NULL,
    key_id {KEY}(64) NOT NULL,
    nonce_hex {KEY}(32) NOT NULL,
    ciphertext_b64 {TEXT} NOT NULL,
    -- valid | needs_reauthorization | revoked
    state {KEY}(32) NOT NULL,
    expires_at_us BIGINT NOT NULL,
    last_refresh_at_us BIGINT NOT NULL,
    updated_at_us BIGINT NOT NULL,
    PRIMARY KEY (binding_id, generation)
) {OPTS};

CREATE INDEX authorization_grants_key ON authorization_grants (key_id);
