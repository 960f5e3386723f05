// PostgreSQL's headers, seen from C++.
//
// Every translation unit that talks to PostgreSQL includes this file and no
// PostgreSQL header directly: postgres.h first, all of it with C linkage.
#pragma once

extern "C" {
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
}

// Version differences (15, 17, 18) behind one header.
#include "pg/compat.hpp"
