-- sharding.claim then the batch sharding.complete on table base (pgbench script).
SELECT coalesce(array_agg(id), '{}') AS ids FROM sharding.claim(NULL::base, 'w' || :client_id, :batch, '5 minutes') \gset
SELECT sharding.complete('base', :ids::bigint[], 'w' || :client_id);
