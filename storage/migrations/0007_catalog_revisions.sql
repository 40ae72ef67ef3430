-- Catalog revisions as durable, immutable facts: (revision, digest, canonical
-- L1/L2 content), published by an audited command. Commands pin the digest
-- beside the revision they already carried.

CREATE TABLE catalog_revisions (
    revision BIGINT NOT NULL PRIMARY KEY,
    digest {KEY}(80) NOT NULL,
    content {TEXT} NOT NULL,
    published_by {KEY}(128) NOT NULL,
    published_at_us BIGINT NOT NULL
) {OPTS};

ALTER TABLE external_commands ADD COLUMN catalog_digest {KEY}(80) NOT NULL DEFAULT '';

-- The delete guard looks for unsettled work pinned to a revision; both columns
-- are immutable, so no state change ever touches these indexes.
CREATE INDEX external_commands_revision ON external_commands (catalog_revision);

CREATE INDEX work_items_revision ON work_items (catalog_revision);
