// Shared memory of the topics, only when the library is preloaded (shared
// memory can be had only then): each topic adds its part from _PG_init;
// one pair of hooks (shmem_request_hook, shmem_startup_hook) requests every
// part's space and LWLock tranche and attaches every part, under
// AddinShmemInitLock, in the order they were added.
#pragma once

#include "pg/pg.hpp"

namespace sharding::shmem {

struct Part {
    const char *name;     // ShmemInitStruct's
    Size size;            // the struct's, as ShmemInitStruct has it
    Size (*request)();    // the bytes to request (nullptr: MAXALIGN(size))
    const char *tranche;  // a named LWLock tranche of one lock to request (nullptr: none)
    // Under AddinShmemInitLock, in every process that attaches: mem is the
    // part, found whether another process has initialised it already. It
    // keeps the pointer, and initialises the part unless found.
    void (*attach)(void *mem, bool found);
};

// While preloading (process_shared_preload_libraries_in_progress); does
// nothing otherwise.
void add(const Part &part);

}  // namespace sharding::shmem
