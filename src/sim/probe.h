#pragma once
// Measured peaks of this CPU, used by the `local` hardware profile and by `dsa bench` to
// express its own results as a fraction of what the machine can do.

namespace dsa::sim {

// Sustained streaming-read bandwidth in GB/s (1e9 bytes/s), best of several passes over a
// buffer much larger than the last-level cache. threads <= 0 means all OpenMP threads.
double measure_read_bandwidth_gbps(int threads = 0);

// Peak fp32 FMA throughput in GFLOP/s (an FMA counts as 2 FLOPs): independent accumulator
// chains with AVX2/FMA where the CPU has them, a scalar loop otherwise.
double measure_peak_gflops(int threads = 0);

// Total physical memory in bytes (0 if it cannot be read).
double physical_memory_bytes();

}  // namespace dsa::sim
