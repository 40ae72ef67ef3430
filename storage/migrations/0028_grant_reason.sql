-- Why a grant needs re-authorization (or why it was refused), durable on the grant row:
-- a stable code (daemon/core/grant_reasons.py) and its one-line sentence, never a secret.
-- Written by every transition into needs_reauthorization (the token endpoint refused
-- the grant, a refresh token possibly spent by an unfinished refresh, no refresh token,
-- a bundle that failed authentication); cleared when a new token version is installed.
-- Nullable, no default: rows from before this migration (and every valid grant) hold
-- none, and a replica of the previous build, which never names these columns, keeps
-- working beside this one.

ALTER TABLE authorization_grants ADD COLUMN reason_code {KEY}(64) NULL;
ALTER TABLE authorization_grants ADD COLUMN reason_text {TEXT} NULL;
