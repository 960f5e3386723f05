// Wake-ups of the jobs launcher for the layers below jobs/: see launcher.hpp.
#include "pg/launcher.hpp"

namespace sharding {
namespace {
LauncherCalls installed;
}  // namespace

void set_launcher_calls(const LauncherCalls &calls) noexcept { installed = calls; }

void jobs_recheck(Oid db) noexcept { jobs_recheck(db, false); }

void jobs_recheck(Oid db, bool soon) noexcept {
    if (installed.recheck != nullptr) installed.recheck(db, soon);
}

void jobs_poke_launcher() noexcept {
    if (installed.poke != nullptr) installed.poke();
}

bool jobs_clean_up(Oid db) noexcept { return installed.clean_up != nullptr && installed.clean_up(db); }

}  // namespace sharding
