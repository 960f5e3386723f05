-- Moves in flight on one host share its CPUs' worth of copy and delete
-- sessions: each end's host and CPUs, as the node says (_move_host), in
-- the move's journal row.
-- @include sharding._move_host
ALTER TABLE sharding.move_journal
    ADD COLUMN source_host text,
    ADD COLUMN source_cpus integer,
    ADD COLUMN destination_host text,
    ADD COLUMN destination_cpus integer;
