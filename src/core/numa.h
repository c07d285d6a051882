#pragma once
// Memory placement on machines with several NUMA nodes (multi-socket servers).
//
// Decode streams every active weight once per token, so what bounds it is the memory
// bandwidth the threads see. On a multi-node machine, pages land on the node of the thread
// that first touches them: the mmapped checkpoint fills the page cache of whichever node
// read it first, and all threads then pull from that one node's memory controllers.
// Interleaving the pages over all nodes (MPOL_INTERLEAVE) spreads the weights, the caches
// and the activations evenly, so every node's bandwidth serves the GEMVs, whose rows are
// split dynamically across all threads (no thread owns a fixed slice that first-touch
// placement could keep local).
#include <string>

namespace dsa {

enum class NumaMode {
  Auto,        // interleave where the machine has more than one node, else leave placement alone;
               // a policy already set from outside (numactl) is kept
  Off,         // the kernel's default policy (first touch)
  Interleave,  // interleave over every node this process may use
};

// "auto", "off" or "interleave" ("distribute" is accepted for interleave); anything else
// throws an Error that names the accepted values.
NumaMode parse_numa_mode(const std::string& s);

struct NumaStatus {
  int nodes = 1;             // memory nodes this process may allocate from (1 without NUMA support)
  bool interleaved = false;  // the process's memory policy is now MPOL_INTERLEAVE
};

// Sets this thread's memory policy for `mode`. Call it before the first OpenMP region:
// a thread takes its policy from the thread that creates it, so the workers created
// afterwards interleave too. Pages already in the page cache (a checkpoint read before, by
// any process) keep their node; drop the page cache first for an even spread of the weights.
NumaStatus numa_setup(NumaMode mode);

// What the last numa_setup did (nodes counted, not interleaved, before any call).
NumaStatus numa_status();

// Memory nodes this process may allocate from (1 where the kernel has no NUMA support).
int numa_nodes();

}  // namespace dsa
