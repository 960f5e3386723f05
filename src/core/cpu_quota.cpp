// The CPUs a cgroup's CPU quota allows (cpu_quota.hpp).
#include "core/cpu_quota.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace sharding {

namespace {

// A whole decimal number, no sign unless `negative_ok`; nothing else.
std::optional<int64_t> number(const std::string &s, bool negative_ok = false) {
    size_t a = s.find_first_not_of(" \t\n"), b = s.find_last_not_of(" \t\n");
    if (a == std::string::npos) return std::nullopt;
    const std::string t = s.substr(a, b - a + 1);
    size_t i = (negative_ok && t[0] == '-') ? 1 : 0;
    if (i == t.size() || t.size() > 19) return std::nullopt;
    for (size_t j = i; j < t.size(); j++)
        if (t[j] < '0' || t[j] > '9') return std::nullopt;
    errno = 0;
    long long v = std::strtoll(t.c_str(), nullptr, 10);
    if (errno != 0) return std::nullopt;
    return static_cast<int64_t>(v);
}

int cpus_of(int64_t quota, int64_t period) {
    if (quota <= 0 || period <= 0) return 0;
    const int64_t cpus = quota / period + (quota % period != 0);
    return cpus > 1 << 20 ? 0 : static_cast<int>(cpus);
}

// "/a/b" -> {"/a/b", "/a", ""}: the cgroup and its ancestors, as suffixes
// of a hierarchy's mount point ("" is its root).
std::vector<std::string> up_from(std::string path) {
    std::vector<std::string> out;
    while (!path.empty() && path.back() == '/') path.pop_back();
    for (;;) {
        out.push_back(path);
        if (path.empty()) break;
        size_t slash = path.rfind('/');
        path = slash == std::string::npos ? std::string() : path.substr(0, slash);
    }
    return out;
}

// The tightest of `limit` and `cpus` (0: no limit).
void tighten(int &limit, int cpus) {
    if (cpus > 0 && (limit == 0 || cpus < limit)) limit = cpus;
}

}  // namespace

int cpus_of_cpu_max(const std::string &cpu_max) {
    std::istringstream in(cpu_max);
    std::string quota, period, extra;
    if (!(in >> quota >> period) || (in >> extra)) return 0;
    if (quota == "max") return 0;
    std::optional<int64_t> q = number(quota), p = number(period);
    return q && p ? cpus_of(*q, *p) : 0;
}

int cpus_of_cfs(const std::string &quota_us, const std::string &period_us) {
    std::optional<int64_t> q = number(quota_us, true), p = number(period_us);
    return q && p ? cpus_of(*q, *p) : 0;
}

int cgroup_cpu_limit(const ReadFile &read) {
    std::optional<std::string> self = read("/proc/self/cgroup");
    if (!self) return 0;
    int limit = 0;
    std::istringstream lines(*self);
    std::string line;
    while (std::getline(lines, line)) {
        // N:CONTROLLERS:PATH (the path may hold ':').
        size_t c1 = line.find(':');
        if (c1 == std::string::npos) continue;
        size_t c2 = line.find(':', c1 + 1);
        if (c2 == std::string::npos) continue;
        const std::string id = line.substr(0, c1), controllers = line.substr(c1 + 1, c2 - c1 - 1),
                          path = line.substr(c2 + 1);
        if (path.empty() || path[0] != '/') continue;
        if (id == "0" && controllers.empty()) {
            for (const std::string &at : up_from(path))
                if (std::optional<std::string> max = read("/sys/fs/cgroup" + at + "/cpu.max"))
                    tighten(limit, cpus_of_cpu_max(*max));
            continue;
        }
        bool cpu = false;
        std::istringstream names(controllers);
        std::string name;
        while (std::getline(names, name, ','))
            if (name == "cpu") cpu = true;
        if (!cpu) continue;
        for (const char *mount : {"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"})
            for (const std::string &at : up_from(path)) {
                std::optional<std::string> quota = read(mount + at + "/cpu.cfs_quota_us");
                std::optional<std::string> period = read(mount + at + "/cpu.cfs_period_us");
                if (quota && period) tighten(limit, cpus_of_cfs(*quota, *period));
            }
    }
    return limit;
}

int cgroup_cpu_limit() {
    return cgroup_cpu_limit([](const std::string &path) -> std::optional<std::string> {
        std::ifstream in(path);
        if (!in) return std::nullopt;
        std::stringstream s;
        s << in.rdbuf();
        return s.str();
    });
}

}  // namespace sharding
