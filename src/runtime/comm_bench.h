#pragma once
// Latency and bandwidth of the collective an expert-parallel step runs (the all-reduce of
// each MoE layer's output, tokens x hidden floats), at the sizes a step uses.
#include <cstddef>
#include <vector>

namespace dsa {

struct CommPoint {
  int tokens = 0;
  size_t bytes = 0;
  double median_us = 0, p90_us = 0;
  // algbw: bytes / time; busbw: algbw x 2 (ranks - 1) / ranks, what each link carries in a
  // ring all-reduce (the figure nccl-tests report), comparable across job sizes.
  double algbw_gbps = 0, busbw_gbps = 0;
};

// Every rank must call it with the same arguments; times are the slowest rank's.
std::vector<CommPoint> measure_allreduce(int hidden, const std::vector<int>& tokens, int repeat);

}  // namespace dsa
