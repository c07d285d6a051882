#pragma once
// Latency and bandwidth of the collectives the parallel layouts run, at the sizes a step uses
// (tokens x hidden floats): the all-reduce of an expert-parallel MoE layer's output, the
// all-gathers of tensor-parallel attention, the send between pipeline stages, the broadcast
// of the last stage's logits.
#include <cstddef>
#include <string>
#include <vector>

namespace dsa {

enum class Collective { AllReduce, AllGather, Send, Broadcast, AllToAll };
// "allreduce", "allgather", "send", "broadcast", "alltoall"; parse throws dsa::Error naming the choices.
const char* collective_name(Collective c);
Collective parse_collective(const std::string& s);

struct CommPoint {
  int tokens = 0;
  size_t bytes = 0;  // of the whole tokens x hidden result (what each rank ends with)
  double median_us = 0, p90_us = 0;
  // algbw: bytes / time; busbw: what each link carries, comparable across job sizes (the
  // figure nccl-tests report): algbw x 2 (n - 1) / n for the all-reduce, x (n - 1) / n for the
  // all-gather, x 1 for a send or a broadcast.
  double algbw_gbps = 0, busbw_gbps = 0;
};

// Every rank must call it with the same arguments; times are the slowest rank's. A send
// goes from each even rank to the next (the pipeline's stage-to-stage transfer); an
// all-gather needs hidden to be a multiple of the ranks.
std::vector<CommPoint> measure_collective(Collective c, int hidden, const std::vector<int>& tokens, int repeat);

}  // namespace dsa
