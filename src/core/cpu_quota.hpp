// The CPUs a cgroup's CPU quota allows this process: pure C++, no
// PostgreSQL header (test/unit/cpu_quota_test.cpp). A container limited to
// two CPUs' worth of time (docker --cpus=2, a Kubernetes CPU limit) still
// sees every CPU of its host in its affinity mask; _move_host
// (src/datanode/move_copy.cpp) takes the smaller of the two, so that moves
// in flight on one host share what they may actually use (move_share).
//
// The kernel's files (Documentation/admin-guide/cgroup-v2.rst and
// cgroup-v1/cfs-bandwidth): cgroup v2's cpu.max holds "$MAX $PERIOD", $MAX
// "max" for no limit; cgroup v1's cpu.cfs_quota_us holds the quota in µs
// (-1 for none) and cpu.cfs_period_us the period. A limit of a cgroup
// applies to every cgroup below it: the tightest one on the way to the
// root counts. /proc/self/cgroup names the process's cgroup in each
// hierarchy: "0::PATH" for v2, "N:CONTROLLERS:PATH" for v1.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace sharding {

// CPUs a quota of `quota` µs per `period` µs allows (rounded up, at least
// 1); 0 for no limit or a text that is not a quota.
int cpus_of_cpu_max(const std::string &cpu_max);
int cpus_of_cfs(const std::string &quota_us, const std::string &period_us);

// A file's contents, or nothing where it cannot be read.
using ReadFile = std::function<std::optional<std::string>(const std::string &path)>;

// The CPUs the quotas of this process's cgroups allow, read through `read`
// (/proc/self/cgroup, then cpu.max under /sys/fs/cgroup for v2, and
// cpu.cfs_quota_us and cpu.cfs_period_us under /sys/fs/cgroup/cpu and
// /sys/fs/cgroup/cpu,cpuacct for v1, in the process's cgroup and each of
// its ancestors): the smallest, or 0 where none limits it.
int cgroup_cpu_limit(const ReadFile &read);

// The same over the real files.
int cgroup_cpu_limit();

}  // namespace sharding
