#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"

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

  StateOptions so;
  so.max_ctx = N;
  so.max_tokens = std::clamp(opt.max_tokens, 1, N);
  so.max_logit_rows = so.max_tokens;
  so.cache = opt.cache;
  State st(m.config, so);
  ForwardOptions fo;
  fo.all_logits = true;

  std::vector<int32_t> win(static_cast<size_t>(N));
  double sum = 0, sum2 = 0;
  int64_t count = 0;
  PerplexityResult r;
  for (int w = 0; w < windows; ++w) {
    std::copy_n(&ids[size_t(w) * size_t(N)], N, win.begin());
    if (opt.bos_id >= 0) win[0] = opt.bos_id;
    st.n_past = 0;
    for (int c0 = 0; c0 < N; c0 += so.max_tokens) {
      const int n = std::min(so.max_tokens, N - c0);
      const float* logits = forward(m, st, &win[size_t(c0)], n, fo);
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
