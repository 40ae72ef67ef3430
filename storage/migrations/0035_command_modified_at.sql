-- The provider's last-modified time of the remote record as an accepted change left it
-- (the answer named it: L1's response.updated_at), in epoch microseconds, kept on the
-- settled command itself: written by the settling UPDATE, so the accepted effect's
-- finalization costs no statement more (0033 kept it on the link, with an UPDATE of its
-- own per effect). A link's last known time is the latest one among the commands pinned
-- to its generation and remote id; the index makes that one index lookup.
-- remote_links.modified_at_us (0033) is no longer written or read. It stays, so a replica
-- of the previous version still running during a rolling upgrade keeps working; a later
-- migration may drop it.
ALTER TABLE external_commands ADD COLUMN modified_at_us BIGINT NULL;

CREATE INDEX external_commands_link_modified ON external_commands (link_key, link_generation, remote_id, modified_at_us);

-- What 0033 knew carries over: each link's time goes onto the succeeded commands pinned
-- to the same generation and remote id (the latest among them is then exactly it).
UPDATE external_commands SET modified_at_us = (
    SELECT l.modified_at_us FROM remote_links l
    WHERE l.link_key = external_commands.link_key
      AND l.generation = external_commands.link_generation
      AND l.remote_id = external_commands.remote_id)
WHERE settlement = 'succeeded' AND link_key IS NOT NULL;
