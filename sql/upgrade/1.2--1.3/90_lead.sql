
-- _dbl_run cancels the remote statement when it is cancelled itself (a
-- cancelled move's _freeze_shard no longer freezes the shard after the
-- undo thawed it).
-- @replace sharding._dbl_run
