-- sharding.claim_ordered then the batch sharding.complete (pgbench script).
SELECT coalesce(array_agg(id), '{}') AS ids FROM sharding.claim_ordered(NULL::ours, 'w' || :client_id, :batch, '5 minutes') \gset
SELECT sharding.complete('ours', :ids::bigint[], 'w' || :client_id);
