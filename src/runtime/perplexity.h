#pragma once
// Perplexity over a token sequence, llama.cpp style: the ids are cut into consecutive
// non-overlapping windows of ctx tokens (a trailing partial window is dropped), each
// window is evaluated from an empty cache with every row of logits, and token j+1 is
// scored with -log p(ids[j+1] | ids[..j]) for j from `first` to ctx-2.
//
// By default first = ctx/2: only the second half of each window is scored, so every
// scored token sees at least ctx/2 tokens of context and the number is comparable with
// llama.cpp's. score_all = true scores every position (first = 0), which includes
// tokens predicted from almost no context and so reads higher.
//
// PPL = exp(mean NLL); its standard error by the delta method is
// PPL * sd(NLL) / sqrt(n), with sd the sample standard deviation of the per-token NLL.
#include <cstdint>
#include <functional>
#include <span>

#include "model/forward.h"

namespace dsa {

struct PerplexityOptions {
  int ctx = 512;
  bool score_all = false;
  int32_t bos_id = -1;    // >= 0: the first token of every window is replaced by BOS (llama.cpp)
  int max_tokens = 512;   // tokens per forward call: a window longer than this runs in chunks
  CacheType cache = CacheType::FP8;
};

struct PerplexityResult {
  double ppl = 0, ppl_stderr = 0;
  double mean_nll = 0;
  int64_t n_scored = 0;
  int n_windows = 0;
};

// progress(window_done, n_windows, running ppl).
PerplexityResult perplexity(const Model& m, std::span<const int32_t> ids, const PerplexityOptions& opt,
                            const std::function<void(int, int, double)>& progress = {});

}  // namespace dsa
