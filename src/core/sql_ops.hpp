// Shorthands for the qualified operators and functions of the SQL text the
// queue engine generates (core/claim_sql.cpp, queue/queue.cpp): a statement
// that runs under the caller's search_path spells OPERATOR(pg_catalog.=) so
// that the caller's schemas cannot hijack it. Include only in .cpp files.
#pragma once

#define EQ " OPERATOR(pg_catalog.=) "
#define LT " OPERATOR(pg_catalog.<) "
#define LE " OPERATOR(pg_catalog.<=) "
#define GT " OPERATOR(pg_catalog.>) "
#define GE " OPERATOR(pg_catalog.>=) "
#define PLUS " OPERATOR(pg_catalog.+) "
#define NOW "pg_catalog.now()"
