-- The Runtime's connect flows (/v1/bindings/...): one row per (runtime, idempotency key),
-- written in the transaction that applied the flow, so a retried request is answered
-- from here and never applied twice. request_digest is the SHA-256 of the canonical
-- request (a retry with another body under the same key is refused); response_json
-- holds no secret (binding facts and the token version only).

CREATE TABLE binding_flow_requests (
    runtime_name {KEY}(128) NOT NULL,
    idempotency_key {KEY}(255) NOT NULL,
    request_digest {KEY}(80) NOT NULL,
    binding_id {KEY}(128) NOT NULL,
    flow {KEY}(32) NOT NULL,
    response_json {TEXT} NOT NULL,
    created_at_us BIGINT NOT NULL,
    PRIMARY KEY (runtime_name, idempotency_key)
) {OPTS};
