-- Commands pin the durable PrincipalBinding generation (seed 8.1, 11.3), step 1 of 4:
-- the column arrives nullable. Until now a command pinned the [[bindings]] TOML integer
-- (binding_generation, kept and still written with the same value); from this build on,
-- admission reads principal_bindings and pins its generation here. A command whose
-- principal_generation is NULL is refused before any call (`unpinned_binding`): nothing
-- queued is ever dispatched under a generation nobody pinned.

ALTER TABLE external_commands ADD COLUMN principal_generation BIGINT NULL;
