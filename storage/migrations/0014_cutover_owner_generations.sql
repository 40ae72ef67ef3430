-- Ownership cutover between claimants (seed 11): one owner generation per work family,
-- the durable receipts that move it, the legacy owner's outcome receipts for
-- rollback-fenced WorkItems, and the heartbeats of every claim-capable process.
--
-- owner_generations: the one row the claim statement reads (by primary key) to learn
-- whether integrationd may claim the family now. No row: the family never had another
-- claimant. `claimant` is who may claim: integrationd | legacy | none.
CREATE TABLE owner_generations (
    family {KEY}(64) NOT NULL PRIMARY KEY,
    generation BIGINT NOT NULL,
    phase {KEY}(32) NOT NULL,
    claimant {KEY}(32) NOT NULL,
    receipt_id {KEY}(32) NULL,
    admission_closed_at_us BIGINT NULL,
    row_version BIGINT NOT NULL,
    updated_at_us BIGINT NOT NULL
) {OPTS};

-- One receipt per generation: the proof that admitted its owner.
CREATE TABLE cutover_receipts (
    receipt_id {KEY}(32) NOT NULL PRIMARY KEY,
    family {KEY}(64) NOT NULL,
    generation BIGINT NOT NULL,
    owner {KEY}(32) NOT NULL,
    kind {KEY}(32) NOT NULL,
    claim_schema_version INTEGER NOT NULL,
    proof_json {TEXT} NOT NULL,
    fence_id {KEY}(64) NULL,
    fenced_count INTEGER NOT NULL,
    fenced_digest {KEY}(80) NULL,
    actor {KEY}(128) NOT NULL,
    created_at_us BIGINT NOT NULL
) {OPTS};

CREATE UNIQUE INDEX cutover_receipts_generation ON cutover_receipts (family, generation);

CREATE INDEX cutover_receipts_fence ON cutover_receipts (fence_id);

-- Written by the legacy owner atomically with its terminal transition of a fenced item;
-- projected onto the WorkItem by the projector (projection: reconciled | duplicate |
-- conflict), NULL until then.
CREATE TABLE legacy_outcome_receipts (
    receipt_id {KEY}(32) NOT NULL PRIMARY KEY,
    work_id {KEY}(32) NOT NULL,
    fence_id {KEY}(64) NOT NULL,
    version INTEGER NOT NULL,
    digest {KEY}(80) NOT NULL,
    outcome {KEY}(32) NOT NULL,
    written_at_us BIGINT NOT NULL,
    projection {KEY}(32) NULL,
    projected_at_us BIGINT NULL
) {OPTS};

CREATE UNIQUE INDEX legacy_outcome_receipts_identity
    ON legacy_outcome_receipts (work_id, fence_id, version, digest);

CREATE INDEX legacy_outcome_receipts_unprojected
    ON legacy_outcome_receipts (projected_at_us, receipt_id);

CREATE INDEX legacy_outcome_receipts_fence ON legacy_outcome_receipts (fence_id, projection);

-- Claim-capable processes of either owner: a process counts as live until its row says
-- `stopped` (it said so itself) or `gone` (an operator proved it).
CREATE TABLE claimant_processes (
    process_id {KEY}(128) NOT NULL PRIMARY KEY,
    owner {KEY}(32) NOT NULL,
    family {KEY}(64) NOT NULL,
    generation_seen BIGINT NOT NULL,
    state {KEY}(32) NOT NULL,
    heartbeat_at_us BIGINT NOT NULL
) {OPTS};

CREATE INDEX claimant_processes_family ON claimant_processes (family, owner, state);

CREATE INDEX work_items_fence ON work_items (rollback_execution_fence_id, state);
