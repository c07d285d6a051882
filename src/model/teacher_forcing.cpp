#include "model/teacher_forcing.h"

#include <limits>

#include "core/error.h"

namespace dsa {

TeacherForcedResult run_teacher_forced(const Model& m, const std::vector<int32_t>& ids, int prompt_len, CacheType cache,
                                       bool mtp, bool internals) {
  const ModelConfig& c = m.config;
  const int T = int(ids.size()), N = prompt_len, V = c.vocab_size, H = c.hidden_size;
  if (N < 1 || N > T) throw Error("prompt length " + std::to_string(N) + " outside 1.." + std::to_string(T));
  if (mtp && !m.weights.mtp) throw Error("the model has no MTP layer loaded (num_nextn_predict_layers = 0)");

  StateOptions so;
  so.max_ctx = T;
  so.max_tokens = N;
  so.max_logit_rows = N;
  so.cache = cache;
  so.mtp = mtp;
  State st(c, so);

  std::map<std::string, std::map<int, std::vector<float>>> frows;
  std::map<std::string, std::map<int, std::vector<int32_t>>> irows;
  Tap tap;
  tap.floats = [&](const std::string& n, int pos, const float* v, int k) { frows[n][pos].assign(v, v + k); };
  tap.ints = [&](const std::string& n, int pos, const int32_t* v, int k) { irows[n][pos].assign(v, v + k); };
  ForwardOptions fo;
  fo.all_logits = true;
  fo.tap = internals ? &tap : nullptr;

  TeacherForcedResult r;
  r.T = T;
  r.vocab = V;
  r.logits.resize(size_t(T) * size_t(V));
  if (mtp) r.mtp_logits.resize(size_t(T - 1) * size_t(V));
  std::vector<float> h_last(static_cast<size_t>(H));
  auto run_mtp = [&](const float* h, const int32_t* next, int n, int row0) {
    if (!mtp || n <= 0) return;
    const float* ml = forward_mtp(m, st, h, next, n, fo);
    std::copy_n(ml, size_t(n) * size_t(V), &r.mtp_logits[size_t(row0) * size_t(V)]);
  };

  const float* l = forward(m, st, ids.data(), N, fo);
  std::copy_n(l, size_t(N) * size_t(V), r.logits.data());
  std::copy_n(&st.h_final[size_t(N - 1) * size_t(H)], H, h_last.data());
  // MTP row i predicts token i+2 from the final-normed h[i] and ids[i+1]: rows 0..N-2
  // come with the prefill (h_final is not touched by the MTP pass before it reads it).
  if (N > 1 && N - 1 <= T - 1) run_mtp(st.h_final.data(), &ids[1], N - 1, 0);
  for (int t = N; t < T; ++t) {
    l = forward(m, st, &ids[size_t(t)], 1, fo);
    std::copy_n(l, size_t(V), &r.logits[size_t(t) * size_t(V)]);
    // MTP position t-1 needs h[t-1] (kept from the previous step) and ids[t].
    std::vector<float> h_now(st.h_final.begin(), st.h_final.begin() + H);
    run_mtp(h_last.data(), &ids[size_t(t)], 1, t - 1);
    h_last = std::move(h_now);
  }

  for (auto& [name, rows] : frows) {
    const int64_t nrows = int64_t(rows.size());
    size_t width = 0;
    for (auto& [p, row] : rows) width = std::max(width, row.size());
    // Score rows cover keys 0..pos; the rest of a causal row is -inf, as in the goldens.
    if (name.rfind("indexer.scores.", 0) == 0) width = size_t(nrows);
    auto& f = r.floats[name];
    f.shape = {nrows, int64_t(width)};
    f.v.assign(size_t(nrows) * width, -std::numeric_limits<float>::infinity());
    for (auto& [p, row] : rows) std::copy(row.begin(), row.end(), &f.v[size_t(p) * width]);
  }
  for (auto& [name, rows] : irows) {
    const size_t width = rows.begin()->second.size();
    auto& iv = r.ints[name];
    iv.shape = {int64_t(rows.size()), int64_t(width)};
    iv.v.assign(rows.size() * width, -1);
    for (auto& [p, row] : rows) std::copy(row.begin(), row.end(), &iv.v[size_t(p) * width]);
  }
  return r;
}

}  // namespace dsa
