-- move_progress.time_left from the copy's measured rate (issue 38,
-- docs/rebalance.md): the journal notes the rows a copy is expected
-- to send and when it started.
ALTER TABLE sharding.move_journal
    ADD COLUMN rows_expected bigint,
    ADD COLUMN copy_started timestamptz;

-- @replace sharding.move_progress
