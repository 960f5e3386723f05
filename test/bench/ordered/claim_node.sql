-- sharding.claim_node for node n1, then complete (pgbench script).
SELECT coalesce(array_agg(id), '{}') AS ids
  FROM sharding.claim_node(NULL::ours, 'bm', 'n1', 'w' || :client_id, :batch, '5 minutes') \gset
SELECT sharding.complete('ours', :ids::bigint[], 'w' || :client_id);
