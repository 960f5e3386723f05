// The CPUs a cgroup's CPU quota allows (src/core/cpu_quota.hpp), against
// the kernel's documented formats (Documentation/admin-guide/cgroup-v2.rst,
// "cpu.max": "$MAX $PERIOD", "max" for no limit; cgroup-v1/cfs-bandwidth:
// cpu.cfs_quota_us -1 for none) over a fake file tree: what a container
// limited with docker --cpus or a Kubernetes CPU limit sees. Run from the
// repository's root (test/harness/unit.sh).
#include "core/cpu_quota.hpp"
#include "tap.hpp"

#include <cstdio>
#include <map>
#include <optional>
#include <string>

using sharding::cgroup_cpu_limit;
using sharding::cpus_of_cfs;
using sharding::cpus_of_cpu_max;

namespace {

// A fake file tree: path -> contents.
int limit_of(const std::map<std::string, std::string> &files) {
    return cgroup_cpu_limit([&](const std::string &path) -> std::optional<std::string> {
        auto it = files.find(path);
        if (it == files.end()) return std::nullopt;
        return it->second;
    });
}

}  // namespace

int main() {
    std::printf("1..21\n");
    // cgroup v2's cpu.max.
    tap::check(cpus_of_cpu_max("max 100000\n") == 0, "cpu.max 'max 100000': no limit (0)");
    tap::check(cpus_of_cpu_max("200000 100000\n") == 2, "cpu.max '200000 100000': 2 CPUs");
    tap::check(cpus_of_cpu_max("150000 100000") == 2, "cpu.max '150000 100000' (1.5 CPUs): rounded up to 2");
    tap::check(cpus_of_cpu_max("50000 100000") == 1, "cpu.max '50000 100000' (half a CPU): 1");
    tap::check(cpus_of_cpu_max("400000 50000") == 8, "cpu.max '400000 50000' (another period): 8");
    tap::check(cpus_of_cpu_max("") == 0 && cpus_of_cpu_max("200000") == 0 &&
                   cpus_of_cpu_max("2e5 100000") == 0 && cpus_of_cpu_max("200000 100000 1") == 0 &&
                   cpus_of_cpu_max("-200000 100000") == 0 && cpus_of_cpu_max("200000 0") == 0,
               "cpu.max: a text that is not '$MAX $PERIOD' limits nothing");
    tap::check(cpus_of_cpu_max("9223372036854775807 100000") == 0 && cpus_of_cpu_max("9223372036854775807 1") == 0,
               "cpu.max: a quota of more than a million CPUs (the largest int64) is no limit, without overflow");
    // cgroup v1's cfs quota.
    tap::check(cpus_of_cfs("-1\n", "100000\n") == 0, "cfs quota -1: no limit");
    tap::check(cpus_of_cfs("300000\n", "100000\n") == 3, "cfs quota 300000 per 100000: 3 CPUs");
    tap::check(cpus_of_cfs("250000", "100000") == 3, "cfs quota 250000 per 100000 (2.5 CPUs): 3");
    tap::check(cpus_of_cfs("abc", "100000") == 0 && cpus_of_cfs("100000", "") == 0,
               "cfs: a text that is not a number limits nothing");

    // Whole trees.
    tap::check(limit_of({}) == 0, "no /proc/self/cgroup: no limit");
    tap::check(limit_of({{"/proc/self/cgroup", "0::/\n"}, {"/sys/fs/cgroup/cpu.max", "max 100000\n"}}) == 0,
               "v2, no quota at the root: no limit");
    tap::check(limit_of({{"/proc/self/cgroup", "0::/\n"}, {"/sys/fs/cgroup/cpu.max", "200000 100000\n"}}) == 2,
               "v2 in a cgroup namespace (path /): the quota of the container's root, 2");
    tap::check(limit_of({{"/proc/self/cgroup", "0::/kubepods/pod1/c1\n"},
                         {"/sys/fs/cgroup/kubepods/pod1/c1/cpu.max", "max 100000\n"},
                         {"/sys/fs/cgroup/kubepods/pod1/cpu.max", "100000 100000\n"},
                         {"/sys/fs/cgroup/kubepods/cpu.max", "800000 100000\n"}}) == 1,
               "v2: the tightest quota on the way to the root counts (the pod's 1, not the node's 8)");
    tap::check(limit_of({{"/proc/self/cgroup", "0::/a/b\n"}, {"/sys/fs/cgroup/cpu.max", "300000 100000\n"}}) == 3,
               "v2: a path not mounted as such (the host's path) falls back on the mount's root");
    tap::check(limit_of({{"/proc/self/cgroup", "4:cpu,cpuacct:/docker/abc\n0::/\n"},
                         {"/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "150000\n"},
                         {"/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n"}}) == 2,
               "v1 (hybrid, cpu,cpuacct mounted together): 150000 per 100000 gives 2");
    tap::check(limit_of({{"/proc/self/cgroup", "3:cpu:/\n1:memory:/x\n0::/\n"},
                         {"/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n"},
                         {"/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"},
                         {"/sys/fs/cgroup/memory/x/cpu.cfs_quota_us", "100000\n"},
                         {"/sys/fs/cgroup/memory/x/cpu.cfs_period_us", "100000\n"}}) == 0,
               "v1 with quota -1 (this machine's layout): no limit; another controller's files are not read");
    tap::check(limit_of({{"/proc/self/cgroup", "3:cpu:/g\n"},
                         {"/sys/fs/cgroup/cpu/g/cpu.cfs_quota_us", "400000\n"},
                         {"/sys/fs/cgroup/cpu/g/cpu.cfs_period_us", "100000\n"},
                         {"/sys/fs/cgroup/cpu.max", "100000 100000\n"}}) == 4,
               "v1 only: v2's cpu.max is not read for a process with no v2 line");
    tap::check(limit_of({{"/proc/self/cgroup", "3:cpu:/g\n0::/h\n"},
                         {"/sys/fs/cgroup/cpu/g/cpu.cfs_quota_us", "400000\n"},
                         {"/sys/fs/cgroup/cpu/g/cpu.cfs_period_us", "100000\n"},
                         {"/sys/fs/cgroup/h/cpu.max", "200000 100000\n"}}) == 2,
               "both hierarchies limiting: the smaller, 2");
    tap::check(limit_of({{"/proc/self/cgroup", "garbage\n5:cpu:relative\n"}}) == 0,
               "lines that are not a cgroup's: no limit");
    return tap::status();
}
