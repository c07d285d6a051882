#include "core/numa.h"

#include <numa.h>
#include <numaif.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace dsa {

NumaMode parse_numa_mode(const std::string& s) {
  if (s == "auto") return NumaMode::Auto;
  if (s == "off") return NumaMode::Off;
  if (s == "interleave" || s == "distribute") return NumaMode::Interleave;
  throw Error("--numa: unknown mode '" + s + "' (expected auto, off or interleave)");
}

int numa_nodes() {
  if (numa_available() < 0) return 1;
  // Nodes with memory that this process may allocate on (its cpuset's mems).
  struct bitmask* mems = numa_get_mems_allowed();
  const int n = int(numa_bitmask_weight(mems));
  numa_bitmask_free(mems);
  return n > 0 ? n : 1;
}

namespace {
NumaStatus g_status{0, false};  // nodes == 0: numa_setup not called yet
}  // namespace

NumaStatus numa_status() {
  if (g_status.nodes == 0) return {numa_nodes(), false};
  return g_status;
}

NumaStatus numa_setup(NumaMode mode) {
  NumaStatus st;
  st.nodes = numa_nodes();
  if (numa_available() < 0) {
    if (mode == NumaMode::Interleave) throw Error("--numa interleave: this kernel has no NUMA support");
    g_status = st;
    return st;
  }
  if (mode == NumaMode::Auto) {
    // A policy set from outside (numactl --membind, --interleave, ...) is the user's choice.
    int current = MPOL_DEFAULT;
    if (get_mempolicy(&current, nullptr, 0, nullptr, 0) == 0 && current != MPOL_DEFAULT) {
      st.interleaved = current == MPOL_INTERLEAVE;
      g_status = st;
      return st;
    }
  }
  const bool interleave = mode == NumaMode::Interleave || (mode == NumaMode::Auto && st.nodes > 1);
  if (interleave) {
    struct bitmask* mems = numa_get_mems_allowed();
    // set_mempolicy directly: libnuma's numa_set_interleave_mask reports no error. The
    // node count passed is the mask's bits plus one, as the kernel's interface expects.
    const long rc = set_mempolicy(MPOL_INTERLEAVE, mems->maskp, mems->size + 1);
    const int err = errno;
    numa_bitmask_free(mems);
    if (rc != 0) throw Error(std::string("--numa interleave: set_mempolicy failed: ") + std::strerror(err));
    st.interleaved = true;
  } else if (mode == NumaMode::Off) {
    if (set_mempolicy(MPOL_DEFAULT, nullptr, 0) != 0)
      throw Error(std::string("--numa off: set_mempolicy failed: ") + std::strerror(errno));
  }
  g_status = st;
  return st;
}

}  // namespace dsa
