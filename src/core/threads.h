#pragma once
// How many threads the engine runs by default, and how much memory the machine has.

namespace dsa {

// Physical cores among the CPUs this process may run on (its affinity mask), counting SMT
// siblings once: decode streams weights from memory and prefill saturates the FMA units,
// and a second hardware thread on the same core helps neither. Falls back to the number
// of allowed CPUs where the topology is not readable (non-Linux, restricted /sys).
int physical_cores();

// Total physical memory in bytes (0 if it cannot be read).
double physical_memory_bytes();

}  // namespace dsa
