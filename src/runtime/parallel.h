#pragma once
// Many prompts through one engine: all of them queued with a Scheduler (runtime/scheduler.h),
// which steps up to `parallel` of them together (continuous batching, chunked prefill,
// preemption when the pool runs short). Steps are batch-invariant and a prefix taken from
// the cache gives what computing it would, so each prompt's tokens are those it gets alone
// with the same sampling seed.
#include <cstddef>
#include <functional>
#include <vector>

#include "runtime/generator.h"

namespace dsa {

struct ParallelOptions {
  int parallel = 0;         // sequences stepping together; 0: all prompts (up to the engine's max_seqs)
  int prefill_chunk = 512;  // tokens per prefill chunk
};

// Results are handed to on_result in input order, each as soon as it and every earlier
// one are done.
void generate_parallel(Engine& e, const Tokenizer* tok, const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& g,
                       const ParallelOptions& o, const std::function<void(size_t, GenerateResult&)>& on_result);

}  // namespace dsa
