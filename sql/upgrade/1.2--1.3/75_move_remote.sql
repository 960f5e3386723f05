-- No PL/pgSQL on the move's path (docs/moves.md): the move's remote
-- connections are C++ over libpq (src/nodes/remote_exec.cpp) instead of
-- PL/pgSQL over contrib's dblink; _move_journal asks _dbl_open instead of
-- dblink_get_connections. The 1.2 destination filter (_move_filter,
-- _move_key_in), unused since the decoder filters at the source, is gone:
-- CASCADE drops a filter trigger an interrupted 1.2 move left behind.
DROP FUNCTION sharding._move_filter() CASCADE;
DROP FUNCTION sharding._move_key_in(jsonb, text, text, integer, integer, text, text, text);

-- The move's remote connections, in C++ (src/nodes/remote_exec.cpp): named
-- libpq connections of this session (kept across transactions, closed by
-- _dbl_disconnect, a new _dbl_connect of the name, or the session's end).
-- Every wait is interruptible; a statement running there when the caller
-- is cancelled or fails is cancelled (PQcancel) and its results consumed
-- before the error goes on (a cancelled cutover's _freeze_shard must not
-- freeze the shard after the undo thawed it). Remote errors are raised with
-- their SQLSTATE, message, detail and hint. Remote statements run with
-- search_path = pg_catalog, pg_temp (every name in them is qualified
-- anyway), and commit synchronously: a commit whose WAL waited for the WAL
-- writer would reach walsenders, and so the destination and the followers,
-- that much later, inside the cutover's refusal window. No dblink.
-- @replace sharding._dbl_connect
-- @replace sharding._dbl_disconnect
-- @include sharding._dbl_open
-- @replace sharding._dbl_value
-- @replace sharding._dbl_run

-- @include sharding._dbl_grants

DROP FUNCTION sharding._move_dblink_schema();

-- @replace sharding._move_connect

-- @replace sharding._move_journal

-- Follow's _remote and _remote_exec on the same C++ helper (no dblink).
-- Follow's remote calls, on the move's libpq helper (src/nodes/remote_exec.cpp):
-- a connection for the call, the statement in its own transaction there,
-- every wait interruptible, the remote statement cancelled when the caller
-- is; a remote error is raised with its SQLSTATE, message, detail and hint.
-- _remote: the first value of a query (NULL if no row).
-- @replace sharding._remote

-- _remote_exec: runs a command there (CREATE SUBSCRIPTION, ...); its tag.
-- @replace sharding._remote_exec


-- _move_wait_flush keeps the journal's lag_bytes current while it waits.
-- @replace sharding._move_wait_flush
