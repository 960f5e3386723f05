// The coordinator's checks of a map and its owner switch (owner_switch.cpp,
// docs/moves.md), and the logical shard of a key given as text: what the
// move engine, the node steps and rebalance jobs ask of the routing
// configuration.
#pragma once

#include "pg/keys.hpp"
#include "pg/spi.hpp"

#include <optional>
#include <string>

namespace sharding::move {

// _require_map: the map's logical shard count (22023 for NULL, 42704 for
// a map that does not exist); for_update locks its row.
Text require_map(const Text &map, bool for_update);
// _check_logical: 22023 unless 0 <= logical < shards.
void check_logical(const Text &map, const Text &logical, const Text &shards);
// _check_database_nodes: nodes is a text[]'s text form.
void check_database_nodes(const Text &map, const Text &nodes);
// _lock_shard: waits for every writer fenced on the shard and for any
// rebalance of the map, and keeps new ones out until commit (22023 for a
// negative shard).
void lock_shard_exclusive(const Text &map, const Text &logical);
// _switch_owner: the shard's epoch afterwards.
Text switch_owner(const Text &map, const Text &logical, const Text &node);
// _coordinator_dsn.
std::string coordinator_dsn();
// _job_key_shard: the logical shard of a key given as text,
// hashed as the type of the map's key columns, as writers route it.
Text key_shard(const Text &map, const Text &key);
// The KeyType the map's keys are hashed as: that of the key column of its
// first distributed table (by schema and name); nullopt for a map without
// one, or a column of a type that is not a KeyType's.
std::optional<KeyType> map_key_type(const Text &map);

}  // namespace sharding::move
