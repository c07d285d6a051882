#include "core/threads.h"

#include <sched.h>
#include <unistd.h>

#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <utility>

namespace dsa {

namespace {
int read_int(const std::string& path) {
  std::ifstream in(path);
  int v = -1;
  if (!(in >> v)) return -1;
  return v;
}
}  // namespace

int physical_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    const unsigned n = std::thread::hardware_concurrency();
    return n > 0 ? int(n) : 1;
  }
  std::set<std::pair<int, int>> cores;  // (package, core)
  int allowed = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    ++allowed;
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    const int pkg = read_int(base + "physical_package_id"), core = read_int(base + "core_id");
    if (pkg < 0 || core < 0) return allowed > 0 ? CPU_COUNT(&set) : 1;  // topology unknown: one per CPU
    cores.insert({pkg, core});
  }
  return cores.empty() ? 1 : int(cores.size());
}

double physical_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? double(pages) * double(page) : 0.0;
}

}  // namespace dsa
