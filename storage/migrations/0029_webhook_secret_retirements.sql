-- A rotated-out webhook secret's retirement (daemon/core/secret_retirement.py; the
-- subscription reconciler decides it, the ingress verifier obeys it): one row per route
-- and secret generation, about that generation's *previous* secret. state: watching
-- (every subscription of the route is listed active under the new secret and none of the
-- old is left; retired once no delivery verified with the previous secret arrived for
-- the provider's redelivery window since watch_since_us) | retired (the verifier no
-- longer accepts it, on every replica, after restarts too, whatever the TOML's
-- previous_secret says). evidence: JSON of what the decision saw (never a secret).
-- Compare-and-swap by row_version.

CREATE TABLE webhook_secret_retirements (
    route {KEY}(64) NOT NULL,
    secret_generation BIGINT NOT NULL,
    state {KEY}(16) NOT NULL,
    watch_since_us BIGINT NOT NULL,
    check_at_us BIGINT NOT NULL,
    retired_at_us BIGINT NULL,
    evidence {TEXT} NOT NULL,
    row_version BIGINT NOT NULL,
    updated_at_us BIGINT NOT NULL,
    PRIMARY KEY (route, secret_generation)
) {OPTS};

-- When a copy of the receipt's delivery verified with an older secret than the route's
-- newest last arrived (NULL: none did). Kept on duplicates too: during a rotation the old
-- and the new subscription deliver the same event, and the receipt's verification keeps
-- the newest secret's index, so without this an old-secret copy would leave no trace.
ALTER TABLE ingress_receipts ADD COLUMN previous_secret_at_us BIGINT NULL;
