-- Observed RemoteSubscription state (seed 9; daemon/services/subscriptions.py): one row
-- per desired subscription (a webhook route and an action), owned by the subscription
-- reconciler. provider_id is the provider's subscription id; generation moves with every
-- subscription created for the row (a delete is fenced by it); secret_generation is the
-- route secret's the current subscription was created with. health: active | disabled |
-- missing. The cleanup token the provider hands out at creation is sealed with the token
-- key (daemon/core/token_bundle.py: AES-GCM, key id beside it, the row's name and
-- generation authenticated with it), never stored in the clear. retiring: JSON list of
-- the subscriptions kept until their successor is proven (a rotation's or a replacement's
-- old one), each with its sealed cleanup token. rotated_at_us: when the rotation's new
-- subscription was created (a receipt verified with the newest secret after it proves the
-- provider uses it). Compare-and-swap by row_version.

CREATE TABLE remote_subscriptions (
    name {KEY}(200) NOT NULL PRIMARY KEY,
    binding_id {KEY}(128) NOT NULL,
    route {KEY}(64) NOT NULL,
    resource {KEY}(64) NOT NULL,
    action {KEY}(64) NOT NULL,
    url {TEXT} NOT NULL,
    payload_version INTEGER NOT NULL,
    provider_id {KEY}(128) NOT NULL,
    generation BIGINT NOT NULL,
    secret_generation BIGINT NOT NULL,
    health {KEY}(16) NOT NULL,
    cleanup_key_id {KEY}(64) NULL,
    cleanup_token {TEXT} NULL,
    retiring {TEXT} NOT NULL,
    rotating INTEGER NOT NULL,
    rotated_at_us BIGINT NULL,
    last_reconciled_at_us BIGINT NULL,
    last_outcome {KEY}(32) NULL,
    last_reason {TEXT} NULL,
    row_version BIGINT NOT NULL,
    updated_at_us BIGINT NOT NULL
) {OPTS};

CREATE INDEX remote_subscriptions_binding ON remote_subscriptions (binding_id);

CREATE INDEX ingress_receipts_route_received ON ingress_receipts (route, received_at_us);
