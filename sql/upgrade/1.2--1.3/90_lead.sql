
-- _dbl_run cancels the remote statement when it is cancelled itself (a
-- cancelled move's _freeze_shard no longer freezes the shard after the
-- undo thawed it).
CREATE OR REPLACE FUNCTION sharding._dbl_run(conn text, sql text) RETURNS text
    LANGUAGE plpgsql VOLATILE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    s name := sharding._move_dblink_schema();
    busy integer;
    tag text;
    last_tag text;
    sleep float8 := 0.0005;
BEGIN
    EXECUTE pg_catalog.format('SELECT %I.dblink_send_query($1, $2)', s) USING conn, sql;
    BEGIN
        LOOP
            EXECUTE pg_catalog.format('SELECT %I.dblink_is_busy($1)', s) INTO busy USING conn;
            EXIT WHEN busy = 0;
            PERFORM pg_catalog.pg_sleep(sleep);
            sleep := LEAST(sleep * 2, 0.02);
        END LOOP;
    EXCEPTION WHEN query_canceled THEN
        -- Cancelled here: the remote statement is cancelled too, and its
        -- results are consumed, before the cancel goes on. Otherwise it
        -- would run on (a _freeze_shard waiting for the shard's writers
        -- would freeze the shard after the move's undo had thawed it) and
        -- the connection would stay busy for the undo's own calls.
        EXECUTE pg_catalog.format('SELECT %I.dblink_cancel_query($1)', s) USING conn;
        LOOP
            EXECUTE pg_catalog.format('SELECT pg_catalog.count(*) FROM %I.dblink_get_result($1, false) AS t(v text)', s)
                INTO busy USING conn;
            EXIT WHEN busy = 0;
        END LOOP;
        RAISE;
    END;
    -- One result per statement, then an empty one.
    LOOP
        EXECUTE pg_catalog.format('SELECT pg_catalog.count(*), pg_catalog.max(t.v) FROM %I.dblink_get_result($1) AS t(v text)', s)
            INTO busy, tag USING conn;
        EXIT WHEN busy = 0;
        last_tag := tag;
    END LOOP;
    RETURN last_tag;
END $$;
