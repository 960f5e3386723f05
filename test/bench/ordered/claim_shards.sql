-- sharding.claim_shards on node n1's logical shards, then complete (pgbench script).
SELECT coalesce(array_agg(id), '{}') AS ids
  FROM sharding.claim_shards(NULL::base, 'w' || :client_id, sharding.shards_of('bm', 'n1'), 16, :batch, '5 minutes') \gset
SELECT sharding.complete('base', :ids::bigint[], 'w' || :client_id);
