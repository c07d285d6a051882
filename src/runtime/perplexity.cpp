#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "runtime/engine.h"

namespace dsa {

PerplexityResult perplexity(const Model& m, std::span<const int32_t> ids, const PerplexityOptions& opt,
                            const std::function<void(int, int, double)>& progress) {
  const int N = opt.ctx, V = m.config.vocab_size;
  if (N < 2) throw Error("perplexity: --ctx must be at least 2, got " + std::to_string(N));
  if (N > m.config.max_position_embeddings)
    throw Error("perplexity: --ctx " + std::to_string(N) + " exceeds the model's max_position_embeddings (" +
                std::to_string(m.config.max_position_embeddings) + ")");
  const int windows = int(ids.size() / size_t(N));
  if (windows == 0)
    throw Error("perplexity: " + std::to_string(ids.size()) + " tokens are fewer than one window of " + std::to_string(N));
  const int first = opt.score_all ? 0 : N / 2;

  EngineOptions eo;
  eo.cache = opt.cache;
  eo.max_ctx = N;
  eo.max_seqs = 1;
  eo.max_step_tokens = std::clamp(opt.max_tokens, 1, N);
  eo.max_logit_rows = eo.max_step_tokens;
  eo.cache_tokens = N;
  eo.prefix_cache = false;  // windows never share a prefix (the first token may be BOS)
  Engine e(m, eo);
  const int chunk = eo.max_step_tokens;

  std::vector<int32_t> win(static_cast<size_t>(N));
  double sum = 0, sum2 = 0;
  int64_t count = 0;
  PerplexityResult r;
  for (int w = 0; w < windows; ++w) {
    std::copy_n(&ids[size_t(w) * size_t(N)], N, win.begin());
    if (opt.bos_id >= 0) win[0] = opt.bos_id;
    const SeqId s = e.add();
    for (int c0 = 0; c0 < N; c0 += chunk) {
      const int n = std::min(chunk, N - c0);
      const StepItem it{s, &win[size_t(c0)], n, false, n, 0};
      e.step(std::span<const StepItem>(&it, 1));
      const float* logits = e.logits(0);
      // Row j (absolute position c0 + j) predicts win[c0 + j + 1].
      for (int j = 0; j < n; ++j) {
        const int pos = c0 + j;
        if (pos < first || pos + 1 >= N) continue;
        const float* row = logits + size_t(j) * size_t(V);
        const float mx = *std::max_element(row, row + V);
        double z = 0;
        for (int v = 0; v < V; ++v) z += std::exp(double(row[v]) - mx);
        const double nll = std::log(z) - (double(row[win[size_t(pos + 1)]]) - mx);
        sum += nll;
        sum2 += nll * nll;
        ++count;
      }
    }
    e.release(s);
    if (progress) progress(w + 1, windows, std::exp(sum / double(count)));
  }
  r.n_windows = windows;
  r.n_scored = count;
  r.mean_nll = sum / double(count);
  r.ppl = std::exp(r.mean_nll);
  if (count > 1) {
    const double var = std::max(0.0, (sum2 / double(count) - r.mean_nll * r.mean_nll) * double(count) / double(count - 1));
    r.ppl_stderr = r.ppl * std::sqrt(var / double(count));
  }
  return r;
}

}  // namespace dsa
