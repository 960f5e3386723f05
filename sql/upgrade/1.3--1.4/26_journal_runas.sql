-- The move journal's rights (SEC-2, CONTRACT 15.2, docs/moves.md
-- "Rights"): each row records the role the move runs as, and recovery acts
-- with that role's rights. A row journaled by 1.3 runs as the extension's
-- owner: only the owner, superusers and sharding_admin members could write
-- the journal then, and 1.3's recovery ran as the owner (its scanner).
ALTER TABLE sharding.move_journal ADD COLUMN runas oid;
UPDATE sharding.move_journal
   SET runas = (SELECT e.extowner FROM pg_catalog.pg_extension AS e WHERE e.extname = 'sharding');
ALTER TABLE sharding.move_journal
    ALTER COLUMN runas SET DEFAULT (pg_catalog.to_regrole(pg_catalog.quote_ident(CURRENT_USER::text)))::oid,
    ALTER COLUMN runas SET NOT NULL;
-- The guard of every write of the journal (25_secrets.sql's
-- _job_role_guard now guards move_jobs only).
-- @include sharding._move_journal_guard
-- _move_journal(sql) ran any statement over the engine's own connection:
-- gone (the C symbol stays for 1.3's script).
DROP FUNCTION sharding._move_journal(text);
