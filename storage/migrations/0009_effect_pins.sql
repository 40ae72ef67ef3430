-- Queued work cannot be retargeted (seed 8.1, 13): a command pins, at
-- admission, the RemoteLink it targets (its key, generation and remote id).
-- Commands admitted before this migration have no pins (NULL); dispatch and
-- read-back refuse them before any call (`unpinned_command`), so an upgrade
-- never sends old work to whatever the link names now; an operator's repair
-- command pins the current link.
--
-- NO_EFFECT only from proof (seed 003): each attempt records its evidence
-- (not_sent / not_applied / maybe_applied / applied) apart from its class,
-- and when the client gave up on the exchange (absence is proven only from
-- the later of the dispatch and that moment, plus the in-flight window).
-- Older attempts have NULL evidence, read conservatively.

ALTER TABLE external_commands ADD COLUMN link_key {KEY}(80) NULL;

ALTER TABLE external_commands ADD COLUMN link_generation BIGINT NULL;

ALTER TABLE external_commands ADD COLUMN remote_id {KEY}(255) NULL;

ALTER TABLE effect_attempts ADD COLUMN evidence {KEY}(32) NULL;

ALTER TABLE effect_attempts ADD COLUMN gave_up_at_us BIGINT NULL;
