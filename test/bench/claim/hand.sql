-- The hand-written SKIP LOCKED claim, then the same fenced batch complete.
WITH claimed AS (
    UPDATE hand
       SET owner = 'w' || :client_id, claim_expires = now() + interval '5 minutes',
           status = 'processing', attempts = attempts + 1
     WHERE id IN (
           SELECT id FROM hand
            WHERE status = 'pending' OR (status = 'processing' AND claim_expires < now())
            ORDER BY created
            LIMIT :batch
              FOR UPDATE SKIP LOCKED)
    RETURNING *)
SELECT coalesce(array_agg(id), '{}') AS ids FROM claimed \gset
UPDATE hand SET status = 'done' WHERE id = ANY (:ids::bigint[]) AND status = 'processing' AND owner = 'w' || :client_id;
