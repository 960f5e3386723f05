// DDL on every node (docs/ddl.md, CONTRACT 15.4): the coordinator's
// two-phase transactions on its nodes (two_phase.cpp), their recovery
// (recover.cpp) and propagated DDL (propagate.cpp).
#pragma once

#include "pg/boundary.hpp"

#include <string>
#include <vector>

namespace sharding {

// The attached data nodes of this coordinator: nodes with a DSN that follow
// it (their configuration slot exists in this database), by name.
std::vector<std::string> ddl_attached_nodes();

// Runs sql on each node inside this transaction's two-phase transaction
// there (opened on first use: connected, max_prepared_transactions
// checked, role and search_path set, BEGIN), on all of them at once (sent
// to all, then collected). Returns the command tag of each one's last
// result, in order. Errors carry the node's SQLSTATE and message, naming
// the node; the first failure in node order is thrown.
std::vector<std::string> ddl_run_on_all(const std::vector<std::string> &nodes, const std::string &sql);
// Which of nodes lack the table (to_regclass(qualified) IS NULL there),
// each asked outside any transaction block.
std::vector<std::string> ddl_nodes_lacking(const std::vector<std::string> &nodes, const std::string &qualified);
// Opens node's participant without running anything (the checks first, on
// every node, before a command runs anywhere).
void ddl_open(const std::string &node);
// Runs sql on node in a session of its own, outside any transaction block
// (CREATE INDEX CONCURRENTLY and the like), after setup: not atomic.
std::string ddl_run_alone(const std::string &node, const std::string &setup, const std::string &sql);

// The background worker's recovery (jobs.cpp scanner, inside its own
// transaction, as the extension's owner): *left whether something is left
// in doubt (to be retried soon). Never throws: a failure is an ERROR
// (raised with no C++ frame alive), *left then true.
void ddl_recover_in_worker(bool *left);

// "SET LOCAL search_path = <this session's schemas, quoted>": names in a
// statement run on the nodes resolve there as they do here.
std::string ddl_search_path_setting();

// Glue: the session becomes the owner of table rel (a restricted operation,
// as a SECURITY DEFINER function runs); the caller restores *save_user and
// *save_sec with SetUserIdAndSecContext. May ereport.
void become_table_owner(Oid rel, Oid *save_user, int *save_sec);

// Test-only fault point (sharding.ddl_fault): holds the commit phase.
extern char *ddl_fault;
extern bool ddl_propagate;
extern bool ddl_hook_installed;

}  // namespace sharding
