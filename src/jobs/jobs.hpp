// The background workers of rebalance jobs (jobs.cpp) as what jobs_run.cpp
// asks of them; the launcher's wake-ups, which the layers below call too,
// are in src/pg/launcher.hpp.
#pragma once

#include "pg/launcher.hpp"

namespace sharding {
// How many move workers of job (in this database) failed to start in a row
// (ended before running anything: a FATAL at connect); the launcher's scan
// fails a job past jobs_max_failed_starts instead of starting workers for
// it for ever.
int jobs_failed_starts(int64 job) noexcept;
constexpr int jobs_max_failed_starts = 5;
// _job_launch: asks for `runners` background runners of job, started when
// this transaction commits, running as runas (42501 unless the caller, a
// superuser or the extension's owner); false when the library is not
// preloaded.
bool jobs_launch(int64 job, int32 runners, Oid runas);
// _job_runners: runners of job in this database now.
int jobs_runners(int64 job);
}  // namespace sharding
