-- queue3 (issue 27): sharding.enqueue writes status = 'pending', as
-- enqueue_many does (a status column without a default got NULL).
CREATE OR REPLACE FUNCTION sharding.enqueue(queue regclass, key text, payload jsonb DEFAULT NULL) RETURNS bigint
    LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
    SET search_path = pg_catalog, pg_temp
    AS $$
DECLARE
    new_id bigint;
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must not be null' USING ERRCODE = '22023';
    END IF;
    -- status always written, as enqueue_many does: a hand-made queue whose
    -- status column has no default still gets a claimable job.
    EXECUTE format('INSERT INTO %s (key, payload, status) VALUES ($1, $2, ''pending'') RETURNING id', queue)
        INTO new_id USING key, payload;
    RETURN new_id;
END
$$;
