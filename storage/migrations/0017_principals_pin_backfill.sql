-- Step 3 of 4 (seed 11.3): backfill the commands admitted before step 1. They pinned the
-- [[bindings]] TOML generation; a binding's durable row is bootstrapped from that same
-- TOML generation when it does not exist yet (docs/quota-and-credentials.md), so copying
-- the pin keeps such work current exactly while the binding has not moved since. A
-- binding that an operator already connected, reconnected or changed through
-- `integrationd binding` may be at another generation: its old work is then refused
-- before any call (binding_generation), never sent under the new identity.

UPDATE external_commands SET principal_generation = binding_generation
 WHERE principal_generation IS NULL;
