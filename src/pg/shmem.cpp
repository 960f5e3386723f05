// Shared memory of the topics: see shmem.hpp.
#include "pg/shmem.hpp"

extern "C" {
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
}

namespace sharding::shmem {
namespace {

constexpr int kMaxParts = 8;
Part parts[kMaxParts];
int nparts = 0;
shmem_request_hook_type prev_shmem_request = nullptr;
shmem_startup_hook_type prev_shmem_startup = nullptr;

void request() {
    if (prev_shmem_request) prev_shmem_request();
    for (int i = 0; i < nparts; i++) {
        RequestAddinShmemSpace(parts[i].request != nullptr ? parts[i].request() : MAXALIGN(parts[i].size));
        if (parts[i].tranche != nullptr) RequestNamedLWLockTranche(parts[i].tranche, 1);
    }
}

void startup() {
    if (prev_shmem_startup) prev_shmem_startup();
    LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
    for (int i = 0; i < nparts; i++) {
        bool found = false;
        void *mem = ShmemInitStruct(parts[i].name, parts[i].size, &found);
        parts[i].attach(mem, found);
    }
    LWLockRelease(AddinShmemInitLock);
}

}  // namespace

void add(const Part &part) {
    if (!process_shared_preload_libraries_in_progress) return;
    if (nparts == kMaxParts) elog(ERROR, "too many shared memory parts");
    if (nparts == 0) {
        prev_shmem_request = shmem_request_hook;
        shmem_request_hook = request;
        prev_shmem_startup = shmem_startup_hook;
        shmem_startup_hook = startup;
    }
    parts[nparts++] = part;
}

}  // namespace sharding::shmem
